//! The server's edges: clients that stall mid-request, idle keep-alive connections, many
//! connections from one address, and shutdown while clients hold requests half-sent. Raw
//! TCP streams play the slow clients, so each test controls exactly which bytes were sent.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use super::*;

/// A raw connection to the server.
fn connect(server: &ServerProcess) -> TcpStream {
    TcpStream::connect(&server.addr).expect("connect")
}

/// What the server did with a raw connection within a time limit.
struct Observed {
    bytes: Vec<u8>,
    /// The server closed (or reset) the connection.
    closed: bool,
    elapsed: Duration,
}

impl Observed {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.bytes).into_owned()
    }
}

/// Reads whatever the server sends until it closes the connection or `limit` passes.
fn watch(stream: &mut TcpStream, limit: Duration) -> Observed {
    let started = Instant::now();
    let mut bytes = Vec::new();
    let mut buffer = [0u8; 4096];
    loop {
        let left = limit.saturating_sub(started.elapsed());
        if left.is_zero() {
            return Observed {
                bytes,
                closed: false,
                elapsed: started.elapsed(),
            };
        }
        stream.set_read_timeout(Some(left)).unwrap();
        match stream.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => bytes.extend_from_slice(&buffer[..n]),
            Err(err)
                if matches!(
                    err.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => break,
        }
    }
    Observed {
        bytes,
        closed: true,
        elapsed: started.elapsed(),
    }
}

/// Reads one response with a Content-Length body (enough for these tests' small answers).
fn read_response(stream: &mut TcpStream) -> String {
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut bytes = Vec::new();
    let mut byte = [0u8; 1];
    while !bytes.ends_with(b"\r\n\r\n") {
        assert_eq!(
            stream.read(&mut byte).expect("read head"),
            1,
            "closed early"
        );
        bytes.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&bytes).into_owned();
    let length: usize = head
        .lines()
        .find_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse().unwrap())
        })
        .unwrap_or(0);
    let mut body = vec![0u8; length];
    stream.read_exact(&mut body).expect("read body");
    head + &String::from_utf8_lossy(&body)
}

/// Clients holding a request's head or its body half-sent are not being answered: SIGTERM
/// drops them (and an idle keep-alive connection) at once instead of waiting out the 10 s
/// shutdown deadline or their 30 s and 60 s timeouts, and a new server starts on the same
/// data dir with the acknowledged write there.
#[tokio::test]
async fn sigterm_drops_half_sent_requests_at_once_and_a_restart_works() {
    let temp = tempfile::tempdir().unwrap();
    let dir = temp.path().join("data");
    let mut server = ServerProcess::start_in(&dir, &[]).unwrap();
    assert_eq!(put(&server, "/v1/kv/kept", "v").await.status(), 200);

    let mut half_head = connect(&server);
    half_head
        .write_all(b"PUT /v1/kv/a HTTP/1.1\r\nHost: test\r\n")
        .unwrap();
    let mut half_body = connect(&server);
    half_body
        .write_all(b"PUT /v1/kv/b HTTP/1.1\r\nHost: test\r\nContent-Length: 100\r\n\r\n0123456789")
        .unwrap();
    let mut idle = connect(&server);
    idle.write_all(b"GET /v1/kv/kept HTTP/1.1\r\nHost: test\r\n\r\n")
        .unwrap();
    assert!(read_response(&mut idle).starts_with("HTTP/1.1 200"));
    // Connections are accepted in order: once a later one is answered, all three are in.
    assert_eq!(get(&server, "/v1/status/leader").await.status(), 200);

    let started = Instant::now();
    let status = server
        .terminate_within(Duration::from_secs(30))
        .expect("the server was still running 30 s after SIGTERM");
    let stopping = started.elapsed();
    assert!(status.success(), "{status:?}");
    // Half the shutdown deadline: only a server that waits for these clients takes longer.
    assert!(
        stopping < Duration::from_secs(5),
        "stopping took {stopping:?}: the half-sent requests were waited for"
    );
    for stream in [&mut half_head, &mut half_body, &mut idle] {
        let seen = watch(stream, Duration::from_secs(5));
        assert!(seen.closed && seen.bytes.is_empty(), "{:?}", seen.text());
    }

    let restarted = ServerProcess::start_in(&dir, &[]).expect("restart on the same data dir");
    assert_eq!(
        get(&restarted, "/v1/kv/kept?raw")
            .await
            .text()
            .await
            .unwrap(),
        "v"
    );
}

