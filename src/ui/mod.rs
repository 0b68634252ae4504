//! The web dashboard at `/ui/`: served on every replica's observe listener, by `leaderq
//! dev`, and standalone by `leaderq ui` against the configured backend. It owns the page
//! (HTML, CSS and JS embedded in the binary, no framework, no CDN), its JSON API under
//! `/ui/api/`, the live feed (server-sent events) and the actions (retry, retry all,
//! delete, cancel, pause, resume, and a schedule's pause and resume).
//!
//! One watcher per serving process, started by the first request, reads the queue, the
//! dead letters, the holder and the pause flag, and waits on the coordinator's blocking
//! `list`/`observe` for the next change (or an action here), at most four times a second;
//! every page in every browser gets each new reading from it, so a hundred open tabs cost
//! the coordinator what one does (`watcher.rs`); the history page and the chart filter
//! and count the watcher's records too. What is read per request is small: a task page's
//! key (and, once it left the queue, the history to find its record), the leadership
//! terms for the chart. The panes are computed by `view.rs`
//! (pure); who may call what is `auth.rs` (pure), checked by the extractor each handler
//! takes (`access.rs`: `Reader`, `Admin`); records kept by other parts (history,
//! timeline, standbys) and the actions they own are behind `data.rs`. The queue's own
//! reads and writes are `operate`'s.
//!
//! Size: one short handler per endpoint (reads, actions, the live feed) beside the route
//! table they fill; each is its access extractor, one call and an answer.

mod access;
pub mod auth;
pub mod data;
pub mod pages;
pub mod view;
mod watcher;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{RawQuery, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::Router;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::{watch, Notify};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::{ElectionSettings, ObserveSettings, QueueSettings, Settings};
use crate::coord::{CoordError, Coordinator};
use crate::operate::schedules::SchedulesError;
use crate::operate::{dead, status, OperateError};
use crate::task::key::Key;
use access::{Admin, Reader};
use view::Panes;

const INDEX_HTML: &str = include_str!("assets/index.html");
const APP_JS: &str = include_str!("assets/app.js");
const APP_CSS: &str = include_str!("assets/app.css");

/// A request waits this long for the watcher's first reading.
const FIRST_READING: Duration = Duration::from_secs(10);
/// Rows per page of the queue pane, by default and at most.
const PAGE_DEFAULT: usize = 50;
const PAGE_MAX: usize = 500;

/// Why `leaderq ui` did not serve.
#[derive(Debug, thiserror::Error)]
pub enum UiError {
    #[error("{0}")]
    Settings(String),
    #[error("{0}")]
    Coordinator(#[from] CoordError),
    #[error(
        "cannot listen on {listen} for the dashboard: {reason}; pick another address with --listen"
    )]
    Bind { listen: SocketAddr, reason: String },
    #[error("the dashboard stopped: {0}")]
    Serve(std::io::Error),
}

/// What the dashboard reads of the settings: the queue's prefixes, the election's leader
/// key (the replicas, the timeline), how long one blocking read waits, and its token.
#[derive(Clone, Debug)]
pub struct UiSettings {
    pub queue: QueueSettings,
    pub election: ElectionSettings,
    /// How long one watch of the coordinator may wait (`Settings::watch_wait`).
    pub watch_wait: Duration,
    /// `observe.admin_token`, if set.
    pub token: Option<String>,
    /// What the leader holds tasks back by, to say why a task waits.
    pub limits: crate::operate::waits::Limits,
}

impl From<&Settings> for UiSettings {
    fn from(settings: &Settings) -> UiSettings {
        UiSettings {
            queue: settings.queue.clone(),
            election: settings.election.clone(),
            watch_wait: settings.watch_wait(),
            token: settings.observe.admin_token().map(str::to_string),
            limits: crate::operate::waits::Limits::of(settings),
        }
    }
}

/// A serving process's dashboard: the coordinator, its settings, the tokens and the
/// watcher's latest reading.
pub struct Ui {
    coord: Arc<dyn Coordinator>,
    queue: QueueSettings,
    election: ElectionSettings,
    /// How long one watch of the coordinator may wait.
    watch_wait: Duration,
    /// `observe.admin_token`, if set.
    token: Option<String>,
    /// What the leader holds tasks back by.
    limits: crate::operate::waits::Limits,
    /// This process's CSRF token.
    csrf: String,
    panes: watch::Sender<Arc<Panes>>,
    watching: AtomicBool,
    /// An action here: read again now.
    refresh: Notify,
    stop: CancellationToken,
    tracker: TaskTracker,
}

