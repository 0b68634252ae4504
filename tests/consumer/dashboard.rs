//! The web dashboard (`/ui/` on a replica's observe listener) in a real browser: Debian's
//! chromium driven over the W3C WebDriver protocol by chromedriver, through the small client
//! below (plain JSON over HTTP: new session, navigate, find, click, text). A missing
//! chromium or chromedriver skips the test, or fails it under LEADERQ_REQUIRE_SERVERS.
//! Also, over plain HTTP: the actions' CSRF and token checks, and `leaderq ui` refusing an
//! address off loopback without `observe.admin_token`.

use std::path::Path;
use std::process::{Command, Stdio};

use testkit::harness::{self, Proc};

use super::*;

/// The W3C name of an element reference in WebDriver answers.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// A headless chromium under chromedriver; chromedriver (and the browser, in its process
/// group) is killed when dropped.
struct Browser {
    http: reqwest::Client,
    base: String,
    _driver: Proc,
}

impl Browser {
    /// chromium and chromedriver, if installed (else the test skips, or fails in CI).
    fn installed() -> Option<(std::path::PathBuf, std::path::PathBuf)> {
        let install = "the Debian packages chromium and chromium-driver";
        let driver = harness::external(&["chromedriver", "/usr/bin/chromedriver"], install)?;
        let chromium = harness::external(&["chromium", "/usr/bin/chromium"], install)?;
        Some((driver, chromium))
    }

    /// Starts chromedriver on a free port and opens a headless session.
    async fn start(driver: &Path, chromium: &Path, log: &Path) -> Browser {
        let port = harness::free_port();
        let mut command = Command::new(driver);
        command
            .arg(format!("--port={port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log).unwrap());
        let driver = Proc::spawn("chromedriver", command).unwrap();
        let http = client();
        let base = format!("http://127.0.0.1:{port}");
        wait_until(
            Duration::from_secs(20),
            "chromedriver started",
            async || {
                if let Ok(answer) = http.get(format!("{base}/status")).send().await {
                    let status: Value = answer.json().await.unwrap_or_default();
                    if status["value"]["ready"] == true {
                        return Ok(());
                    }
                }
                Err(std::fs::read_to_string(log).unwrap_or_default())
            },
        )
        .await;
        let mut browser = Browser {
            http,
            base,
            _driver: driver,
        };
        // Root in a container needs --no-sandbox; /dev/shm is often small there.
        let session = browser
            .command(
                "POST",
                "/session",
                json!({"capabilities": {"alwaysMatch": {
                    "browserName": "chrome",
                    "goog:chromeOptions": {
                        "binary": chromium,
                        "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                                 "--disable-dev-shm-usage", "--window-size=1280,900"],
                    },
                }}}),
            )
            .await;
        let id = session["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session: {session}"));
        browser.base = format!("{}/session/{id}", browser.base);
        browser
    }

    /// One WebDriver command; its `value`. Panics on a WebDriver error.
    async fn command(&self, method: &str, path: &str, body: Value) -> Value {
        self.try_command(method, path, body)
            .await
            .unwrap_or_else(|(error, message)| {
                panic!("webdriver {method} {path}: {error}: {message}")
            })
    }

    /// One WebDriver command; its `value`, or the WebDriver error and its message.
    async fn try_command(
        &self,
        method: &str,
        path: &str,
        body: Value,
    ) -> Result<Value, (Value, Value)> {
        let url = format!("{}{path}", self.base);
        let request = match method {
            "GET" => self.http.get(&url),
            "DELETE" => self.http.delete(&url),
            _ => self.http.post(&url).json(&body),
        };
        let answer: Value = request.send().await.unwrap().json().await.unwrap();
        let value = answer["value"].clone();
        match value.get("error") {
            Some(error) => Err((error.clone(), value["message"].clone())),
            None => Ok(value),
        }
    }

    async fn goto(&self, url: &str) {
        self.command("POST", "/url", json!({ "url": url })).await;
    }

    /// The elements matching a CSS selector now.
    async fn find_all(&self, css: &str) -> Vec<String> {
        let found = self
            .command(
                "POST",
                "/elements",
                json!({"using": "css selector", "value": css}),
            )
            .await;
        found
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                e[ELEMENT]
                    .as_str()
                    .unwrap_or_else(|| panic!("not an element: {e}"))
                    .to_string()
            })
            .collect()
    }

    /// The visible text of the first element matching `css`, `None` if there is none (or
    /// the page replaced it between finding and reading, as a pane re-rendered does).
    async fn text(&self, css: &str) -> Option<String> {
        let element = self.find_all(css).await.into_iter().next()?;
        let text = match self
            .try_command("GET", &format!("/element/{element}/text"), Value::Null)
            .await
        {
            Ok(text) => text,
            Err((error, _)) if error == "stale element reference" => return None,
            Err((error, message)) => panic!("webdriver text of {css}: {error}: {message}"),
        };
        Some(text.as_str().unwrap_or_default().to_string())
    }

    /// Clicks the first element matching `css`, found again if the page replaced it
    /// between finding and clicking.
    async fn click(&self, css: &str) {
        wait_until(
            Duration::from_secs(5),
            &format!("a click at {css}"),
            async || {
                let element = self
                    .find_all(css)
                    .await
                    .into_iter()
                    .next()
                    .unwrap_or_else(|| panic!("nothing to click at {css}"));
                match self
                    .try_command("POST", &format!("/element/{element}/click"), json!({}))
                    .await
                {
                    Ok(_) => Ok(()),
                    Err((error, message)) if error == "stale element reference" => {
                        Err(format!("{error}: {message}"))
                    }
                    Err((error, message)) => panic!("webdriver click at {css}: {error}: {message}"),
                }
            },
        )
        .await
    }

    /// Replaces the text in the first element matching `css` with `text`, typed.
    async fn type_text(&self, css: &str, text: &str) {
        let element = self
            .find_all(css)
            .await
            .into_iter()
            .next()
            .unwrap_or_else(|| panic!("nothing to type into at {css}"));
        self.command("POST", &format!("/element/{element}/clear"), json!({}))
            .await;
        self.command(
            "POST",
            &format!("/element/{element}/value"),
            json!({ "text": text }),
        )
        .await;
    }

    /// Waits until the text at `css` satisfies `wanted`; panics with the page's text after
    /// `limit`.
    async fn wait_text(&self, css: &str, limit: Duration, wanted: impl Fn(&str) -> bool) {
        wait_until(
            limit,
            &format!("{css} showing what was expected"),
            async || match self.text(css).await {
                Some(text) if wanted(&text) => Ok(()),
                _ => Err(format!(
                    "the page:\n{}",
                    self.text("body").await.unwrap_or_default()
                )),
            },
        )
        .await
    }

    /// The page's address now.
    async fn url(&self) -> String {
        let url = self.command("GET", "/url", Value::Null).await;
        url.as_str().unwrap_or_default().to_string()
    }

    /// Accepts the page's `confirm()` dialog, once it shows.
    async fn accept_dialog(&self) {
        wait_until(Duration::from_secs(5), "a dialog to accept", async || {
            self.try_command("POST", "/alert/accept", json!({})).await
        })
        .await;
    }

    /// The browser's back button.
    async fn back(&self) {
        self.command("POST", "/back", json!({})).await;
    }

    /// A screenshot of the page as PNG, written to `path`; checked non-empty.
    async fn screenshot(&self, path: &Path) {
        use base64::Engine;
        let png = self.command("GET", "/screenshot", Value::Null).await;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(png.as_str().unwrap_or_default())
            .unwrap();
        assert!(
            bytes.len() > 1000,
            "an empty screenshot of {}",
            path.display()
        );
        std::fs::write(path, bytes).unwrap();
        println!("screenshot: {}", path.display());
    }

    async fn quit(self) {
        let _ = self.http.delete(&self.base).send().await;
    }
}

