//! Writes whose answers are lost on the wire, end to end: an HTTP/1.1 proxy between the one
//! replica and the `leaderq server` (or an etcd member, whose claims are records; or a
//! Redis, with a proxy of its protocol) forwards every request and answer unchanged, except
//! the answer to the first transaction of one kind (a claim, or a completion), which reaches
//! the server and is applied there, but whose answer the proxy reads and throws away,
//! closing the replica's connection instead. A lost claim costs its task no attempt; a lost
//! completion is recorded once. The queue's own unit tests of the same cases, on the
//! in-memory coordinator, are in `src/queue/tests/lost.rs`.

use super::*;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// What marks a claim on the wire: a transaction op that locks a key under the queue
/// prefix with the leader's session (`TxnOp::Lock`). The campaign locks the leader key,
/// which is not under the prefix, and a put back is an `unlock`.
const CLAIM_OP: &str = r#""Verb":"lock","Key":"oracleTask/"#;

/// What marks a completion on the wire: a `delete-cas` of a key under the queue prefix
/// (`TaskOp::Complete`, and the task's half of a `Finish` that writes its history record).
const COMPLETION_OP: &str = r#""Verb":"delete-cas","Key":"oracleTask/"#;

/// Requests whose answers are streams, not one message: relayed byte for byte.
const STREAMS: [&str; 2] = ["POST /v3/watch ", "POST /v3/lease/keepalive "];

/// An HTTP/1.1 proxy to the server that loses the answer to the first transaction sent
/// through it that holds its marker (an op on the wire), and forwards everything else
/// unchanged, keep-alive included.
struct LosingProxy {
    addr: String,
    shared: Arc<Shared>,
    stop: CancellationToken,
    accept: tokio::task::JoinHandle<()>,
}

/// What the proxy's connections share.
struct Shared {
    server: String,
    /// How a transaction's request starts (`PUT /v1/txn `, `POST /v3/kv/txn `).
    txn: &'static str,
    /// The op whose first transaction's answer is lost.
    marker: String,
    /// Set until the first claim is seen: the answer to that one is lost.
    armed: AtomicBool,
    /// The status codes of the answers the server gave and the replica never got.
    lost: Mutex<Vec<u16>>,
}

impl LosingProxy {
    async fn start(server: &str, txn: &'static str, marker: String) -> LosingProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let shared = Arc::new(Shared {
            server: server.to_string(),
            txn,
            marker,
            armed: AtomicBool::new(true),
            lost: Mutex::new(Vec::new()),
        });
        let stop = CancellationToken::new();
        let accept = tokio::spawn(accept_loop(listener, shared.clone(), stop.clone()));
        LosingProxy {
            addr,
            shared,
            stop,
            accept,
        }
    }

    /// The status codes of the answers lost so far.
    fn lost(&self) -> Vec<u16> {
        self.shared.lost.lock().unwrap().clone()
    }
}

impl Drop for LosingProxy {
    fn drop(&mut self) {
        self.stop.cancel();
        self.accept.abort();
    }
}

/// Relays each connection on a task of its own until `stop`, then waits for them all.
async fn accept_loop(listener: TcpListener, shared: Arc<Shared>, stop: CancellationToken) {
    let tracker = TaskTracker::new();
    loop {
        let inbound = tokio::select! {
            _ = stop.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((inbound, _)) => inbound,
                Err(_) => break,
            },
        };
        let (shared, stop) = (shared.clone(), stop.clone());
        tracker.spawn(async move {
            tokio::select! {
                _ = stop.cancelled() => {}
                // A connection that breaks is simply closed, as the server would close it.
                _ = relay(inbound, &shared) => {}
            }
        });
    }
    tracker.close();
    tracker.wait().await;
}

