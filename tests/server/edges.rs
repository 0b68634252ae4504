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

/// A request whose headers are cut off and another whose body is, both left hanging: SIGTERM
/// still stops the server within its shutdown deadline, and a new server starts on the same
/// data dir at once, with the acknowledged write there.
#[tokio::test]
async fn sigterm_stops_the_server_despite_half_sent_requests_and_a_restart_works() {
    let temp = tempfile::tempdir().unwrap();
    let dir = temp.path().join("data");
    let mut server = ServerProcess::start_in(&dir, &["--shutdown-timeout", "1s"]).unwrap();
    assert_eq!(put(&server, "/v1/kv/kept", "v").await.status(), 200);

    let mut half_head = connect(&server);
    half_head
        .write_all(b"PUT /v1/kv/a HTTP/1.1\r\nHost: test\r\n")
        .unwrap();
    let mut half_body = connect(&server);
    half_body
        .write_all(b"PUT /v1/kv/b HTTP/1.1\r\nHost: test\r\nContent-Length: 100\r\n\r\nabc")
        .unwrap();
    // Connections are accepted in order: once a later one is answered, both are in.
    assert_eq!(get(&server, "/v1/status/leader").await.status(), 200);

    let started = Instant::now();
    let status = server
        .terminate_within(Duration::from_secs(10))
        .expect("the server was still running 10 s after SIGTERM");
    assert!(status.success(), "{status:?}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "stopping took {:?} with a 1 s deadline",
        started.elapsed()
    );
    assert!(watch(&mut half_body, Duration::from_secs(1)).closed);

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
    let started = Instant::now();
    loop {
        // A fresh client each time: no pooled connection carries an old answer over.
        match client().get(server.url("/v1/status/leader")).send().await {
            Ok(response) if response.status() == 200 => break,
            other => assert!(
                started.elapsed() < Duration::from_secs(5),
                "still refused after the idle connections closed: {other:?}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A client that sends part of its headers and stalls, or connects and sends nothing, is
/// cut off after the header timeout.
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
    for stream in [&mut partial, &mut silent] {
        let seen = watch(stream, Duration::from_secs(5));
        assert!(seen.closed, "still open after {:?}", opened.elapsed());
        assert!(seen.bytes.is_empty(), "{:?}", seen.text());
    }
    assert!(
        opened.elapsed() >= Duration::from_millis(450),
        "cut too early: {:?}",
        opened.elapsed()
    );
}

/// A request whose body stalls gets 408 after the body timeout, and the connection closes.
#[tokio::test]
async fn a_stalled_request_body_gets_408_after_the_body_timeout() {
    let server = ServerProcess::start_in_temp(&["--http-body-timeout", "500ms"]);
    let mut stream = connect(&server);
    stream
        .write_all(b"PUT /v1/kv/a HTTP/1.1\r\nHost: test\r\nContent-Length: 10\r\n\r\nabc")
        .unwrap();
    let seen = watch(&mut stream, Duration::from_secs(5));
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

/// An idle keep-alive connection is closed after the idle timeout, but a blocking query
/// that waits longer than that is answered, and its connection serves the next request.
#[tokio::test]
async fn idle_connections_close_after_the_idle_timeout_but_blocking_queries_run_their_wait() {
    let server = ServerProcess::start_in_temp(&["--http-idle-timeout", "1s"]);
    let index = index_of(&get(&server, "/v1/kv/a").await);

    let mut idle = connect(&server);
    idle.write_all(b"GET /v1/kv/a HTTP/1.1\r\nHost: test\r\n\r\n")
        .unwrap();
    assert!(read_response(&mut idle).starts_with("HTTP/1.1 404"));
    let seen = watch(&mut idle, Duration::from_secs(5));
    assert!(
        seen.closed,
        "idle connection still open after {:?}",
        seen.elapsed
    );
    assert!(
        seen.elapsed >= Duration::from_millis(700),
        "{:?}",
        seen.elapsed
    );

    let mut blocking = connect(&server);
    let started = Instant::now();
    blocking
        .write_all(
            format!("GET /v1/kv/a?index={index}&wait=2500ms HTTP/1.1\r\nHost: test\r\n\r\n")
                .as_bytes(),
        )
        .unwrap();
    let answer = read_response(&mut blocking);
    assert!(answer.starts_with("HTTP/1.1 404"), "{answer}");
    assert!(
        started.elapsed() >= Duration::from_millis(2400),
        "the blocking query returned after {:?}",
        started.elapsed()
    );
    blocking
        .write_all(b"GET /v1/status/leader HTTP/1.1\r\nHost: test\r\n\r\n")
        .unwrap();
    assert!(read_response(&mut blocking).starts_with("HTTP/1.1 200"));
}