/// The dashboard in a real browser: the overview names the leader; a task whose handler
/// fails lands in the dead letters with its reason; a click on retry moves it back to the
/// queue, where it runs (its handler fixed meanwhile) and leaves the dead letters; the
/// page follows each change live, without a reload.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_shows_the_leader_and_retries_a_dead_letter_by_click() {
    let Some((driver, chromium)) = Browser::installed() else {
        return;
    };
    let mut bed = Bed::new();
    bed.start_replica("r1");
    let leader = bed.leader(Duration::from_secs(30)).await;
    let observe = observe_address(&bed.replicas[0]).await;
    let browser =
        Browser::start(&driver, &chromium, &bed.dir.path().join("chromedriver.log")).await;
    browser.goto(&format!("http://{observe}/ui/")).await;
    browser
        .wait_text("#leader-node", Duration::from_secs(10), |t| t == leader)
        .await;

    // Fails three times (max_attempts), then is a dead letter; the page is not reloaded.
    bed.put_task(
        "task_x",
        json!({"taskId": "x", "taskTime": 1, "taskType": "Flaky"}),
    )
    .await;
    browser.click("#tab-dead").await;
    let row = "#dead-rows tr[data-key='oracleTaskDead/task_x']";
    browser
        .wait_text(row, Duration::from_secs(20), |t| {
            t.contains("failed 3 times")
        })
        .await;
    browser
        .wait_text("#dead-badge", Duration::from_secs(5), |t| t == "1")
        .await;

    std::fs::write(format!("{}.fixed", bed.journal.display()), "").unwrap();
    browser
        .click(&format!("{row} button[data-action='retry']"))
        .await;
    let ran = bed
        .wait_for_line(Duration::from_secs(10), |l| l[0] == "run" && l[1] == "x")
        .await;
    assert_eq!(
        ran[4], "1",
        "a retried dead letter starts again at attempt 1"
    );
    wait_until(
        Duration::from_secs(5),
        "the retried task leaves the dead letters pane",
        async || match browser.find_all(row).await {
            rows if rows.is_empty() => Ok(()),
            rows => Err(rows),
        },
    )
    .await;
    browser
        .wait_text("#dead-badge", Duration::from_secs(5), str::is_empty)
        .await;
    browser.click("#tab-overview").await;
    browser
        .wait_text("#dead-count", Duration::from_secs(5), |t| t == "0")
        .await;
    // The run that completed is in the history, with the replica that ran it.
    browser.click("#tab-history").await;
    browser
        .wait_text("#history", Duration::from_secs(5), |t| {
            t.lines().any(|line| {
                line.contains("oracleTask/task_x")
                    && line.contains("completed")
                    && line.contains(&leader)
            })
        })
        .await;
    // And the leadership timeline names the leader's term.
    browser.click("#tab-timeline").await;
    browser
        .wait_text("#timeline", Duration::from_secs(5), |t| {
            t.lines()
                .any(|line| line.contains(&leader) && line.contains("first"))
        })
        .await;
    browser.quit().await;
}

