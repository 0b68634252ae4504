// The leaderq dashboard: renders the panes from /ui/api/..., follows the live feed
// (server-sent events), and sends the actions as POSTs with the page's CSRF token.
// Every pane, filter and task has its address in the URL's hash (#/history?outcome=dead,
// #/task/<key>), so back and forward work, a reload lands on the same view and a link can
// be sent. No framework: every text from the server goes through textContent, never
// innerHTML; the chart is drawn here as SVG.
"use strict";

const csrf = document.querySelector('meta[name="csrf-token"]').content;
const $ = (id) => document.getElementById(id);
const SVG = "http://www.w3.org/2000/svg";
const PER_PAGE = 50;
// Panes by the first segment of the hash.
const PANES = { overview: "overview", queue: "queue", dead: "dead", schedules: "schedules", history: "history", leadership: "timeline", task: "task" };
let route = { pane: "overview", params: new URLSearchParams(), key: null };
let overview = null;
let feed = null;
let chartRead = 0;

// An element with attributes and children (strings become text nodes).
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (name === "class") node.className = value;
    else if (name.startsWith("data-")) node.setAttribute(name, value);
    else node[name] = value;
  }
  for (const child of children) {
    node.append(child instanceof Node ? child : document.createTextNode(child == null ? "" : String(child)));
  }
  return node;
}

function svg(tag, attrs, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attrs || {})) node.setAttribute(name, value);
  if (text != null) node.textContent = text;
  return node;
}

function show(text, info) {
  const box = $("message");
  box.textContent = text;
  box.className = info ? "message info" : "message";
  box.hidden = !text;
}

async function api(path) {
  const response = await fetch(path, { credentials: "same-origin", cache: "no-store" });
  if (response.status === 401) {
    $("login").hidden = false;
    throw new Error("the dashboard needs its token");
  }
  const body = await response.json();
  if (!response.ok) throw new Error(body.error || response.statusText);
  return body;
}

async function act(path, body) {
  const response = await fetch(path, {
    method: "POST",
    credentials: "same-origin",
    headers: { "Content-Type": "application/json", "X-CSRF-Token": csrf },
    body: JSON.stringify(body || {}),
  });
  const answer = await response.json().catch(() => ({}));
  if (response.status === 401) $("login").hidden = false;
  if (!response.ok) throw new Error(answer.error || response.statusText);
  return answer;
}

function age(seconds) {
  if (seconds == null) return "";
  seconds = Math.max(0, Math.floor(seconds));
  if (seconds < 60) return seconds + "s";
  if (seconds < 3600) return Math.floor(seconds / 60) + "m " + (seconds % 60) + "s";
  if (seconds < 86400) return Math.floor(seconds / 3600) + "h " + Math.floor((seconds % 3600) / 60) + "m";
  return Math.floor(seconds / 86400) + "d " + Math.floor((seconds % 86400) / 3600) + "h";
}

// When a delayed or scheduled task is due: "in 5m 0s", or "now" once passed.
function due(time) {
  const left = since(time);
  return left == null ? "" : left >= 0 ? "now" : "in " + age(-left);
}

function since(time) {
  const at = Date.parse(time);
  return isNaN(at) ? null : (Date.now() - at) / 1000;
}

// A time as the page shows it: UTC, to the second (or the millisecond, for runs that
// take less than one).
function utc(time, millis) {
  const at = Date.parse(time);
  if (isNaN(at)) return time || "";
  const text = new Date(at).toISOString().replace("T", " ");
  return (millis ? text.replace(/Z$/, "") : text.replace(/\.\d+Z$/, "")) + " UTC";
}

// ---- addresses ----

function taskHref(key) {
  return "#/task/" + encodeURIComponent(key);
}

function taskLink(key) {
  return el("a", { class: "task-link key", href: taskHref(key) }, key);
}