/// Forwards the requests of one replica connection to a server connection of its own, one
/// at a time (HTTP/1.1 without pipelining, as reqwest sends), each answer back in turn.
/// Returns when either side closes, or once the marked answer is lost: then
/// both connections are dropped with that answer read whole and never sent.
async fn relay(inbound: TcpStream, shared: &Shared) -> std::io::Result<()> {
    let outbound = TcpStream::connect(&shared.server).await?;
    let (from_client, mut to_client) = inbound.into_split();
    let (from_server, mut to_server) = outbound.into_split();
    let (mut from_client, mut from_server) =
        (BufReader::new(from_client), BufReader::new(from_server));
    loop {
        let Some(request) = read_message(&mut from_client, None).await? else {
            return Ok(());
        };
        if STREAMS.iter().any(|path| request.head.starts_with(path)) {
            // A stream (etcd's watch, keep-alive): relayed as it comes, both ways, until
            // either side closes; the client opens a connection for each.
            to_server.write_all(&request.bytes).await?;
            tokio::select! {
                up = tokio::io::copy(&mut from_client, &mut to_server) => up?,
                down = tokio::io::copy(&mut from_server, &mut to_client) => down?,
            };
            return Ok(());
        }
        let marked = request.head.starts_with(shared.txn)
            && String::from_utf8_lossy(&request.bytes).contains(&shared.marker);
        let lose = marked && shared.armed.swap(false, Ordering::SeqCst);
        to_server.write_all(&request.bytes).await?;
        let head_only = request.head.starts_with("HEAD ");
        let Some(answer) = read_message(&mut from_server, Some(head_only)).await? else {
            return Ok(());
        };
        if lose {
            let status = answer.status().unwrap_or(0);
            shared.lost.lock().unwrap().push(status);
            return Ok(());
        }
        to_client.write_all(&answer.bytes).await?;
        if answer.until_close {
            return Ok(());
        }
    }
}

/// One HTTP/1.1 message read whole: its bytes exactly as they came, and its head (the
/// request or status line and the headers).
struct Message {
    head: String,
    bytes: Vec<u8>,
    /// Its body ran to the end of the connection (an answer with no length).
    until_close: bool,
}

impl Message {
    /// An answer's status code.
    fn status(&self) -> Option<u16> {
        self.head.split_whitespace().nth(1)?.parse().ok()
    }

    /// The value of header `name`, if present.
    fn header(&self, name: &str) -> Option<&str> {
        self.head.lines().skip(1).find_map(|line| {
            let (key, value) = line.split_once(':')?;
            key.trim()
                .eq_ignore_ascii_case(name)
                .then_some(value.trim())
        })
    }
}