/// A schedule applied with `leaderq schedules apply` shows in the Schedules pane with how
/// often it fires, its state and its next tick; a click on its pause button pauses it (the
/// pane and `leaderq schedules list` say so) and a click on resume brings it back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_shows_a_schedule_and_pauses_it_by_click() {
    let Some((driver, chromium)) = Browser::installed() else {
        return;
    };
    let mut bed = Bed::new();
    bed.start_replica("s1");
    bed.leader(Duration::from_secs(30)).await;
    let file = bed.dir.path().join("schedules.toml");
    std::fs::write(
        &file,
        "[[schedule]]\nname = \"hourly\"\nevery = \"1h\"\ntask_type = \"Report\"\n",
    )
    .unwrap();
    let applied = leaderq(&bed, &["schedules", "apply", file.to_str().unwrap()]);
    assert!(
        applied.status.success(),
        "{}",
        String::from_utf8_lossy(&applied.stderr)
    );
    let observe = observe_address(&bed.replicas[0]).await;
    let browser =
        Browser::start(&driver, &chromium, &bed.dir.path().join("chromedriver.log")).await;
    browser.goto(&format!("http://{observe}/ui/")).await;
    browser.click("#tab-schedules").await;
    let row = "#schedule-rows tr[data-name='hourly']";
    browser
        .wait_text(row, Duration::from_secs(10), |t| {
            t.contains("every 1h")
                && t.contains("(UTC)")
                && t.contains("Report")
                && t.contains("active")
        })
        .await;
    browser
        .wait_text(&format!("{row} td.next"), Duration::from_secs(5), |t| {
            t.starts_with("in ")
        })
        .await;

    browser
        .click(&format!("{row} button[data-action='schedule-pause']"))
        .await;
    browser
        .wait_text(&format!("{row} td.state"), Duration::from_secs(5), |t| {
            t == "paused"
        })
        .await;
    browser
        .wait_text(&format!("{row} td.next"), Duration::from_secs(5), |t| {
            t == "–"
        })
        .await;
    let listed = leaderq(&bed, &["schedules", "list"]);
    let listed = String::from_utf8_lossy(&listed.stdout);
    assert!(
        listed
            .lines()
            .any(|line| line.starts_with("hourly") && line.contains("paused")),
        "{listed}"
    );

    browser
        .click(&format!("{row} button[data-action='schedule-resume']"))
        .await;
    browser
        .wait_text(&format!("{row} td.state"), Duration::from_secs(5), |t| {
            t == "active"
        })
        .await;
    browser.quit().await;
}

/// The overview's type table pauses a type by click: the row says paused, `leaderq status`
/// names the type (the flag is the coordinator's, the same `leaderq pause --type` sets),
/// and a click on resume clears both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_pauses_and_resumes_a_task_type_by_click() {
    let Some((driver, chromium)) = Browser::installed() else {
        return;
    };
    let mut bed = Bed::new();
    bed.start_replica("t1");
    bed.leader(Duration::from_secs(30)).await;
    // Due in an hour: it waits in the queue, so its type is listed.
    let run_at = chrono::Utc::now().timestamp() + 3600;
    bed.put_task(
        "task_later",
        json!({"taskId": "later", "taskTime": 1, "taskType": "Report", "runAt": run_at}),
    )
    .await;
    let observe = observe_address(&bed.replicas[0]).await;
    let browser =
        Browser::start(&driver, &chromium, &bed.dir.path().join("chromedriver.log")).await;
    browser.goto(&format!("http://{observe}/ui/")).await;
    let row = "#type-rows tr[data-type='Report']";
    browser
        .wait_text(row, Duration::from_secs(10), |t| t.contains("Pause"))
        .await;
    browser
        .click(&format!("{row} button[data-action='type-pause']"))
        .await;
    browser
        .wait_text(&format!("{row} td.state"), Duration::from_secs(5), |t| {
            t == "paused"
        })
        .await;
    let status = leaderq(&bed, &["status"]);
    let status = String::from_utf8_lossy(&status.stdout);
    assert!(status.contains("paused types:  Report"), "{status}");
    browser
        .screenshot(&screenshots().join("type-paused.png"))
        .await;

    browser
        .click(&format!("{row} button[data-action='type-resume']"))
        .await;
    browser
        .wait_text(&format!("{row} td.state"), Duration::from_secs(5), |t| {
            t.is_empty()
        })
        .await;
    let status = leaderq(&bed, &["status"]);
    let status = String::from_utf8_lossy(&status.stdout);
    assert!(!status.contains("paused types"), "{status}");
    browser.quit().await;
}