// The route the hash names: #/pane?params or #/task/<key>.
function parseHash() {
  const hash = location.hash.replace(/^#\/?/, "");
  const [path, query] = hash.split("?", 2);
  const params = new URLSearchParams(query || "");
  if (path.startsWith("task/")) return { pane: "task", params, key: decodeURIComponent(path.slice(5)) };
  const pane = PANES[path] ? path : "overview";
  return { pane, params, key: null };
}

// The address of `pane` with `params` (empty ones left out).
function href(pane, params) {
  const query = new URLSearchParams();
  for (const [name, value] of Object.entries(params || {})) if (value !== "" && value != null) query.set(name, value);
  const text = query.toString();
  return "#/" + pane + (text ? "?" + text : "");
}

function go(address, replace) {
  if (location.hash === address) return render();
  if (replace) {
    history.replaceState(null, "", address);
    render();
  } else {
    location.hash = address;
  }
}

function page() {
  return Math.max(1, parseInt(route.params.get("page") || "1", 10) || 1);
}

// Moves to page `n` of the current pane, its filters kept.
function toPage(n) {
  const params = Object.fromEntries(route.params.entries());
  params.page = n > 1 ? n : "";
  go(href(route.pane, params));
}

function render() {
  route = parseHash();
  const pane = PANES[route.pane];
  for (const link of document.querySelectorAll("nav a")) link.classList.toggle("active", link.dataset.pane === pane);
  for (const section of document.querySelectorAll(".pane")) section.hidden = section.id !== "pane-" + pane;
  if (route.pane === "overview") {
    chartRead = 0;
    for (const link of document.querySelectorAll("#chart-windows a")) link.classList.toggle("active", link.dataset.window === chartWindow());
  }
  show("");
  loadActive();
}

// ---- overview ----

function renderOverview(data) {
  overview = data;
  if (data.error) show(data.error);
  const leader = data.leader;
  $("leader-node").textContent = leader ? leader.node || "(unnamed)" : "none";
  $("leader-since").textContent = leader && leader.since ? utc(leader.since) + " (" + age(since(leader.since)) + " ago)" : "–";
  $("leader-token").textContent = leader ? leader.fencing_token : "–";
  const status = data.status;
  $("pending-count").textContent = status.pending;
  $("delayed-count").textContent = status.delayed;
  $("scheduled-count").textContent = status.scheduled;
  $("next-due").textContent = status.next_due ? " (next " + due(status.next_due) + ")" : "";
  $("inflight-count").textContent = status.in_flight;
  $("orphan-count").textContent = status.orphaned;
  $("dead-count").textContent = status.dead;
  $("dead-badge").textContent = status.dead ? status.dead : "";
  $("paused-state").textContent = status.paused ? "paused" : "running";
  const pause = $("pause-button");
  pause.textContent = status.paused ? "Resume" : "Pause";
  pause.dataset.action = status.paused ? "resume" : "pause";
  $("queue-latency").textContent = data.queue_latency_seconds == null ? "none due" : age(data.queue_latency_seconds);
  $("latency-detail").replaceChildren(...(data.oldest_due
    ? ["oldest due: ", taskLink(data.oldest_due)]
    : ["no task is waiting to be claimed"]));
  const types = data.types.map((t) =>
    el("tr", { "data-type": t.task_type },
      el("td", {}, el("a", { href: href("queue", { type: t.task_type }) }, t.task_type)),
      el("td", {}, t.pending), el("td", {}, t.waiting), el("td", {}, t.claimed),
      el("td", {}, t.dead ? el("a", { href: href("dead", { type: t.task_type }) }, t.dead) : "0"),
      el("td", { class: "state" }, t.paused ? "paused" : ""),
      el("td", {}, el("button", { "data-action": t.paused ? "type-resume" : "type-pause", "data-name": t.task_type }, t.paused ? "Resume" : "Pause"))));
  $("type-rows").replaceChildren(...(types.length ? types : [el("tr", {}, el("td", { colSpan: 7 }, "no tasks"))]));
  const dead = data.recent_dead.map((d) =>
    el("tr", { "data-key": d.key }, el("td", {}, taskLink(d.key)), el("td", {}, d.task_type), el("td", { class: "error" }, d.reason)));
  $("recent-dead").replaceChildren(...(dead.length ? dead : [el("tr", {}, el("td", { colSpan: 3 }, "no dead letters"))]));
  const rows = data.running.map((task) =>
    el("tr", { "data-key": task.key },
      el("td", {}, taskLink(task.key)), el("td", {}, task.task_type), el("td", {}, task.node),
      el("td", {}, task.attempt), el("td", { class: "elapsed", "data-since": task.taken_at }, age(since(task.taken_at))),
      el("td", { class: "progress" }, task.progress == null ? "" : `${Math.round(task.progress * 100)}%`)));
  $("running-rows").replaceChildren(...(rows.length ? rows : [el("tr", {}, el("td", { colSpan: 6 }, "nothing running"))]));
}

function chartWindow() {
  const asked = route.params.get("window");
  return ["1h", "24h", "7d"].includes(asked) ? asked : "1h";
}

// A round number at or above `n`: 1, 2, 5 times a power of ten.
function niceMax(n) {
  if (n <= 4) return 4;
  const power = Math.pow(10, Math.floor(Math.log10(n)));
  for (const step of [1, 2, 5, 10]) if (step * power >= n) return step * power;
  return 10 * power;
}

function tickLabel(seconds, window) {
  const at = new Date(seconds * 1000);
  const hm = String(at.getUTCHours()).padStart(2, "0") + ":" + String(at.getUTCMinutes()).padStart(2, "0");
  if (window !== "7d") return hm;
  return at.toISOString().slice(5, 10) + " " + hm;
}

async function loadChart() {
  const window = chartWindow();
  const chart = await api("/ui/api/chart?window=" + window);
  chartRead = Date.now();
  const total = chart.completed + chart.failed;
  $("chart-totals").textContent = "last " + window.replace("h", " h").replace("d", " d") + ": " + chart.completed + " completed, " +
    chart.failed + " failed (" + (total ? Math.round((100 * chart.failed) / total) : 0) + "% failure rate), " +
    chart.leadership.length + " leadership change" + (chart.leadership.length === 1 ? "" : "s");
  drawChart(chart);
}

// Stacked bars (completed, failed) per bucket, a y axis with a rounded scale, time labels
// in UTC on the x axis, and a dashed line where a new leader took over.
function drawChart(chart) {
  const [W, H, left, right, top, bottom] = [900, 220, 44, 10, 12, 34];
  const plotW = W - left - right;
  const plotH = H - top - bottom;
  const max = niceMax(Math.max(0, ...chart.bars.map((b) => b.completed + b.failed)));
  const span = chart.to - chart.from;
  const x = (t) => left + ((t - chart.from) / span) * plotW;
  const y = (n) => top + plotH - (n / max) * plotH;
  const nodes = [];
  for (let i = 0; i <= 4; i++) {
    const n = (max * i) / 4;
    nodes.push(svg("line", { x1: left, x2: W - right, y1: y(n), y2: y(n), class: "grid" }));
    nodes.push(svg("text", { x: left - 6, y: y(n) + 4, class: "axis", "text-anchor": "end" }, Number.isInteger(n) ? n : n.toFixed(1)));
  }
  nodes.push(svg("text", { x: 12, y: top + plotH / 2, class: "axis", transform: "rotate(-90 12 " + (top + plotH / 2) + ")", "text-anchor": "middle" }, "tasks per " + age(chart.bucket_seconds).replace(" 0s", "").replace(" 0m", "")));
  const barW = plotW / chart.bars.length;
  for (const bar of chart.bars) {
    const bx = x(bar.start) + 0.5;
    const w = Math.max(1, barW - 1);
    const label = tickLabel(bar.start, chart.window) + ": " + bar.completed + " completed, " + bar.failed + " failed";
    if (bar.completed) {
      const rect = svg("rect", { x: bx, width: w, y: y(bar.completed), height: y(0) - y(bar.completed), class: "ok" });
      rect.append(svg("title", {}, label));
      nodes.push(rect);
    }
    if (bar.failed) {
      const rect = svg("rect", { x: bx, width: w, y: y(bar.completed + bar.failed), height: y(bar.completed) - y(bar.completed + bar.failed), class: "bad" });
      rect.append(svg("title", {}, label));
      nodes.push(rect);
    }
  }
  nodes.push(svg("line", { x1: left, x2: W - right, y1: y(0), y2: y(0), class: "axisline" }));
  const ticks = 6;
  for (let i = 0; i <= ticks; i++) {
    const t = chart.from + (span * i) / ticks;
    nodes.push(svg("line", { x1: x(t), x2: x(t), y1: y(0), y2: y(0) + 4, class: "axisline" }));
    nodes.push(svg("text", { x: x(t), y: H - bottom + 18, class: "axis", "text-anchor": i === 0 ? "start" : i === ticks ? "end" : "middle" }, tickLabel(t, chart.window)));
  }
  nodes.push(svg("text", { x: W - right, y: H - 2, class: "axis", "text-anchor": "end" }, "UTC"));
  for (const mark of chart.leadership) {
    const group = svg("g", { class: "lead" });
    group.append(svg("line", { x1: x(mark.at), x2: x(mark.at), y1: top, y2: y(0) }));
    group.append(svg("text", { x: x(mark.at) + 3, y: top + 9, class: "axis lead-label" }, mark.node));
    group.append(svg("title", {}, tickLabel(mark.at, "7d") + ": " + mark.node + " leads (fencing token " + mark.fencing_token + "; before: " + mark.why + ")"));
    nodes.push(group);
  }
  $("chart").replaceChildren(...nodes);
}

async function loadStandbys() {
  recordedPane($("standbys"), await api("/ui/api/standbys"), [["node", "Node"], ["status", "Status"], ["seen", "Last heartbeat"], ["host", "Host"], ["shards", "Shards led"]], "no standbys: only the leader runs");
}

// ---- list panes ----

function recordedPane(target, data, columns, empty) {
  if (data.recorded !== "yes") {
    target.replaceChildren(el("div", { class: "empty" }, "Not recorded: " + (data.why || "")));
    return;
  }
  if (!data.rows.length) {
    target.replaceChildren(el("div", { class: "empty" }, empty || "nothing yet"));
    return;
  }
  const head = el("tr", {}, ...columns.map(([, title]) => el("th", {}, title)));
  const rows = data.rows.map((row) => el("tr", {}, ...columns.map(([name]) => el("td", {}, typeof row[name] === "object" ? JSON.stringify(row[name]) : row[name]))));
  target.replaceChildren(el("table", {}, el("thead", {}, head), el("tbody", {}, ...rows)));
}

function actionButton(label, action, key, danger) {
  return el("button", { "data-action": action, "data-key": key, class: danger ? "danger" : "" }, label);
}

// Fills a type filter with the types the server named, keeping the chosen one.
function fillTypes(select, types, chosen) {
  const first = select.options[0];
  const all = new Set(types);
  if (chosen) all.add(chosen);
  select.replaceChildren(first, ...[...all].sort().map((t) => el("option", { value: t }, t)));
  select.value = chosen || "";
}

function pager(prefix, data) {
  const pages = Math.max(1, Math.ceil(data.total / data.limit));
  const current = Math.floor(data.offset / data.limit) + 1;
  $(prefix + "-page").textContent = "page " + current + " of " + pages + " (" + data.total + ")";
  $(prefix + "-prev").disabled = current <= 1;
  $(prefix + "-next").disabled = current >= pages;
}

// The API's query for a filtered, paged pane: its filters from the address, the page as an
// offset.
function listQuery(names) {
  const query = new URLSearchParams();
  for (const name of names) {
    const value = route.params.get(name);
    if (value) query.set(name, value);
  }
  query.set("limit", PER_PAGE);
  query.set("offset", (page() - 1) * PER_PAGE);
  return query;
}

async function loadQueue() {
  const query = new URLSearchParams({ page: page() - 1, per: PER_PAGE });
  const type = route.params.get("type") || "";
  const search = route.params.get("q") || "";
  if (type) query.set("type", type);
  if (search) query.set("q", search);
  if (document.activeElement !== $("queue-search")) $("queue-search").value = search;
  const data = await api("/ui/api/queue?" + query);
  fillTypes($("queue-type"), data.types, type);
  const first = data.page * data.per;
  const rows = data.rows.map((row, i) =>
    el("tr", { "data-key": row.key },
      el("td", {}, first + i + 1),
      el("td", {}, row.state.replace("_", " "), row.waits ? el("div", { class: "muted" }, row.waits) : ""),
      el("td", {}, taskLink(row.key)),
      el("td", {}, row.task_type), el("td", {}, age(row.age_seconds)),
      el("td", { title: row.due_at || "" }, row.due_at ? due(row.due_at) : ""), el("td", {}, row.attempts),
      el("td", { class: "error" }, row.last_error),
      el("td", {}, row.state === "malformed" ? "" : actionButton("Cancel", "cancel", row.key, true))));
  $("queue-rows").replaceChildren(...(rows.length ? rows : [el("tr", {}, el("td", { colSpan: 9 }, "the queue is empty"))]));
  const pages = Math.max(1, Math.ceil(data.total / data.per));
  $("queue-page").textContent = "page " + (data.page + 1) + " of " + pages + " (" + data.total + " tasks)";
  $("queue-prev").disabled = data.page === 0;
  $("queue-next").disabled = data.page + 1 >= pages;
}

// Shows the address's filters in a filter form.
function fillForm(form) {
  for (const field of form.elements) {
    if (!field.name || field.tagName === "SELECT") continue;
    if (document.activeElement !== field) field.value = route.params.get(field.name) || "";
  }
}

async function loadDead() {
  fillForm($("dead-filter"));
  const data = await api("/ui/api/dead?" + listQuery(["type", "from", "to", "q"]));
  fillTypes($("dead-type"), data.types, route.params.get("type"));
  const rows = data.rows.map((row) =>
    el("tr", { "data-key": row.key },
      el("td", {}, taskLink(row.key)), el("td", {}, row.task_type), el("td", { class: "error" }, row.reason),
      el("td", {}, row.attempts), el("td", { class: "error" }, row.last_error),
      el("td", { title: row.dead_at }, row.dead_at ? age(since(row.dead_at)) : ""),
      el("td", {}, row.retryable ? actionButton("Retry", "retry", row.key) : "", " ", actionButton("Delete", "delete", row.key, true))));
  $("dead-rows").replaceChildren(...(rows.length ? rows : [el("tr", {}, el("td", { colSpan: 7 }, "no dead letters" + (route.params.toString() ? " match" : "")))]));
  pager("dead", data);
}

async function loadHistory() {
  fillForm($("history-filter"));
  const data = await api("/ui/api/history?" + listQuery(["type", "outcome", "from", "to", "q"]));
  $("history-outcome").value = route.params.get("outcome") || "";
  if (data.recorded !== "yes") {
    $("history").replaceChildren(el("div", { class: "empty" }, "Not recorded: " + (data.why || "")));
    return;
  }
  fillTypes($("history-type"), data.types, route.params.get("type"));
  const head = el("tr", {}, ...["Finished", "Task", "Type", "Outcome", "Duration", "Attempts", "Fencing token", "Node", "Reason or last error"].map((t) => el("th", {}, t)));
  const rows = data.rows.map((row) =>
    el("tr", { "data-key": row.key, class: row.outcome },
      el("td", { title: row.finished_at }, utc(row.finished_at)), el("td", {}, el("a", { class: "task-link key", href: taskHref(row.record_key) }, row.key)),
      el("td", {}, row.task_type), el("td", { class: "outcome" }, row.outcome),
      el("td", {}, row.duration_ms == null ? "" : row.duration_ms + " ms"), el("td", {}, row.attempts),
      el("td", {}, row.fencing_token == null ? "" : row.fencing_token), el("td", {}, row.node),
      el("td", { class: "error" }, row.detail)));
  $("history").replaceChildren(rows.length
    ? el("table", {}, el("thead", {}, head), el("tbody", { id: "history-rows" }, ...rows))
    : el("div", { class: "empty" }, route.params.toString() ? "no finished task matches" : "nothing yet"));
  pager("history", data);
}

// Schedules: a paused one offers resume, an active one pause; an unreadable record says why.
async function loadSchedules() {
  const data = await api("/ui/api/schedules");
  if (data.recorded !== "yes") {
    $("schedule-rows").replaceChildren(el("tr", {}, el("td", { colSpan: 10, class: "error" }, "Not readable: " + (data.why || ""))));
    return;
  }
  const rows = data.rows.map((row) => {
    if (row.error) {
      return el("tr", { "data-name": row.name },
        el("td", { class: "key" }, row.name), el("td", { colSpan: 9, class: "error" }, "unreadable: " + row.error));
    }
    const toggle = row.state === "paused" ? "schedule-resume" : "schedule-pause";
    const button = el("button", { "data-action": toggle, "data-name": row.name }, row.state === "paused" ? "Resume" : "Pause");
    return el("tr", { "data-name": row.name },
      el("td", { class: "key" }, row.name), el("td", {}, row.when), el("td", {}, row.task_type),
      el("td", { class: "state" }, row.state),
      el("td", { title: row.last_tick }, row.last_tick ? age(since(row.last_tick)) + " ago" : "never"),
      el("td", { class: "next", title: row.next_tick }, row.next_tick ? due(row.next_tick) + " (" + row.next_tick + ")" : "–"),
      el("td", {}, row.last_task ? taskLink(row.last_task) : ""), el("td", {}, row.outcome), el("td", {}, row.skipped),
      el("td", {}, button));
  });
  $("schedule-rows").replaceChildren(...(rows.length ? rows : [el("tr", {}, el("td", { colSpan: 10 }, "no schedules (add some with leaderq schedules apply FILE)"))]));
}

// ---- the task page ----

async function loadTask() {
  const key = route.key;
  $("task-key").textContent = key;
  let task;
  try {
    task = await api("/ui/api/task?key=" + encodeURIComponent(key));
  } catch (err) {
    $("task-state").textContent = "not found";
    $("task-summary").textContent = err.message;
    for (const id of ["task-actions", "task-facts", "task-attempts", "task-output", "task-value"]) $(id).replaceChildren();
    $("task-record-box").hidden = true;
    return;
  }
  if (route.key !== key) return;
  $("task-key").textContent = task.key;
  $("task-state").textContent = task.state.replace("_", " ");
  $("task-state").className = "state " + task.state;
  $("task-summary").textContent = task.summary;
  const labels = { retry: "Retry", cancel: "Cancel", delete: "Delete" };
  $("task-actions").replaceChildren(...task.actions.map((action) =>
    actionButton(labels[action], action, task.key, action !== "retry")));
  const facts = [
    ["Where", { queue: "in the queue", dead: "in the dead letters", history: "finished (history)" }[task.place]],
    ["Task type", task.task_type], ["Task id", task.task_id], ["Attempts used", task.attempts],
    ["Claimed by", task.claimed_by], ["Claimed at", task.claimed_at && utc(task.claimed_at)],
    ["Due at", task.due_at && utc(task.due_at)], ["Fencing token", task.fencing_token],
    ["Last error", task.last_error],
  ].filter(([, value]) => value !== "" && value != null);
  $("task-facts").replaceChildren(...facts.map(([name, value]) =>
    el("tr", {}, el("th", {}, name), el("td", { class: name === "Last error" ? "error" : "" }, value))));
  // Attempts are stored in the task's value, in the producers' camelCase.
  const attempts = task.attempt_log.map((a) =>
    el("tr", { class: a.outcome, "data-attempt": a.attempt },
      el("td", {}, a.attempt), el("td", {}, utc(a.startedAt, true)), el("td", {}, utc(a.finishedAt, true)),
      el("td", { class: "outcome" }, a.outcome), el("td", {}, a.error ? el("pre", { class: "error" }, a.error) : ""),
      el("td", {}, a.node), el("td", {}, a.fencingToken == null ? "" : a.fencingToken)));
  $("task-attempts").replaceChildren(...(attempts.length ? attempts : [el("tr", {}, el("td", { colSpan: 7 }, task.attempts ? "no run was logged (runs before leaderq kept an attempt log)" : "not run yet"))]));
  $("task-output").replaceChildren(...(task.output.length ? task.output.map(outputOf) : [el("p", { class: "empty" }, "no output kept (a run that prints nothing keeps none)")]));
  $("task-value").textContent = task.value == null ? "(a completed task's value is not kept; its record is below)" : JSON.stringify(task.value, null, 2);
  $("task-record-box").hidden = !task.record;
  if (task.record) $("task-record").textContent = JSON.stringify(task.record, null, 2);
}

// One attempt's kept output: its stdout and stderr, each with what was not kept before it.
function outputOf(run) {
  const stream = (name, text, dropped) => [
    el("h4", {}, name, dropped ? el("small", { class: "note" }, " (" + dropped + " bytes before this were not kept)") : ""),
    el("pre", { class: "output " + name }, text || "(nothing)")];
  return el("div", { class: "run-output", "data-attempt": run.attempt },
    el("h3", {}, "Attempt " + run.attempt + ": ", el("span", { class: "outcome " + run.outcome }, run.outcome),
      el("small", { class: "note" }, " " + utc(run.finishedAt, true) + " on " + run.node)),
    run.note ? el("p", { class: "note" }, run.note) : "",
    ...stream("stdout", run.stdout, run.stdoutDropped), ...stream("stderr", run.stderr, run.stderrDropped));
}

// ---- loading and the live feed ----

async function loadActive() {
  try {
    if (route.pane === "overview") {
      if (Date.now() - chartRead > 5000) await Promise.all([loadChart(), loadStandbys()]);
    } else if (route.pane === "queue") await loadQueue();
    else if (route.pane === "dead") await loadDead();
    else if (route.pane === "schedules") await loadSchedules();
    else if (route.pane === "history") await loadHistory();
    else if (route.pane === "leadership") recordedPane($("timeline"), await api("/ui/api/timeline"), [["node", "Node"], ["token", "Fencing token"], ["since", "Since"], ["until", "Until"], ["why", "Why"]]);
    else if (route.pane === "task") await loadTask();
  } catch (err) {
    show(err.message);
  }
}

// The live feed: each event is a new overview; the open pane is read again with it (the
// history and a task page at most once a second).
let lastSlowRead = 0;
function connect() {
  if (feed) feed.close();
  feed = new EventSource("/ui/api/events");
  feed.addEventListener("overview", (event) => {
    $("live").textContent = "live";
    $("live").className = "live on";
    renderOverview(JSON.parse(event.data));
    const slow = route.pane === "history" || route.pane === "task";
    if (slow && Date.now() - lastSlowRead < 1000) return;
    if (slow) lastSlowRead = Date.now();
    loadActive();
  });
  feed.onerror = () => {
    $("live").textContent = "reconnecting…";
    $("live").className = "live";
    // A refused feed (token) shows as an error here: ask the API why.
    api("/ui/api/overview").catch((err) => show(err.message));
  };
}

document.addEventListener("click", async (event) => {
  const target = event.target.closest("button");
  if (!target) return;
  const action = target.dataset.action;
  if (!action) return;
  const key = target.dataset.key;
  const name = target.dataset.name;
  if (action === "delete" && !confirm("Delete " + key + " for good?")) return;
  if (action === "cancel" && !confirm("Cancel " + key + "?")) return;
  if (action === "retry-all" && !confirm("Move every dead letter back to the queue?")) return;
  target.disabled = true;
  try {
    const answer = await act("/ui/api/" + action, key ? { key } : name ? { name } : {});
    const onTaskPage = route.pane === "task";
    if (action === "retry") {
      show("requeued as " + answer.requeued, true);
      if (onTaskPage) return go(taskHref(answer.requeued));
    } else if (action === "retry-all") show("requeued " + answer.requeued + (answer.errors.length ? "; not requeued: " + answer.errors.join("; ") : ""), !answer.errors.length);
    else if (action === "delete") {
      show("deleted " + answer.deleted, true);
      if (onTaskPage) return go(href("dead"));
    } else if (action === "cancel") show(answer.what, true);
    else show("");
    await loadActive();
    if (onTaskPage) show($("message").textContent, true);
  } catch (err) {
    show(err.message);
  } finally {
    target.disabled = false;
  }
});

$("login").addEventListener("submit", async (event) => {
  event.preventDefault();
  try {
    await act("/ui/api/login", { token: $("login-token").value });
    $("login").hidden = true;
    show("");
    connect();
    chartRead = 0;
    loadActive();
  } catch (err) {
    show(err.message);
  }
});

// A filter form's fields become the address (datetime-local values as they are: UTC).
for (const [form, pane] of [["dead-filter", "dead"], ["history-filter", "history"]]) {
  $(form).addEventListener("submit", (event) => {
    event.preventDefault();
    const params = {};
    for (const field of $(form).elements) if (field.name) params[field.name] = field.value.trim();
    go(href(pane, params));
  });
  for (const select of $(form).querySelectorAll("select")) {
    select.addEventListener("change", () => $(form).requestSubmit());
  }
}

let searchTimer = null;
$("queue-search").addEventListener("input", () => {
  clearTimeout(searchTimer);
  searchTimer = setTimeout(() => go(href("queue", { type: $("queue-type").value, q: $("queue-search").value.trim() }), true), 250);
});
$("queue-type").addEventListener("change", () => go(href("queue", { type: $("queue-type").value, q: $("queue-search").value.trim() })));
for (const prefix of ["queue", "dead", "history"]) {
  $(prefix + "-prev").addEventListener("click", () => toPage(page() - 1));
  $(prefix + "-next").addEventListener("click", () => toPage(page() + 1));
}
$("task-back").addEventListener("click", () => history.back());

// Elapsed times tick every second between readings.
setInterval(() => {
  for (const cell of document.querySelectorAll(".elapsed[data-since]")) cell.textContent = age(since(cell.dataset.since));
}, 1000);

window.addEventListener("hashchange", render);
connect();
render();