impl Ui {
    /// A dashboard over `coord`; its watcher (started by the first request) is spawned on
    /// `tracker` and ends, with every live feed, when `stop` is cancelled.
    pub fn new(
        coord: Arc<dyn Coordinator>,
        settings: UiSettings,
        stop: CancellationToken,
        tracker: TaskTracker,
    ) -> Arc<Ui> {
        Arc::new(Ui {
            coord,
            queue: settings.queue,
            election: settings.election,
            watch_wait: settings.watch_wait,
            token: settings.token,
            limits: settings.limits,
            csrf: format!(
                "{}{}",
                uuid::Uuid::new_v4().simple(),
                uuid::Uuid::new_v4().simple()
            ),
            panes: watch::Sender::new(Arc::new(Panes::default())),
            watching: AtomicBool::new(false),
            refresh: Notify::new(),
            stop,
            tracker,
        })
    }

    fn ensure_watching(self: &Arc<Self>) {
        if !self.watching.swap(true, Ordering::SeqCst) {
            self.tracker.spawn(watcher::watch_coordinator(self.clone()));
        }
    }

    /// The latest reading, waiting for the first one.
    async fn panes(self: &Arc<Self>) -> Arc<Panes> {
        self.ensure_watching();
        let mut receiver = self.panes.subscribe();
        let first = receiver.wait_for(|panes| panes.overview.seq > 0);
        let _ = tokio::time::timeout(FIRST_READING, first).await;
        let panes = receiver.borrow().clone();
        panes
    }
}

/// The dashboard's routes, all under `/ui`.
pub fn router(ui: Arc<Ui>) -> Router {
    Router::new()
        .route("/ui", get(|| async { Redirect::permanent("/ui/") }))
        .route("/ui/", get(index))
        .route("/ui/app.js", get(app_js))
        .route("/ui/app.css", get(app_css))
        .route("/ui/api/overview", get(overview))
        .route("/ui/api/queue", get(queue))
        .route("/ui/api/dead", get(dead))
        .route("/ui/api/history", get(history))
        .route("/ui/api/timeline", get(timeline))
        .route("/ui/api/chart", get(chart))
        .route("/ui/api/task", get(task))
        .route("/ui/api/standbys", get(standbys))
        .route("/ui/api/schedules", get(schedules))
        .route("/ui/api/events", get(events))
        .route("/ui/api/login", post(login))
        .route("/ui/api/retry", post(retry))
        .route("/ui/api/retry-all", post(retry_all))
        .route("/ui/api/delete", post(delete))
        .route("/ui/api/cancel", post(cancel))
        .route("/ui/api/pause", post(pause))
        .route("/ui/api/resume", post(resume))
        .route("/ui/api/schedule-pause", post(schedule_pause))
        .route("/ui/api/type-pause", post(type_pause))
        .route("/ui/api/type-resume", post(type_resume))
        .route("/ui/api/schedule-resume", post(schedule_resume))
        .with_state(ui)
}

/// Answers a JSON value.
fn answer(status: StatusCode, body: Value) -> Response {
    let mut response = (status, body.to_string()).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    response.headers_mut().insert(
        header::CACHE_CONTROL,
        header::HeaderValue::from_static("no-store"),
    );
    response
}

fn refused(status: StatusCode, message: &str) -> Response {
    answer(status, json!({ "error": message }))
}

/// A request refused before it reached the coordinator: its status and message.
struct Refused(StatusCode, String);

impl IntoResponse for Refused {
    fn into_response(self) -> Response {
        refused(self.0, &self.1)
    }
}

fn refusal(refusal: auth::Refusal) -> Response {
    why(refusal).into_response()
}

fn why(refusal: auth::Refusal) -> Refused {
    let status = match refusal {
        auth::Refusal::Token => StatusCode::UNAUTHORIZED,
        auth::Refusal::Csrf | auth::Refusal::Origin | auth::Refusal::Host => StatusCode::FORBIDDEN,
    };
    Refused(status, refusal.message().to_string())
}