/// `leaderq ui` with a token, in a real browser: the page asks for the token, refuses a
/// wrong one, and with the right one shows the leader and follows the queue live.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_asks_for_its_token_in_the_browser() {
    let Some((driver, chromium)) = Browser::installed() else {
        return;
    };
    let mut bed = Bed::new();
    bed.start_replica("t1");
    let leader = bed.leader(Duration::from_secs(30)).await;
    let (_ui, address) = start_ui_with(&[("CONSUL_HTTP_ADDR".into(), bed.cluster.addr.clone())]);
    let browser =
        Browser::start(&driver, &chromium, &bed.dir.path().join("chromedriver.log")).await;
    browser.goto(&format!("http://{address}/ui/")).await;
    browser
        .wait_text("#login", Duration::from_secs(10), |t| t.contains("token"))
        .await;
    browser
        .type_text("#login-token", "not-the-token-at-all")
        .await;
    browser.click("#login button").await;
    browser
        .wait_text("#message", Duration::from_secs(5), |t| {
            t.contains("not the dashboard's token")
        })
        .await;
    assert_eq!(browser.text("#leader-node").await.as_deref(), Some("–"));
    browser.type_text("#login-token", TOKEN).await;
    browser.click("#login button").await;
    browser
        .wait_text("#leader-node", Duration::from_secs(10), |t| t == leader)
        .await;
    bed.put_task(
        "task_t",
        json!({"taskId": "t", "taskTime": 1, "taskType": "Slow"}),
    )
    .await;
    browser
        .wait_text("#running-rows", Duration::from_secs(10), |t| {
            t.contains("oracleTask/task_t")
        })
        .await;
    browser.quit().await;
}

/// An action without the page's CSRF token, or from another origin, is refused (403) and
/// changes nothing; with both, the same POST is done. Without a token, a request naming
/// another host than loopback (DNS rebinding) is refused too.
#[tokio::test]
async fn dashboard_actions_need_the_csrf_token_and_the_same_origin() {
    let mut bed = Bed::new();
    bed.start_replica("c1");
    bed.leader(Duration::from_secs(30)).await;
    let observe = observe_address(&bed.replicas[0]).await;
    let page = client()
        .get(format!("http://{observe}/ui/"))
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), 200);
    let cookie = page
        .headers()
        .get("set-cookie")
        .expect("the page sets the CSRF cookie")
        .to_str()
        .unwrap()
        .to_string();
    assert!(cookie.contains("SameSite=Strict"), "{cookie}");
    let token = cookie
        .split(';')
        .next()
        .unwrap()
        .split_once('=')
        .unwrap()
        .1
        .to_string();
    let pause = |token: Option<&str>, origin: &str| {
        let mut request = client()
            .post(format!("http://{observe}/ui/api/pause"))
            .header("Origin", origin)
            .header("Cookie", format!("leaderq_csrf={}", token.unwrap_or("x")));
        if let Some(token) = token {
            request = request.header("X-CSRF-Token", token);
        }
        request.send()
    };
    let own = format!("http://{observe}");
    assert_eq!(pause(None, &own).await.unwrap().status(), 403);
    // A schedule's pause is an action like the others; its name is checked before use.
    let schedule_pause = |token: Option<&str>, name: &str| {
        let mut request = client()
            .post(format!("http://{observe}/ui/api/schedule-pause"))
            .header("Origin", format!("http://{observe}"))
            .header("Cookie", format!("leaderq_csrf={}", token.unwrap_or("x")))
            .json(&json!({ "name": name }));
        if let Some(token) = token {
            request = request.header("X-CSRF-Token", token);
        }
        request.send()
    };
    assert_eq!(schedule_pause(None, "nightly").await.unwrap().status(), 403);
    assert_eq!(
        schedule_pause(Some(&token), "../nightly")
            .await
            .unwrap()
            .status(),
        400
    );
    assert_eq!(
        schedule_pause(Some(&token), "nightly")
            .await
            .unwrap()
            .status(),
        404
    );
    // A task type is paused and resumed from the type table the same way; its name is
    // checked before it becomes a key.
    let type_action = |action: &str, token: Option<&str>, name: &str| {
        let mut request = client()
            .post(format!("http://{observe}/ui/api/{action}"))
            .header("Origin", format!("http://{observe}"))
            .header("Cookie", format!("leaderq_csrf={}", token.unwrap_or("x")))
            .json(&json!({ "name": name }));
        if let Some(token) = token {
            request = request.header("X-CSRF-Token", token);
        }
        request.send()
    };
    assert_eq!(
        type_action("type-pause", None, "Report")
            .await
            .unwrap()
            .status(),
        403
    );
    let hostile = type_action("type-pause", Some(&token), "../Report");
    assert_eq!(hostile.await.unwrap().status(), 400);
    let paused = type_action("type-pause", Some(&token), "Report");
    assert_eq!(paused.await.unwrap().status(), 200);
    let status = leaderq(&bed, &["status"]);
    let said = String::from_utf8_lossy(&status.stdout).to_string();
    assert!(said.contains("paused types:  Report"), "{said}");
    wait_until(
        Duration::from_secs(10),
        "the type table listing Report paused",
        async || {
            let overview: serde_json::Value = client()
                .get(format!("http://{observe}/ui/api/overview"))
                .send()
                .await
                .map_err(|e| e.to_string())?
                .json()
                .await
                .map_err(|e| e.to_string())?;
            let listed = overview["types"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|t| t["task_type"] == "Report" && t["paused"] == true);
            if listed {
                Ok(())
            } else {
                Err(overview.to_string())
            }
        },
    )
    .await;
    let resumed = type_action("type-resume", Some(&token), "Report");
    assert_eq!(resumed.await.unwrap().status(), 200);
    let status = leaderq(&bed, &["status"]);
    let said = String::from_utf8_lossy(&status.stdout).to_string();
    assert!(!said.contains("paused types:"), "{said}");
    assert_eq!(
        pause(Some(&token), "http://evil.example")
            .await
            .unwrap()
            .status(),
        403
    );
    // Another name for this address (DNS rebinding) gets neither the page nor the data.
    for path in ["/ui/", "/ui/api/overview"] {
        let rebound = client()
            .get(format!("http://{observe}{path}"))
            .header("Host", "evil.example")
            .send()
            .await
            .unwrap();
        assert_eq!(rebound.status(), 403, "{path}");
    }
    let status = leaderq(&bed, &["status"]);
    assert!(!String::from_utf8_lossy(&status.stdout).contains("paused:"));
    assert_eq!(pause(Some(&token), &own).await.unwrap().status(), 200);
    let status = leaderq(&bed, &["status"]);
    assert!(String::from_utf8_lossy(&status.stdout).contains("paused:        yes"));
}