/// Reads one message from `from`: a request (`answer_to_head` is `None`) or an answer
/// (`Some(true)` when it answers a HEAD, so it has no body). `None` when the connection
/// ends cleanly before a message starts.
async fn read_message(
    from: &mut (impl AsyncBufRead + Unpin),
    answer_to_head: Option<bool>,
) -> std::io::Result<Option<Message>> {
    let mut bytes = Vec::new();
    loop {
        let line = from.read_until(b'\n', &mut bytes).await?;
        if line == 0 {
            if bytes.is_empty() {
                return Ok(None);
            }
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        if bytes.ends_with(b"\r\n\r\n") || bytes.ends_with(b"\n\n") {
            break;
        }
    }
    let mut message = Message {
        head: String::from_utf8_lossy(&bytes).into_owned(),
        bytes,
        until_close: false,
    };
    let no_body = match answer_to_head {
        None => false,
        Some(to_head) => {
            let status = message.status().unwrap_or(0);
            to_head || (100..200).contains(&status) || status == 204 || status == 304
        }
    };
    if no_body {
        return Ok(Some(message));
    }
    let chunked = message
        .header("transfer-encoding")
        .is_some_and(|coding| coding.to_ascii_lowercase().contains("chunked"));
    let length = message
        .header("content-length")
        .map(|length| length.parse::<usize>().map_err(std::io::Error::other))
        .transpose()?;
    if chunked {
        read_chunked(from, &mut message.bytes).await?;
    } else if let Some(length) = length {
        let start = message.bytes.len();
        message.bytes.resize(start + length, 0);
        from.read_exact(&mut message.bytes[start..]).await?;
    } else if answer_to_head.is_some() {
        from.read_to_end(&mut message.bytes).await?;
        message.until_close = true;
    }
    Ok(Some(message))
}

/// Reads a chunked body, its chunks and trailers, onto `bytes` as they came.
async fn read_chunked(
    from: &mut (impl AsyncBufRead + Unpin),
    bytes: &mut Vec<u8>,
) -> std::io::Result<()> {
    loop {
        let start = bytes.len();
        if from.read_until(b'\n', bytes).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        let line = String::from_utf8_lossy(&bytes[start..]).into_owned();
        let size = line.split(';').next().unwrap_or("").trim();
        let size = usize::from_str_radix(size, 16).map_err(std::io::Error::other)?;
        if size == 0 {
            // Trailers, up to the empty line.
            loop {
                let start = bytes.len();
                if from.read_until(b'\n', bytes).await? == 0 {
                    return Err(std::io::ErrorKind::UnexpectedEof.into());
                }
                if &bytes[start..] == b"\r\n" || &bytes[start..] == b"\n" {
                    return Ok(());
                }
            }
        }
        // The chunk and the CRLF after it.
        let start = bytes.len();
        bytes.resize(start + size + 2, 0);
        from.read_exact(&mut bytes[start..]).await?;
    }
}

/// A proxy that loses the answer to one marked write.
trait Losing {
    /// Whether it lost that answer, and no other, once the server had applied the write.
    fn lost_one(&self) -> bool;
}

impl Losing for LosingProxy {
    fn lost_one(&self) -> bool {
        self.lost() == [200]
    }
}

/// With replica `r1` started behind `proxy`: it leads, drains task `id` (enqueued beside
/// the proxy), that one answer (`what`, a commit) was lost on the wire, nothing was
/// dead-lettered, and the task ran once, as its first attempt.
async fn drains_losing_one<C: ?Sized + testkit::harness::Cluster>(
    bed: &TestBed<C>,
    proxy: &impl Losing,
    what: &str,
    id: &str,
) {
    assert_eq!(bed.leader(Duration::from_secs(30)).await, "r1");
    let task = leaderq::coord::Edit::Create {
        key: format!("oracleTask/task_{id}"),
        value: json!({"taskId": id, "taskTime": 1, "taskType": "Work"})
            .to_string()
            .into_bytes(),
    };
    bed.coord.edit(&[task]).await.expect("enqueue");
    bed.wait_until_empty("oracleTask/", Duration::from_secs(20))
        .await;
    // The proxy counts a lost answer once it has read it, which may be after the write's
    // effect is seen here.
    wait_until(
        Duration::from_secs(10),
        &format!("{what}'s answer, a commit, lost on the wire"),
        async || {
            if proxy.lost_one() {
                Ok(())
            } else {
                Err(bed.logs())
            }
        },
    )
    .await;
    let (dead, _) = bed.coord.keys("oracleTaskDead/").await.expect("keys");
    assert!(dead.is_empty(), "dead-lettered: {dead:?}\n{}", bed.logs());
    let runs: Vec<(String, String)> = bed
        .journal()
        .iter()
        .map(|line| (line[1].clone(), line[4].clone()))
        .collect();
    assert_eq!(
        runs,
        [(id.to_string(), "1".to_string())],
        "the task runs once, as its first attempt\n{}",
        bed.logs()
    );
}

/// One replica, `configure`d, reaching the server through a proxy that loses the first
/// answer to a transaction holding `marker`, drains task `id`: the queue empties, that one
/// answer (`what`, a commit) was lost on the wire, and nothing was dead-lettered. Hands
/// back the bed and the proxy, which the replica still goes through.
async fn drain_one_losing(
    marker: &'static str,
    what: &str,
    configure: impl FnOnce(TestSettings) -> TestSettings,
    id: &str,
) -> (Bed, LosingProxy) {
    let mut bed = Bed::new();
    let proxy = LosingProxy::start(&bed.cluster.addr, "PUT /v1/txn ", marker.into()).await;
    let config = configure(bed.settings.clone()).toml("r1");
    let replica = ConsumerProcess::start(&proxy.addr, "r1", bed.dir.path(), &config);
    bed.replicas.push(replica);
    drains_losing_one(&bed, &proxy, what, id).await;
    (bed, proxy)
}

/// Task `id`'s history, read with the settings `env` gives, holds one record of its run,
/// completed; `logs` say why not.
async fn one_completed_record(
    coord: &dyn leaderq::coord::Coordinator,
    env: Vec<(String, String)>,
    id: &str,
    logs: &str,
) {
    use leaderq::operate::history::{history, HistoryFilter};
    let settings = leaderq::config::Settings::load(None, env).expect("settings");
    let records = history(coord, &settings.queue, &HistoryFilter::default())
        .await
        .expect("history");
    let of_id: Vec<_> = records.iter().filter(|r| r.task_id == id).collect();
    assert_eq!(
        of_id.len(),
        1,
        "one record of the run: {records:#?}\n{logs}"
    );
    assert_eq!(of_id[0].outcome, "completed");
}

/// Starts replica `r1` of `bed`, one attempt allowed, with `var` (its coordinator's
/// address) set to `address`, a proxy's; then as [`drains_losing_one`].
async fn drain_through<C: ?Sized + testkit::harness::Cluster>(
    bed: &mut TestBed<C>,
    var: &str,
    address: String,
    proxy: &impl Losing,
    what: &str,
    id: &str,
) {
    bed.env = vec![(var.into(), address)];
    let config = bed
        .settings
        .clone()
        .set("queue", "max_attempts", "1")
        .toml("r1");
    bed.start_replica_with("r1", &config);
    drains_losing_one(bed, proxy, what, id).await;
}

/// The leader logged the claim whose answer was lost as failed.
fn saw_the_claim_fail(replica: &ConsumerProcess) {
    let log = replica.log_text();
    assert!(
        log.contains("claim failed"),
        "the leader saw no error: {log}"
    );
}

/// A claim the server applied but whose answer the leader never got (its connection closed
/// after the server answered) costs no attempt: with one attempt allowed, the task still
/// runs exactly once, as attempt 1, nothing is dead-lettered and the queue drains.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_whose_answer_was_lost_on_the_wire_costs_its_task_no_attempt() {
    let (bed, _proxy) = drain_one_losing(
        CLAIM_OP,
        "the first claim",
        |settings| settings.set("queue", "max_attempts", "1"),
        "l",
    )
    .await;
    saw_the_claim_fail(&bed.replicas[0]);
}

