// The leaderq dashboard: renders the panes from /ui/api/..., follows the live feed
// (server-sent events), and sends the actions as POSTs with the page's CSRF token.
// No framework: every text from the server goes through textContent, never innerHTML.
"use strict";

const csrf = document.querySelector('meta[name="csrf-token"]').content;
const $ = (id) => document.getElementById(id);
let active = "overview";
let overview = null;
let queuePage = 0;
let feed = null;

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

function renderOverview(data) {
  overview = data;
  show(data.error || "");
  const leader = data.leader;
  $("leader-node").textContent = leader ? leader.node || "(unnamed)" : "none";
  $("leader-since").textContent = leader && leader.since ? leader.since + " (" + age(since(leader.since)) + " ago)" : "–";
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
  const rows = data.running.map((task) =>
    el("tr", { "data-key": task.key },
      el("td", { class: "key" }, task.key), el("td", {}, task.task_type), el("td", {}, task.node),
      el("td", {}, task.attempt), el("td", { class: "elapsed", "data-since": task.taken_at }, age(since(task.taken_at)))));
  $("running-rows").replaceChildren(...(rows.length ? rows : [el("tr", {}, el("td", { colSpan: 5 }, "nothing running"))]));
  $("completed-hour").textContent = data.completed_last_hour;
  $("chart-source").textContent = data.chart_source === "history" ? "from the history" : "seen by this dashboard (history is off)";
  $("failed-hour").textContent = data.failed_last_hour;
  const total = data.completed_last_hour + data.failed_last_hour;
  $("failure-rate").textContent = total ? Math.round((100 * data.failed_last_hour) / total) : 0;
  renderChart(data.chart);
}

function renderChart(minutes) {
  const svg = $("chart");
  const ns = "http://www.w3.org/2000/svg";
  const top = Math.max(1, ...minutes.map((m) => m.completed + m.failed));
  const width = 600 / Math.max(1, minutes.length);
  const bars = [];
  minutes.forEach((m, i) => {
    const ok = (90 * m.completed) / top;
    const bad = (90 * m.failed) / top;
    for (const [height, y, kind] of [[ok, 100 - ok, "ok"], [bad, 100 - ok - bad, "bad"]]) {
      if (!height) continue;
      const rect = document.createElementNS(ns, "rect");
      rect.setAttribute("x", i * width + 1);
      rect.setAttribute("width", Math.max(1, width - 2));
      rect.setAttribute("y", y);
      rect.setAttribute("height", height);
      rect.setAttribute("class", kind);
      const title = document.createElementNS(ns, "title");
      title.textContent = new Date(m.minute * 60000).toLocaleTimeString() + ": " + m.completed + " completed, " + m.failed + " failed";
      rect.append(title);
      bars.push(rect);
    }
  });
  svg.replaceChildren(...bars);
}

function recordedPane(target, data, columns) {
  if (data.recorded !== "yes") {
    target.replaceChildren(el("div", { class: "empty" }, "Not recorded: " + (data.why || "")));
    return;
  }
  if (!data.rows.length) {
    target.replaceChildren(el("div", { class: "empty" }, "nothing yet"));
    return;
  }
  const head = el("tr", {}, ...columns.map((c) => el("th", {}, c)));
  const rows = data.rows.map((row) => el("tr", {}, ...columns.map((c) => el("td", {}, typeof row[c] === "object" ? JSON.stringify(row[c]) : row[c]))));
  target.replaceChildren(el("table", {}, el("thead", {}, head), el("tbody", {}, ...rows)));
}

function actionButton(label, action, key, danger) {
  return el("button", { "data-action": action, "data-key": key, class: danger ? "danger" : "" }, label);
}