/// `leaderq ui` on an address that is not loopback refuses to start without
/// `observe.admin_token`, naming the setting.
#[test]
fn ui_off_loopback_refuses_to_start_without_a_token() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_leaderq"))
        .args(["ui", "--listen", "0.0.0.0:0"])
        .env("CONSUL_HTTP_ADDR", "127.0.0.1:1")
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("observe.admin_token") && stderr.contains("LEADERQ__OBSERVE__ADMIN_TOKEN"),
        "{stderr}"
    );
}

on_every_backend! {
    /// `leaderq ui` on this backend: its token guards reads, its CSRF token guards
    /// actions, and a task a producer writes reaches an open live feed within a second.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    fn standalone_ui_needs_its_token_and_shows_a_new_task_live => standalone_ui();
}

const TOKEN: &str = "test-token-0123456789abcdef";

/// Longer than the interval at which the dashboard's watcher reads at most (250 ms).
const QUIET_SPELL: Duration = Duration::from_millis(300);

/// `leaderq ui --listen 127.0.0.1:0` against `cluster`, with [`TOKEN`]; its address.
fn start_ui(cluster: &dyn harness::Cluster) -> (Proc, String) {
    start_ui_with(&cluster.env())
}

/// `leaderq ui --listen 127.0.0.1:0` with `env` and [`TOKEN`]; its address.
fn start_ui_with(env: &[(String, String)]) -> (Proc, String) {
    let mut command = Command::new(common::exe());
    command
        .args(["ui", "--listen", "127.0.0.1:0"])
        .envs(env.iter().map(|(k, v)| (k, v)))
        .env("LEADERQ__OBSERVE__ADMIN_TOKEN", TOKEN)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    let mut ui = Proc::spawn("leaderq ui", command).unwrap();
    let stdout = ui.child().stdout.take().unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line).unwrap();
    let address = line
        .trim()
        .strip_prefix("dashboard: http://")
        .and_then(|rest| rest.strip_suffix("/ui/"))
        .unwrap_or_else(|| panic!("no dashboard line: {line:?}"))
        .to_string();
    (ui, address)
}

/// The next overview on a live feed (skipping keep-alive comments), within `limit`.
async fn next_overview(
    feed: &mut reqwest::Response,
    buffer: &mut String,
    limit: Duration,
) -> Value {
    let started = Instant::now();
    loop {
        if let Some(end) = buffer.find("\n\n") {
            let event: String = buffer.drain(..end + 2).collect();
            if let Some(data) = event.lines().find_map(|l| l.strip_prefix("data: ")) {
                return serde_json::from_str(data).unwrap();
            }
            continue;
        }
        let left = limit.saturating_sub(started.elapsed());
        let chunk = tokio::time::timeout(left, feed.chunk())
            .await
            .unwrap_or_else(|_| panic!("no overview within {limit:?}"))
            .unwrap()
            .expect("the feed stays open");
        buffer.push_str(&String::from_utf8_lossy(&chunk));
    }
}