fn operate_failure(err: OperateError) -> Response {
    let status = match &err {
        OperateError::Coordinator(_) => StatusCode::BAD_GATEWAY,
        OperateError::NoSuchTask { .. } => StatusCode::NOT_FOUND,
        OperateError::InvalidId { .. } | OperateError::InvalidKey { .. } => StatusCode::BAD_REQUEST,
        _ => StatusCode::CONFLICT,
    };
    refused(status, &err.to_string())
}

fn schedules_failure(err: SchedulesError) -> Response {
    let status = match &err {
        SchedulesError::Coordinator(_) => StatusCode::BAD_GATEWAY,
        SchedulesError::NoSuchSchedule(_) => StatusCode::NOT_FOUND,
        _ => StatusCode::CONFLICT,
    };
    refused(status, &err.to_string())
}

/// The page, with this process's CSRF token in a meta tag (for the script's header) and
/// in a `SameSite=Strict` cookie.
async fn index(State(ui): State<Arc<Ui>>, headers: HeaderMap) -> Response {
    if ui.token.is_none() {
        if let Err(why) = auth::check_loopback_host(&headers) {
            return (StatusCode::FORBIDDEN, format!("{}\n", why.message())).into_response();
        }
    }
    let page = INDEX_HTML.replace("__CSRF__", &ui.csrf);
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8".to_string()),
            (header::CACHE_CONTROL, "no-store".to_string()),
            (
                header::SET_COOKIE,
                format!(
                    "{}={}; Path=/ui; HttpOnly; SameSite=Strict",
                    auth::CSRF_COOKIE,
                    ui.csrf
                ),
            ),
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'".to_string(),
            ),
            (header::X_FRAME_OPTIONS, "DENY".to_string()),
        ],
        page,
    )
        .into_response()
}

async fn app_js() -> Response {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        APP_JS,
    )
        .into_response()
}

async fn app_css() -> Response {
    ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], APP_CSS).into_response()
}

async fn overview(State(ui): State<Arc<Ui>>, _: Reader) -> Response {
    let panes = ui.panes().await;
    answer(StatusCode::OK, json!(panes.overview))
}

/// The query's parameters, decoded (`+` as a space, percent escapes).
fn parameters(query: Option<&str>) -> Vec<(String, String)> {
    let decode = |text: &str| {
        percent_encoding::percent_decode_str(&text.replace('+', " "))
            .decode_utf8_lossy()
            .into_owned()
    };
    query
        .unwrap_or_default()
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            (decode(name), decode(value))
        })
        .collect()
}

/// The queue pane: the queue in claim order, filtered by taskType (`type`) and by a part
/// of the key or id (`q`), a page (`page`, from 0) of `per` rows.
async fn queue(State(ui): State<Arc<Ui>>, _: Reader, RawQuery(query): RawQuery) -> Response {
    let parameters = parameters(query.as_deref());
    let parameter = |name: &str| {
        parameters
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
            .filter(|value| !value.is_empty())
    };
    let task_type = parameter("type");
    let search = parameter("q");
    let per = parameter("per")
        .and_then(|per| per.parse().ok())
        .unwrap_or(PAGE_DEFAULT)
        .clamp(1, PAGE_MAX);
    let page: usize = parameter("page")
        .and_then(|page| page.parse().ok())
        .unwrap_or(0);
    let panes = ui.panes().await;
    let mut types: Vec<&str> = panes
        .queue
        .iter()
        .map(|row| row.row.task_type.as_str())
        .collect();
    types.sort_unstable();
    types.dedup();
    let rows: Vec<_> = panes
        .queue
        .iter()
        .filter(|row| task_type.is_none_or(|wanted| row.row.task_type == wanted))
        .filter(|row| search.is_none_or(|part| row.matches(part)))
        .collect();
    let total = rows.len();
    let shown: Vec<_> = rows
        .into_iter()
        .skip(page.saturating_mul(per))
        .take(per)
        .collect();
    answer(
        StatusCode::OK,
        json!({ "total": total, "page": page, "per": per, "types": types, "rows": shown }),
    )
}