async function loadQueue() {
  const params = new URLSearchParams({ page: queuePage, per: 50 });
  const type = $("queue-type").value;
  const search = $("queue-search").value.trim();
  if (type) params.set("type", type);
  if (search) params.set("q", search);
  const data = await api("/ui/api/queue?" + params);
  const select = $("queue-type");
  const known = new Set([...select.options].map((o) => o.value));
  for (const t of data.types) if (!known.has(t)) select.append(el("option", { value: t }, t));
  const first = data.page * data.per;
  const rows = data.rows.map((row, i) =>
    el("tr", { "data-key": row.key },
      el("td", {}, first + i + 1), el("td", {}, row.state), el("td", { class: "key" }, row.key),
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

async function loadDead() {
  const data = await api("/ui/api/dead");
  const rows = data.rows.map((row) =>
    el("tr", { "data-key": row.key },
      el("td", { class: "key" }, row.key), el("td", {}, row.task_type), el("td", { class: "error" }, row.reason),
      el("td", {}, row.attempts), el("td", { class: "error" }, row.last_error),
      el("td", {}, row.dead_at ? age(since(row.dead_at)) : ""),
      el("td", {}, row.retryable ? actionButton("Retry", "retry", row.key) : "", " ", actionButton("Delete", "delete", row.key, true))));
  $("dead-rows").replaceChildren(...(rows.length ? rows : [el("tr", {}, el("td", { colSpan: 7 }, "no dead letters"))]));
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
      el("td", { class: "key" }, row.last_task), el("td", {}, row.outcome), el("td", {}, row.skipped),
      el("td", {}, button));
  });
  $("schedule-rows").replaceChildren(...(rows.length ? rows : [el("tr", {}, el("td", { colSpan: 10 }, "no schedules (add some with leaderq schedules apply FILE)"))]));
}

async function loadStandbys() {
  recordedPane($("standbys"), await api("/ui/api/standbys"), ["node", "status", "last_heartbeat", "host"]);
}

async function loadActive() {
  try {
    if (active === "queue") await loadQueue();
    else if (active === "dead") await loadDead();
    else if (active === "schedules") await loadSchedules();
    else if (active === "history") recordedPane($("history"), await api("/ui/api/history"), ["key", "task_type", "outcome", "duration", "attempts", "fencing_token", "node", "finished_at", "detail"]);
    else if (active === "timeline") recordedPane($("timeline"), await api("/ui/api/timeline"), ["node", "fencing_token", "since", "until", "why"]);
  } catch (err) {
    show(err.message);
  }
}

function select(pane) {
  active = pane;
  for (const button of document.querySelectorAll("nav button")) button.classList.toggle("active", button.dataset.pane === pane);
  for (const section of document.querySelectorAll(".pane")) section.hidden = section.id !== "pane-" + pane;
  loadActive();
}

// The live feed: each event is a new overview; the open list pane is read again with it.
function connect() {
  if (feed) feed.close();
  feed = new EventSource("/ui/api/events");
  feed.addEventListener("overview", (event) => {
    $("live").textContent = "live";
    $("live").className = "live on";
    renderOverview(JSON.parse(event.data));
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
  const target = event.target.closest("button, a");
  if (!target) return;
  if (target.dataset.pane) return select(target.dataset.pane);
  if (target.dataset.goto) {
    event.preventDefault();
    return select(target.dataset.goto);
  }
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
    if (action === "retry") show("requeued as " + answer.requeued, true);
    else if (action === "retry-all") show("requeued " + answer.requeued + (answer.errors.length ? "; not requeued: " + answer.errors.join("; ") : ""), !answer.errors.length);
    else if (action === "delete") show("deleted " + answer.deleted, true);
    else show("");
    await loadActive();
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
    loadStandbys().catch(() => {});
  } catch (err) {
    show(err.message);
  }
});

let searchTimer = null;
$("queue-search").addEventListener("input", () => {
  clearTimeout(searchTimer);
  searchTimer = setTimeout(() => { queuePage = 0; loadActive(); }, 250);
});
$("queue-type").addEventListener("change", () => { queuePage = 0; loadActive(); });
$("queue-prev").addEventListener("click", () => { queuePage = Math.max(0, queuePage - 1); loadActive(); });
$("queue-next").addEventListener("click", () => { queuePage += 1; loadActive(); });

// Elapsed times tick every second between readings.
setInterval(() => {
  for (const cell of document.querySelectorAll(".elapsed[data-since]")) cell.textContent = age(since(cell.dataset.since));
}, 1000);

connect();
loadStandbys().catch(() => {});