async fn standalone_ui(backend: &str) {
    let dir = tempfile::tempdir().unwrap();
    let Some(cluster) = common::start_cluster(backend, dir.path()) else {
        return;
    };
    let (_ui, address) = start_ui(cluster.as_ref());
    let url = |path: &str| format!("http://{address}{path}");
    let bearer = format!("Bearer {TOKEN}");

    // With a token, any name may be used: the token is what guards.
    let by_name = client()
        .get(url("/ui/api/overview"))
        .header("Authorization", &bearer)
        .header("Host", "dashboard.example")
        .send()
        .await
        .unwrap();
    assert_eq!(by_name.status(), 200);
    // Reads need the token; the page itself does not (it asks for it).
    for path in ["/ui/api/overview", "/ui/api/schedules"] {
        let anonymous = client().get(url(path)).send().await.unwrap();
        assert_eq!(anonymous.status(), 401, "{path}");
    }
    let schedules: Value = client()
        .get(url("/ui/api/schedules"))
        .header("Authorization", &bearer)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(schedules, json!({"recorded": "yes", "rows": []}));
    let wrong = client()
        .get(url("/ui/api/overview"))
        .header("Authorization", "Bearer test-token-0123456789abcdeX")
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status(), 401);
    let page = client().get(url("/ui/")).send().await.unwrap();
    assert_eq!(page.status(), 200);
    let csrf = page.headers()["set-cookie"].to_str().unwrap().to_string();
    let csrf = csrf
        .split(';')
        .next()
        .unwrap()
        .split_once('=')
        .unwrap()
        .1
        .to_string();

    let mut feed = client()
        .get(url("/ui/api/events"))
        .header("Authorization", &bearer)
        .send()
        .await
        .unwrap();
    assert_eq!(feed.status(), 200);
    let mut buffer = String::new();
    let first = next_overview(&mut feed, &mut buffer, Duration::from_secs(10)).await;
    assert_eq!(first["status"]["pending"], 0, "{first}");
    assert_eq!(first["leader"], Value::Null, "{first}");

    // After a quiet spell (the watcher reads at most every 250 ms), a change is read at once:
    // the wait is the rate limit's, which nothing outside the dashboard shows.
    tokio::time::sleep(QUIET_SPELL).await;
    let task = json!({"taskId": "live", "taskTime": 1, "taskType": "Work"}).to_string();
    let written = Instant::now();
    cluster
        .produce("oracleTask/task_live", task.as_bytes())
        .unwrap();
    let seen = loop {
        let overview = next_overview(&mut feed, &mut buffer, Duration::from_secs(5)).await;
        if overview["status"]["pending"] == 1 {
            break written.elapsed();
        }
    };
    eprintln!("{backend}: a new task reached the live feed in {seen:?}");
    assert!(seen < Duration::from_secs(1), "{backend}: {seen:?}");
    let queue: Value = client()
        .get(url("/ui/api/queue?q=liv&type=Work"))
        .header("Authorization", &bearer)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(queue["total"], 1, "{queue}");
    assert_eq!(queue["rows"][0]["key"], "oracleTask/task_live", "{queue}");
    assert_eq!(queue["rows"][0]["id"], "live", "{queue}");

    // An action needs the token and the CSRF token; with both, pause shows live.
    let pause = |with_csrf: bool| {
        let mut request = client()
            .post(url("/ui/api/pause"))
            .header("Authorization", &bearer);
        if with_csrf {
            request = request
                .header("Cookie", format!("leaderq_csrf={csrf}"))
                .header("X-CSRF-Token", &csrf);
        }
        request.send()
    };
    assert_eq!(pause(false).await.unwrap().status(), 403);
    assert_eq!(pause(true).await.unwrap().status(), 200);
    loop {
        let overview = next_overview(&mut feed, &mut buffer, Duration::from_secs(5)).await;
        if overview["status"]["paused"] == true {
            break;
        }
    }
    // A key outside the dead-letter prefix is refused before the coordinator is asked.
    let bad = client()
        .post(url("/ui/api/delete"))
        .header("Authorization", &bearer)
        .header("Cookie", format!("leaderq_csrf={csrf}"))
        .header("X-CSRF-Token", &csrf)
        .json(&json!({"key": "oracleTask/../consumerLeader"}))
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);
}