/// The dead letters, newest first, filtered (`type`, `from`, `to`, `q`) and paged
/// (`offset`, `limit`) here, so the page gets one page however many there are.
async fn dead(State(ui): State<Arc<Ui>>, _: Reader, RawQuery(query): RawQuery) -> Response {
    let filter = match pages::Filter::parse(&parameters(query.as_deref())) {
        Ok(filter) => filter,
        Err(why) => return refused(StatusCode::BAD_REQUEST, &why),
    };
    let panes = ui.panes().await;
    answer(
        StatusCode::OK,
        json!(pages::dead_page(&panes.dead, &filter)),
    )
}

/// Finished tasks (completed and dead), newest first, filtered (`type`, `outcome`, `from`,
/// `to`, `q`) and paged (`offset`, `limit`) here, from the watcher's last reading of the
/// records (a second or so behind a completion, five at most behind a direct write).
async fn history(State(ui): State<Arc<Ui>>, _: Reader, RawQuery(query): RawQuery) -> Response {
    let filter = match pages::Filter::parse(&parameters(query.as_deref())) {
        Ok(filter) => filter,
        Err(why) => return refused(StatusCode::BAD_REQUEST, &why),
    };
    let panes = ui.panes().await;
    let records = panes.done.iter().chain(&panes.dead_records);
    let mut page = json!(pages::history_page(records, &filter));
    page["recorded"] = json!("yes");
    answer(StatusCode::OK, page)
}

/// The chart of a window (`window`: 1h, 24h or 7d): completions and dead letters by bar,
/// and the leaderships that began in it.
async fn chart(State(ui): State<Arc<Ui>>, _: Reader, RawQuery(query): RawQuery) -> Response {
    let parameters = parameters(query.as_deref());
    let asked = parameters
        .iter()
        .find(|(name, _)| name == "window")
        .map_or("1h", |(_, value)| value.as_str());
    let Some(window) = pages::Window::parse(asked) else {
        return refused(
            StatusCode::BAD_REQUEST,
            &format!("window={asked:?} is not a window: give 1h, 24h or 7d"),
        );
    };
    let panes = ui.panes().await;
    let records = panes.done.iter().chain(&panes.dead_records);
    let now = chrono::Utc::now();
    match data::chart(ui.coord.as_ref(), &ui.election, records, window, now).await {
        Ok(chart) => answer(StatusCode::OK, json!(chart)),
        Err(err) => operate_failure(err),
    }
}

/// One task's page (`key`): its value, state, attempts, history record and actions.
async fn task(State(ui): State<Arc<Ui>>, _: Reader, RawQuery(query): RawQuery) -> Response {
    let parameters = parameters(query.as_deref());
    let Some((_, key)) = parameters.iter().find(|(name, _)| name == "key") else {
        return refused(StatusCode::BAD_REQUEST, "no key given");
    };
    let panes = ui.panes().await;
    let token = panes.overview.leader.as_ref().map(|l| l.fencing_token);
    match data::task(ui.coord.as_ref(), &ui.queue, key, token, chrono::Utc::now()).await {
        Ok(page) => answer(StatusCode::OK, json!(page)),
        Err(err) => operate_failure(err),
    }
}

async fn timeline(State(ui): State<Arc<Ui>>, _: Reader) -> Response {
    let rows = data::timeline(ui.coord.as_ref(), &ui.election).await;
    answer(StatusCode::OK, json!(rows))
}

async fn standbys(State(ui): State<Arc<Ui>>, _: Reader) -> Response {
    let rows = data::standbys(ui.coord.as_ref(), &ui.election).await;
    answer(StatusCode::OK, json!(rows))
}

/// The schedules pane: every schedule with its ticks, read when asked (a tick enqueues a
/// task, which the live feed announces, so the page asks again then).
async fn schedules(State(ui): State<Arc<Ui>>, _: Reader) -> Response {
    let rows = data::schedules(ui.coord.as_ref(), &ui.queue, chrono::Utc::now()).await;
    answer(StatusCode::OK, json!(rows))
}

/// The live feed: the overview at once, then on every new reading, until the page goes
/// or the process stops.
async fn events(State(ui): State<Arc<Ui>>, _: Reader) -> Response {
    ui.ensure_watching();
    let mut receiver = ui.panes.subscribe();
    if receiver.borrow().overview.seq > 0 {
        receiver.mark_changed();
    }
    let stop = ui.stop.clone();
    let feed = futures_util::stream::unfold((receiver, stop), |(mut receiver, stop)| async move {
        tokio::select! {
            _ = stop.cancelled() => None,
            changed = receiver.changed() => {
                changed.ok()?;
                let overview = serde_json::to_string(&receiver.borrow_and_update().overview).ok()?;
                let event = Event::default().event("overview").data(overview);
                Some((Ok::<Event, Infallible>(event), (receiver, stop)))
            }
        }
    });
    Sse::new(feed)
        .keep_alive(KeepAlive::default())
        .into_response()
}