/// A completion the server applied but whose answer the leader never got is recorded once:
/// the leader reads the record key its lost write carried, finds it, and writes nothing
/// again. The task ran once, the queue drains, and its history holds one record. (One task,
/// so that its completion is the first one, alone: a batch's completions, written together,
/// depend on the handlers' pace, which a loaded machine moves; the driver tests in
/// `src/queue/tests/lost.rs` cover those, where the pace is scripted.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_whose_answer_was_lost_on_the_wire_is_recorded_once() {
    use testkit::harness::Cluster as _;
    let (bed, _proxy) =
        drain_one_losing(COMPLETION_OP, "the completion", |settings| settings, "c").await;
    one_completed_record(bed.coord.as_ref(), bed.cluster.env(), "c", &bed.logs()).await;
}

/// The same on etcd, whose claims are records: the first write of a claim record, and the
/// first completion, each applied with its answer lost between etcd and the one replica.
/// The task runs once, as its first attempt; its history has one record; and the records
/// the lost answers left are collected, so none is left once the queue is drained.
mod etcd {
    use super::*;
    use base64::Engine as _;

    /// How a key beginning with `prefix` begins on the wire, where etcd's JSON gateway
    /// carries keys in base64: the encoding of `prefix`'s first whole three bytes.
    fn on_the_wire(prefix: &str) -> String {
        let whole = prefix.len() / 3 * 3;
        base64::engine::general_purpose::STANDARD.encode(&prefix.as_bytes()[..whole])
    }

    /// A transaction that writes a claim record: the claims of one write.
    fn claim_record() -> String {
        format!(
            r#""request_put":{{"key":"{}"#,
            on_the_wire("consumerLeader.held/")
        )
    }

    /// A transaction that deletes a task: a completion.
    fn completion() -> String {
        format!(
            r#""request_delete_range":{{"key":"{}"#,
            on_the_wire("oracleTask/task_")
        )
    }