/// Where the browser tests leave their screenshots for a reviewer: a directory under the
/// system's temp dir that outlives the test.
fn screenshots() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join("leaderq-dashboard-screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The "done when", in a real browser: a task whose handler fails (a line on its
/// stderr each time) is followed from the overview's link to its page, which shows every
/// attempt with its error and its kept stderr, its state and its value; the page's address
/// opened in a fresh browser session lands on the same view; a click on retry there
/// requeues it (the handler fixed meanwhile) and the page follows it to completed, the
/// earlier attempts kept; the back button returns to the dead letter's address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_task_page_shows_each_attempt_and_retries_it_there() {
    let Some((driver, chromium)) = Browser::installed() else {
        return;
    };
    let mut bed = Bed::new();
    let fixed = format!("{}.loud-fixed", bed.journal.display());
    bed.settings = bed.settings.clone().handler(
        "Loud",
        &format!(
            "test -f {fixed} && exit 0; echo \"disk full on attempt $LEADERQ_ATTEMPT\" >&2; exit 1"
        ),
    );
    bed.start_replica("r1");
    let leader = bed.leader(Duration::from_secs(30)).await;
    let observe = observe_address(&bed.replicas[0]).await;
    let browser =
        Browser::start(&driver, &chromium, &bed.dir.path().join("chromedriver.log")).await;
    browser.goto(&format!("http://{observe}/ui/")).await;
    browser
        .wait_text("#leader-node", Duration::from_secs(10), |t| t == leader)
        .await;
    bed.put_task(
        "task_loud",
        json!({"taskId": "loud", "taskTime": 1, "taskType": "Loud", "taskPara": {"disk": "/data"}}),
    )
    .await;

    // Overview → its link → the task page.
    let link = "#recent-dead tr[data-key='oracleTaskDead/task_loud'] a.task-link";
    browser
        .wait_text(link, Duration::from_secs(20), |t| {
            t == "oracleTaskDead/task_loud"
        })
        .await;
    browser
        .wait_text(
            "#type-rows tr[data-type='Loud']",
            Duration::from_secs(5),
            // Type, pending, waiting, running, dead; then its pause.
            |t| t.split_whitespace().nth(4) == Some("1"),
        )
        .await;
    browser.click(link).await;
    browser
        .wait_text("#task-state", Duration::from_secs(10), |t| t == "dead")
        .await;
    browser
        .wait_text("#task-summary", Duration::from_secs(5), |t| {
            t.contains("failed 3 times")
        })
        .await;
    for attempt in 1..=3 {
        browser
            .wait_text(
                &format!("#task-attempts tr[data-attempt='{attempt}']"),
                Duration::from_secs(5),
                |t| {
                    t.contains("failed")
                        && t.contains(&format!("disk full on attempt {attempt}"))
                        && t.contains(&leader)
                        && t.matches(" UTC").count() == 2
                },
            )
            .await;
        // Its kept output, under the attempts.
        browser
            .wait_text(
                &format!("#task-output div[data-attempt='{attempt}'] pre.stderr"),
                Duration::from_secs(5),
                |t| t == format!("disk full on attempt {attempt}\n").trim_end(),
            )
            .await;
    }
    browser
        .wait_text("#task-value", Duration::from_secs(5), |t| {
            t.contains("\"disk\": \"/data\"")
        })
        .await;
    let address = browser.url().await;
    assert!(
        address.ends_with("#/task/oracleTaskDead%2Ftask_loud"),
        "the task page has its own address: {address}"
    );
    let shots = screenshots();
    browser.screenshot(&shots.join("task.png")).await;

    // A colleague opens the address: the same view.
    let colleague = Browser::start(
        &driver,
        &chromium,
        &bed.dir.path().join("chromedriver2.log"),
    )
    .await;
    colleague.goto(&address).await;
    colleague
        .wait_text("#task-key", Duration::from_secs(10), |t| {
            t == "oracleTaskDead/task_loud"
        })
        .await;
    colleague
        .wait_text("#task-attempts", Duration::from_secs(5), |t| {
            t.contains("disk full on attempt 3")
        })
        .await;
    colleague.quit().await;

    // Retry there: the page follows the task back in the queue to its completion.
    std::fs::write(&fixed, "").unwrap();
    browser
        .click("#task-actions button[data-action='retry']")
        .await;
    browser
        .wait_text("#task-key", Duration::from_secs(10), |t| {
            t == "oracleTask/task_loud"
        })
        .await;
    browser
        .wait_text("#task-state", Duration::from_secs(20), |t| t == "completed")
        .await;
    browser
        .wait_text("#task-attempts", Duration::from_secs(5), |t| {
            t.contains("disk full on attempt 2") && t.contains("completed")
        })
        .await;
    assert!(browser
        .url()
        .await
        .ends_with("#/task/oracleTask%2Ftask_loud"));
    browser.back().await;
    browser
        .wait_text("#task-key", Duration::from_secs(10), |t| {
            t == "oracleTaskDead/task_loud"
        })
        .await;
    browser
        .goto(&format!("http://{observe}/ui/#/overview?window=24h"))
        .await;
    browser
        .wait_text("#chart-totals", Duration::from_secs(10), |t| {
            t.contains("last 24 h")
                && t.contains("1 completed")
                && t.contains("1 leadership change")
        })
        .await;
    browser
        .wait_text("#standbys", Duration::from_secs(5), |t| {
            !t.contains(&leader)
        })
        .await;
    browser.screenshot(&shots.join("overview.png")).await;
    browser.quit().await;
}