/// With Consul's default cap of 200 connections per client address, 200 idle connections
/// are held, the next ones from that address get Consul's 429 and are closed, a client from
/// another address is served meanwhile, and the first address is served again once its
/// idle connections close.
#[tokio::test]
async fn connections_over_the_per_client_cap_get_429_and_other_clients_get_through() {
    let server = ServerProcess::start();
    let idle: Vec<TcpStream> = (0..200).map(|_| connect(&server)).collect();
    for _ in 0..3 {
        let mut extra = connect(&server);
        let seen = watch(&mut extra, Duration::from_secs(3));
        assert!(
            seen.closed
                && seen
                    .text()
                    .starts_with("HTTP/1.1 429 Too Many Requests\r\n"),
            "over the cap: closed {} after {:?}: {:?}",
            seen.closed,
            seen.elapsed,
            seen.text()
        );
        assert!(seen.text().contains("too many concurrent connections"));
    }

    let other = reqwest::Client::builder()
        .local_address(Some("127.0.0.2".parse().unwrap()))
        .build()
        .unwrap();
    let response = other
        .get(server.url("/v1/status/leader"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200, "another address is locked out");

    drop(idle);
    wait_until(
        Duration::from_secs(5),
        "answered after the idle connections closed",
        async || {
            // A fresh client each time: no pooled connection carries an old answer over.
            match client().get(server.url("/v1/status/leader")).send().await {
                Ok(response) if response.status() == 200 => Ok(()),
                other => Err(other),
            }
        },
    )
    .await;
}

/// A client that sends part of its headers and stalls, connects and sends nothing, or
/// starts its next request on a keep-alive connection and stalls, is cut off after the
/// header timeout, without an answer, although the idle timeout is much longer.
#[tokio::test]
async fn a_stalled_request_head_is_cut_after_the_header_timeout() {
    let server = ServerProcess::start_in_temp(&[
        "--http-header-timeout",
        "500ms",
        "--http-idle-timeout",
        "1m",
    ]);
    let opened = Instant::now();
    let mut partial = connect(&server);
    partial
        .write_all(b"GET /v1/kv/a HTTP/1.1\r\nHost: test\r\n")
        .unwrap();
    let mut silent = connect(&server);
    let mut next = connect(&server);
    next.write_all(b"GET /v1/kv/a HTTP/1.1\r\nHost: test\r\n\r\n")
        .unwrap();
    assert!(read_response(&mut next).starts_with("HTTP/1.1 404"));
    next.write_all(b"GET /v1/kv/a HTTP/1.1\r\nHo").unwrap();
    for stream in [&mut partial, &mut silent, &mut next] {
        // The bound only guards against a hang: the idle timeout (1 m) is far beyond it.
        let seen = watch(stream, Duration::from_secs(10));
        assert!(seen.closed, "still open after {:?}", opened.elapsed());
        assert!(seen.bytes.is_empty(), "{:?}", seen.text());
    }
    // Loose: it shows the cut came from a timeout, not from refusing the bytes at once.
    assert!(
        opened.elapsed() >= Duration::from_millis(250),
        "cut too early: {:?}",
        opened.elapsed()
    );
}

/// A request that sends 10 bytes of a 100-byte body and stalls gets 408 after the body
/// timeout, although the idle timeout is much longer, and the connection closes.
#[tokio::test]
async fn a_stalled_request_body_gets_408_after_the_body_timeout() {
    let server = ServerProcess::start_in_temp(&[
        "--http-body-timeout",
        "500ms",
        "--http-idle-timeout",
        "1m",
    ]);
    let mut stream = connect(&server);
    stream
        .write_all(b"PUT /v1/kv/a HTTP/1.1\r\nHost: test\r\nContent-Length: 100\r\n\r\n0123456789")
        .unwrap();
    // The bound only guards against a hang: the idle timeout (1 m) is far beyond it.
    let seen = watch(&mut stream, Duration::from_secs(10));
    assert!(
        seen.closed && seen.text().starts_with("HTTP/1.1 408 "),
        "closed {} after {:?}: {:?}",
        seen.closed,
        seen.elapsed,
        seen.text()
    );
    assert_eq!(
        get(&server, "/v1/kv/a").await.status(),
        404,
        "nothing written"
    );
}

/// An idle keep-alive connection, after one complete request, is closed after the idle
/// timeout without another word.
#[tokio::test]
async fn an_idle_keep_alive_connection_is_closed_after_the_idle_timeout() {
    let server = ServerProcess::start_in_temp(&["--http-idle-timeout", "1s"]);
    let mut idle = connect(&server);
    idle.write_all(b"GET /v1/kv/a HTTP/1.1\r\nHost: test\r\n\r\n")
        .unwrap();
    assert!(read_response(&mut idle).starts_with("HTTP/1.1 404"));
    // The bound only guards against a hang.
    let seen = watch(&mut idle, Duration::from_secs(10));
    assert!(
        seen.closed && seen.bytes.is_empty(),
        "idle connection still open after {:?}: {:?}",
        seen.elapsed,
        seen.text()
    );
    // Loose: it shows the cut came from the idle timeout, not from closing after one answer.
    assert!(
        seen.elapsed >= Duration::from_millis(500),
        "{:?}",
        seen.elapsed
    );
}

/// A blocking query is being answered, so the header, body and idle timeouts (all 500 ms)
/// do not cut it: it runs its 5 s wait, is answered, and its connection serves the next
/// request.
#[tokio::test]
async fn a_blocking_query_runs_its_wait_past_short_header_body_and_idle_timeouts() {
    let server = ServerProcess::start_in_temp(&[
        "--http-header-timeout",
        "500ms",
        "--http-body-timeout",
        "500ms",
        "--http-idle-timeout",
        "500ms",
    ]);
    let index = index_of(&get(&server, "/v1/kv/a").await);
    let mut blocking = connect(&server);
    let started = Instant::now();
    blocking
        .write_all(
            format!("GET /v1/kv/a?index={index}&wait=5s HTTP/1.1\r\nHost: test\r\n\r\n").as_bytes(),
        )
        .unwrap();
    let answer = read_response(&mut blocking);
    assert!(answer.starts_with("HTTP/1.1 404"), "{answer}");
    assert!(
        answer.contains(&format!("X-Consul-Index: {index}\r\n")),
        "{answer}"
    );
    // Loose: far past every timeout, so the query was answered at the end of its wait.
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "the blocking query returned after {:?}",
        started.elapsed()
    );
    blocking
        .write_all(b"GET /v1/status/leader HTTP/1.1\r\nHost: test\r\n\r\n")
        .unwrap();
    assert!(read_response(&mut blocking).starts_with("HTTP/1.1 200"));
}