    /// One replica on etcd through a proxy losing the first answer to a transaction with
    /// `marker` drains task `id` with one attempt allowed: the queue empties, that answer
    /// was lost, nothing was dead-lettered, the task ran once as attempt 1, and no claim
    /// record is left.
    async fn drain_one_losing(marker: String, what: &str, id: &str) -> Option<TestBed> {
        let mut bed = TestBed::on("etcd")?;
        let env = bed.cluster.env();
        let endpoints = env
            .iter()
            .find(|(name, _)| name == "LEADERQ__ETCD__ENDPOINTS")
            .map(|(_, value)| value.clone())
            .expect("the cluster's endpoints");
        let member = endpoints.split(',').next().unwrap();
        let member = member.trim_start_matches("http://").to_string();
        let proxy = LosingProxy::start(&member, "POST /v3/kv/txn ", marker).await;
        let address = format!("http://{}", proxy.addr);
        drain_through(
            &mut bed,
            "LEADERQ__ETCD__ENDPOINTS",
            address,
            &proxy,
            what,
            id,
        )
        .await;
        let coord = bed.coord.clone();
        wait_until(
            Duration::from_secs(30),
            "no claim record left",
            async || {
                let (left, _) = coord.keys("consumerLeader.held/").await.expect("keys");
                if left.is_empty() {
                    Ok(())
                } else {
                    Err(format!("{left:?}\n{}", bed.logs()))
                }
            },
        )
        .await;
        Some(bed)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_claim_record_whose_answer_was_lost_costs_its_task_no_attempt() {
        let Some(bed) = drain_one_losing(claim_record(), "the first claim", "l").await else {
            return;
        };
        saw_the_claim_fail(&bed.replicas[0]);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_completion_whose_answer_was_lost_is_recorded_once() {
        let Some(bed) = drain_one_losing(completion(), "the completion", "c").await else {
            return;
        };
        one_completed_record(bed.coord.as_ref(), bed.cluster.env(), "c", &bed.logs()).await;
    }
}

/// The same on Redis, whose writes are scripts on one multiplexed connection: a proxy of
/// Redis's protocol forwards every command and every reply, until the first script call
/// that writes one kind of op on a task (a claim, or the move that completes a task and
/// records its history). It forwards that call, waits for Redis to answer, and closes both
/// connections with the answer unsent: every reply still on the way is lost with it, as
/// when a connection breaks. The replica's client connects again by itself.
mod redis {
    use super::*;
    use testkit::harness::redis::RedisServer;
    use testkit::harness::Cluster as _;

    /// How long the proxy waits for Redis's answer to the marked call before it cuts the
    /// connection anyway.
    const ANSWER_LIMIT: Duration = Duration::from_secs(5);

    /// A proxy of Redis's protocol that cuts the connection once the first command with
    /// the `marker` arguments reached Redis and Redis answered.
    struct CuttingProxy {
        addr: String,
        shared: Arc<Cut>,
        accept: tokio::task::JoinHandle<()>,
    }

    struct Cut {
        server: String,
        /// Two arguments that follow each other in the command: an op's kind, and how its
        /// key begins.
        marker: [&'static [u8]; 2],
        armed: AtomicBool,
        /// The calls cut, each `true` when Redis had answered before the cut.
        cuts: Mutex<Vec<bool>>,
    }

    impl CuttingProxy {
        async fn start(server: &str, marker: [&'static [u8]; 2]) -> CuttingProxy {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap().to_string();
            let shared = Arc::new(Cut {
                server: server.to_string(),
                marker,
                armed: AtomicBool::new(true),
                cuts: Mutex::new(Vec::new()),
            });
            let cut = shared.clone();
            let accept = tokio::spawn(async move {
                while let Ok((inbound, _)) = listener.accept().await {
                    let cut = cut.clone();
                    tokio::spawn(async move {
                        // A connection that breaks is simply closed, as Redis would close it.
                        let _ = relay(inbound, &cut).await;
                    });
                }
            });
            CuttingProxy {
                addr,
                shared,
                accept,
            }
        }
    }

    impl Losing for CuttingProxy {
        fn lost_one(&self) -> bool {
            *self.shared.cuts.lock().unwrap() == [true]
        }
    }

    impl Drop for CuttingProxy {
        fn drop(&mut self) {
            self.accept.abort();
        }
    }

    /// Relays one connection: replies as they come, commands one by one, until either side
    /// closes or the marked command went through; then Redis's next bytes are read and
    /// dropped with both connections.
    async fn relay(inbound: TcpStream, cut: &Cut) -> std::io::Result<()> {
        let outbound = TcpStream::connect(&cut.server).await?;
        let (from_client, mut to_client) = inbound.into_split();
        let (mut from_server, mut to_server) = outbound.into_split();
        let mut from_client = BufReader::new(from_client);
        let commands = async {
            while let Some((bytes, args)) = read_command(&mut from_client).await? {
                let marked = args
                    .windows(2)
                    .any(|w| w[0] == cut.marker[0] && w[1].starts_with(cut.marker[1]));
                to_server.write_all(&bytes).await?;
                if marked && cut.armed.swap(false, Ordering::SeqCst) {
                    return Ok(true);
                }
            }
            Ok::<_, std::io::Error>(false)
        };
        let cutting = tokio::select! {
            cutting = commands => cutting?,
            _ = tokio::io::copy(&mut from_server, &mut to_client) => false,
        };
        if cutting {
            let mut answer = [0u8; 1];
            let answered = matches!(
                tokio::time::timeout(ANSWER_LIMIT, from_server.read(&mut answer)).await,
                Ok(Ok(1))
            );
            cut.cuts.lock().unwrap().push(answered);
        }
        Ok(())
    }

    /// One command as a client sends it (an array of bulk strings), its bytes as they came
    /// and its arguments; `None` at the end of the connection.
    async fn read_command(
        from: &mut (impl AsyncBufRead + Unpin),
    ) -> std::io::Result<Option<(Vec<u8>, Vec<Vec<u8>>)>> {
        let mut bytes = Vec::new();
        if from.read_until(b'\n', &mut bytes).await? == 0 {
            return Ok(None);
        }
        let count = length(&bytes, b'*')?;
        let mut args = Vec::with_capacity(count);
        for _ in 0..count {
            let start = bytes.len();
            from.read_until(b'\n', &mut bytes).await?;
            let len = length(&bytes[start..], b'$')?;
            let at = bytes.len();
            bytes.resize(at + len + 2, 0);
            from.read_exact(&mut bytes[at..]).await?;
            args.push(bytes[at..at + len].to_vec());
        }
        Ok(Some((bytes, args)))
    }

    /// The length a `*N\r\n` or `$N\r\n` line gives.
    fn length(line: &[u8], kind: u8) -> std::io::Result<usize> {
        let bad = || std::io::Error::other(format!("not a command: {line:?}"));
        let digits = line
            .strip_prefix(&[kind])
            .and_then(|rest| rest.strip_suffix(b"\r\n"))
            .ok_or_else(bad)?;
        std::str::from_utf8(digits)
            .ok()
            .and_then(|n| n.parse().ok())
            .ok_or_else(bad)
    }

    /// One replica on Redis, through a proxy that cuts its connection once the first call
    /// with `marker` went through, drains task `id` with one attempt allowed: the queue
    /// empties, that answer was lost, nothing was dead-lettered, the task ran once as
    /// attempt 1.
    async fn drain_one_losing(
        marker: [&'static [u8]; 2],
        what: &str,
        id: &str,
    ) -> Option<TestBed<RedisServer>> {
        let mut bed = TestBed::with(RedisServer::start()?);
        let url = bed.cluster.url();
        let server = url
            .trim_start_matches("redis://")
            .split('/')
            .next()
            .unwrap();
        let proxy = CuttingProxy::start(server, marker).await;
        let address = format!("redis://{}", proxy.addr);
        drain_through(&mut bed, "LEADERQ__REDIS__URL", address, &proxy, what, id).await;
        Some(bed)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_claim_whose_answer_was_lost_costs_its_task_no_attempt() {
        let Some(bed) = drain_one_losing([b"claim", b"oracleTask/"], "the first claim", "l").await
        else {
            return;
        };
        saw_the_claim_fail(&bed.replicas[0]);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_completion_whose_answer_was_lost_is_recorded_once() {
        let Some(bed) = drain_one_losing([b"move", b"oracleTask/"], "the completion", "c").await
        else {
            return;
        };
        one_completed_record(bed.coord.as_ref(), bed.cluster.env(), "c", &bed.logs()).await;
    }
}