/// Thousands of finished tasks: the history API filters them by type, outcome and time
/// range and answers one page of them; the history and dead-letter panes take their
/// filters and page from the address, so a reload, back and forward land on the same
/// view.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_history_and_dead_letters_filter_and_page_by_address() {
    use leaderq::coord::Edit;
    use leaderq::task::history::{record_key, HistoryRecord};
    let mut bed = Bed::new();
    // The leader prunes the history beyond history_keep: room for the records written here.
    bed.settings = bed.settings.clone().set("queue", "history_keep", "5000");
    bed.start_replica("h1");
    bed.leader(Duration::from_secs(30)).await;
    let observe = observe_address(&bed.replicas[0]).await;
    // 3000 records, a second apart, types A and B, ending a minute ago.
    let end = chrono::Utc::now() - chrono::Duration::seconds(60);
    let records: Vec<Edit> = (0..3000i64)
        .map(|n| {
            let finished = end - chrono::Duration::seconds(3000 - n);
            let key = format!("oracleTask/task_h{n}");
            let record = HistoryRecord {
                outcome: "completed".into(),
                key: key.clone(),
                task_id: format!("h{n}"),
                task_type: if n % 2 == 0 { "A" } else { "B" }.into(),
                finished_at: leaderq::task::rfc3339(finished),
                attempts: 1,
                ..HistoryRecord::default()
            };
            Edit::Put {
                key: record_key("oracleTask/", "oracleTaskDone/", &key, finished),
                value: record.encode(),
            }
        })
        .collect();
    for batch in records.chunks(50) {
        bed.coord.edit(batch).await.unwrap();
    }
    for n in 0..3 {
        let key = format!("oracleTaskDead/task_d{n}");
        let value = json!({"taskType": if n == 0 { "A" } else { "B" }, "taskTime": 1,
            "deadReason": "failed 3 times", "deadAt": leaderq::task::rfc3339(end),
            "originalKey": format!("oracleTask/task_d{n}")});
        bed.coord
            .edit(&[Edit::Create {
                key,
                value: value.to_string().into_bytes(),
            }])
            .await
            .unwrap();
    }

    // Through the API: type, outcome and a time range, one page.
    let from = leaderq::task::rfc3339(end - chrono::Duration::seconds(1000));
    let api = format!(
        "http://{observe}/ui/api/history?type=A&outcome=completed&from={}&limit=20&offset=40",
        from.replace('+', "%2B")
    );
    // The dashboard reads the records again within seconds of a direct write.
    let page = wait_until(
        Duration::from_secs(15),
        "the records in the history",
        async || {
            let page: Value = client()
                .get(&api)
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            match page["total"] == 500 {
                true => Ok(page),
                false => Err(page["total"].clone()),
            }
        },
    )
    .await;
    assert_eq!(page["rows"].as_array().unwrap().len(), 20);
    assert_eq!(
        page["rows"][0]["key"], "oracleTask/task_h2918",
        "newest first, from the 41st"
    );
    assert_eq!(page["types"], json!(["A", "B"]));
    let dead: Value = client()
        .get(format!("http://{observe}/ui/api/dead?type=B"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(dead["total"], 2, "{dead}");
    let refused = client()
        .get(format!("http://{observe}/ui/api/history?from=soon"))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 400);

    let Some((driver, chromium)) = Browser::installed() else {
        return;
    };
    let browser =
        Browser::start(&driver, &chromium, &bed.dir.path().join("chromedriver.log")).await;
    browser
        .goto(&format!(
            "http://{observe}/ui/#/history?outcome=completed&type=B&page=3"
        ))
        .await;
    browser
        .wait_text("#history-page", Duration::from_secs(15), |t| {
            t == "page 3 of 30 (1500)"
        })
        .await;
    browser
        .wait_text("#history-rows tr", Duration::from_secs(5), |t| {
            t.contains("oracleTask/task_h2799") && t.contains("completed")
        })
        .await;
    browser
        .screenshot(&screenshots().join("history-filtered.png"))
        .await;
    browser.click("#history-next").await;
    browser
        .wait_text("#history-page", Duration::from_secs(5), |t| {
            t.starts_with("page 4 of 30")
        })
        .await;
    assert!(browser.url().await.contains("page=4"));
    browser.back().await;
    browser
        .wait_text("#history-page", Duration::from_secs(5), |t| {
            t.starts_with("page 3 of 30")
        })
        .await;
    // A filter chosen on the page becomes the address.
    browser.type_text("#history-search", "task_h2998").await;
    browser.click("#history-filter button[type='submit']").await;
    browser
        .wait_text("#history-page", Duration::from_secs(5), |t| {
            t == "page 1 of 1 (0)"
        })
        .await;
    assert!(browser.url().await.contains("q=task_h2998"));
    browser
        .goto(&format!("http://{observe}/ui/#/history?q=task_h2998"))
        .await;
    browser
        .wait_text("#history-rows", Duration::from_secs(5), |t| {
            t.contains("oracleTask/task_h2998")
        })
        .await;
    // The dead letters, by type, from the address; a row links to its task page.
    browser
        .goto(&format!("http://{observe}/ui/#/dead?type=A"))
        .await;
    browser
        .wait_text("#dead-page", Duration::from_secs(5), |t| t.ends_with("(1)"))
        .await;
    browser
        .click("#dead-rows tr[data-key='oracleTaskDead/task_d0'] a.task-link")
        .await;
    browser
        .wait_text("#task-state", Duration::from_secs(5), |t| t == "dead")
        .await;
    browser.back().await;
    browser
        .wait_text("#dead-page", Duration::from_secs(5), |t| t.ends_with("(1)"))
        .await;
    // Delete there, from the task page: back to the dead letters, one fewer.
    browser
        .click("#dead-rows tr[data-key='oracleTaskDead/task_d0'] a.task-link")
        .await;
    browser
        .click("#task-actions button[data-action='delete']")
        .await;
    browser.accept_dialog().await;
    browser
        .wait_text("#dead-page", Duration::from_secs(5), |t| t.ends_with("(2)"))
        .await;
    assert!(browser.url().await.ends_with("#/dead"));

    // Claiming paused: the queue filtered by type from the address, and a pending task
    // cancelled from its page becomes a dead letter there.
    let paused = leaderq(&bed, &["pause"]);
    assert!(paused.status.success());
    bed.put_task(
        "task_w",
        json!({"taskId": "w", "taskTime": 1, "taskType": "Work"}),
    )
    .await;
    bed.put_task(
        "task_s",
        json!({"taskId": "s", "taskTime": 2, "taskType": "Slow"}),
    )
    .await;
    browser
        .goto(&format!("http://{observe}/ui/#/queue?type=Work"))
        .await;
    browser
        .wait_text("#queue-page", Duration::from_secs(10), |t| {
            t.ends_with("(1 tasks)")
        })
        .await;
    assert!(browser
        .text("#queue-rows")
        .await
        .unwrap()
        .contains("oracleTask/task_w"));
    browser
        .click("#queue-rows tr[data-key='oracleTask/task_w'] a.task-link")
        .await;
    browser
        .wait_text("#task-state", Duration::from_secs(5), |t| t == "pending")
        .await;
    browser
        .click("#task-actions button[data-action='cancel']")
        .await;
    browser.accept_dialog().await;
    browser
        .wait_text("#task-state", Duration::from_secs(10), |t| t == "dead")
        .await;
    browser
        .wait_text("#task-summary", Duration::from_secs(5), |t| {
            t.contains("cancel")
        })
        .await;
    browser.quit().await;
}