/// An action's body: `{"key": ...}` or `{"taskType": ...}` or `{"token": ...}` or
/// `{"name": ...}` (a schedule's).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Action {
    key: Option<String>,
    name: Option<String>,
    #[serde(rename = "taskType")]
    task_type: Option<String>,
    token: Option<String>,
}

/// The key an action names, which must be a valid key under `prefix`.
fn key_under(action: &Action, prefix: &str) -> Result<String, Refused> {
    let key = action
        .key
        .as_deref()
        .ok_or_else(|| Refused(StatusCode::BAD_REQUEST, "no key given".into()))?;
    Key::within(key, &[prefix])
        .map(String::from)
        .map_err(|reason| {
            Refused(
                StatusCode::BAD_REQUEST,
                format!("{key:?} is not a key under {prefix}: {reason}"),
            )
        })
}

/// After an action: read again now, so every page shows its effect.
fn done(ui: &Ui, body: Value) -> Response {
    ui.refresh.notify_one();
    answer(StatusCode::OK, body)
}

/// Keeps the admin token in a cookie once the operator typed it, if it is the right one.
async fn login(State(ui): State<Arc<Ui>>, headers: HeaderMap, body: Bytes) -> Response {
    if let Err(why) = auth::check_csrf(&headers, &ui.csrf) {
        return refusal(why);
    }
    let given: Action = serde_json::from_slice(&body).unwrap_or_default();
    let (Some(expected), Some(given)) = (ui.token.as_deref(), given.token.as_deref()) else {
        return refusal(auth::Refusal::Token);
    };
    if !auth::same(given, expected) {
        return refused(
            StatusCode::UNAUTHORIZED,
            "that is not the dashboard's token (observe.admin_token); try again",
        );
    }
    let mut response = answer(StatusCode::OK, json!({ "ok": true }));
    let cookie = format!(
        "{}={given}; Path=/ui; HttpOnly; SameSite=Strict",
        auth::TOKEN_COOKIE
    );
    if let Ok(value) = header::HeaderValue::from_str(&cookie) {
        response.headers_mut().insert(header::SET_COOKIE, value);
    }
    response
}

async fn retry(State(ui): State<Arc<Ui>>, Admin(action): Admin) -> Response {
    let key = match key_under(&action, &ui.queue.dead_prefix) {
        Ok(key) => key,
        Err(refused) => return refused.into_response(),
    };
    match dead::retry(ui.coord.as_ref(), &ui.queue, &key).await {
        Ok(requeued) => done(&ui, json!({ "requeued": requeued })),
        Err(err) => operate_failure(err),
    }
}

async fn retry_all(State(ui): State<Arc<Ui>>, Admin(action): Admin) -> Response {
    if let Some(task_type) = &action.task_type {
        if let Err(reason) = crate::task::key::check_id(task_type) {
            return refused(
                StatusCode::BAD_REQUEST,
                &format!("{task_type:?} is not a taskType: {reason}"),
            );
        }
    }
    match data::retry_all(ui.coord.as_ref(), &ui.queue, action.task_type.as_deref()).await {
        Ok((requeued, errors)) => done(&ui, json!({ "requeued": requeued, "errors": errors })),
        Err(err) => operate_failure(err),
    }
}

async fn delete(State(ui): State<Arc<Ui>>, Admin(action): Admin) -> Response {
    let key = match key_under(&action, &ui.queue.dead_prefix) {
        Ok(key) => key,
        Err(refused) => return refused.into_response(),
    };
    match data::delete(ui.coord.as_ref(), &ui.queue, &key).await {
        Ok(()) => done(&ui, json!({ "deleted": key })),
        Err(err) => operate_failure(err),
    }
}

async fn cancel(State(ui): State<Arc<Ui>>, Admin(action): Admin) -> Response {
    let key = match key_under(&action, &ui.queue.prefix) {
        Ok(key) => key,
        Err(refused) => return refused.into_response(),
    };
    match data::cancel(ui.coord.as_ref(), &ui.queue, &key).await {
        Ok(what) => done(&ui, json!({ "cancelled": key, "what": what })),
        Err(reason) => refused(StatusCode::CONFLICT, &reason),
    }
}

async fn pause(State(ui): State<Arc<Ui>>, _: Admin) -> Response {
    match status::pause(ui.coord.as_ref(), &ui.queue).await {
        Ok(was) => done(&ui, json!({ "paused": true, "already": was })),
        Err(err) => operate_failure(err),
    }
}

async fn resume(State(ui): State<Arc<Ui>>, _: Admin) -> Response {
    match status::resume(ui.coord.as_ref(), &ui.queue).await {
        Ok(was) => done(&ui, json!({ "paused": false, "was_paused": was })),
        Err(err) => operate_failure(err),
    }
}

async fn type_pause(State(ui): State<Arc<Ui>>, Admin(action): Admin) -> Response {
    set_type_paused(&ui, action, true).await
}

async fn type_resume(State(ui): State<Arc<Ui>>, Admin(action): Admin) -> Response {
    set_type_paused(&ui, action, false).await
}

/// `leaderq pause|resume --type T` from the type table; the type becomes a key segment and
/// is checked (`queue::paused_type_key`) before the coordinator is asked.
async fn set_type_paused(ui: &Ui, action: Action, paused: bool) -> Response {
    let Some(name) = action.name else {
        return refused(StatusCode::BAD_REQUEST, "no task type given");
    };
    if let Err(reason) = crate::queue::paused_type_key(&ui.queue.prefix, &name) {
        return refused(
            StatusCode::BAD_REQUEST,
            &format!("{name:?} cannot be paused on its own: {reason}"),
        );
    }
    let coord = ui.coord.as_ref();
    let changed = if paused {
        status::pause_type(coord, &ui.queue, &name)
            .await
            .map(|was| !was)
    } else {
        status::resume_type(coord, &ui.queue, &name).await
    };
    match changed {
        Ok(changed) => done(
            ui,
            json!({ "type": name, "paused": paused, "changed": changed }),
        ),
        Err(err) => operate_failure(err),
    }
}

async fn schedule_pause(State(ui): State<Arc<Ui>>, Admin(action): Admin) -> Response {
    set_schedule_paused(&ui, action, true).await
}

async fn schedule_resume(State(ui): State<Arc<Ui>>, Admin(action): Admin) -> Response {
    set_schedule_paused(&ui, action, false).await
}

async fn set_schedule_paused(ui: &Ui, action: Action, paused: bool) -> Response {
    let Some(name) = action.name else {
        return refused(StatusCode::BAD_REQUEST, "no schedule name given");
    };
    // The name becomes a key segment: checked before the coordinator is asked.
    if let Err(reason) = crate::task::key::check_id(&name) {
        return refused(
            StatusCode::BAD_REQUEST,
            &format!("{name:?} is not a schedule name: {reason}"),
        );
    }
    match data::set_schedule_paused(ui.coord.as_ref(), &ui.queue, &name, paused).await {
        Ok(changed) => done(
            ui,
            json!({ "name": name, "paused": paused, "changed": changed }),
        ),
        Err(err) => schedules_failure(err),
    }
}

/// Binds `listen` for a dashboard, after checking that it may serve there.
pub async fn bind(
    listen: SocketAddr,
    observe: &ObserveSettings,
) -> Result<tokio::net::TcpListener, UiError> {
    auth::check_listen(listen, observe.admin_token()).map_err(UiError::Settings)?;
    tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| UiError::Bind {
            listen,
            reason: e.to_string(),
        })
}

/// Serves the dashboard alone on `listener` (`leaderq ui`, `leaderq dev`) over `coord`,
/// the configured coordinator, until `shutdown`.
pub async fn serve(
    coord: Arc<dyn Coordinator>,
    settings: UiSettings,
    listener: tokio::net::TcpListener,
    shutdown: CancellationToken,
) -> Result<(), UiError> {
    let tracker = TaskTracker::new();
    let ui = Ui::new(coord, settings, shutdown.clone(), tracker.clone());
    let served = axum::serve(listener, router(ui))
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await;
    tracker.close();
    tracker.wait().await;
    served.map_err(UiError::Serve)
}
