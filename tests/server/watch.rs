//! Blocking queries wake only for what they read (the key, the prefix, the table), and reads
//! never wait for a commit that is still on its way to disk.

use std::time::{Duration, Instant};

use tokio::task::JoinHandle;

use super::*;

/// A request running in the background.
fn spawn_get(url: String) -> JoinHandle<reqwest::Response> {
    tokio::spawn(async move { client().get(url).send().await.unwrap() })
}

/// The value of one metric of the server's `/metrics`.
async fn metric(server: &ServerProcess, name: &str) -> f64 {
    let text = get(server, "/metrics").await.text().await.unwrap();
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no metric {name} in:\n{text}"))
}

/// A blocking GET of a missing key is not ended by writes and deletes of other keys: it
/// returns at the end of its wait, 404 still.
#[tokio::test]
async fn blocking_get_of_a_missing_key_returns_at_its_wait_despite_other_writes() {
    let server = ServerProcess::start();
    put(&server, "/v1/kv/other/a", "1").await;
    let missing = get(&server, "/v1/kv/watched/key").await;
    assert_eq!(missing.status(), 404);
    let index = index_of(&missing);

    let started = Instant::now();
    let waiter = spawn_get(server.url(&format!("/v1/kv/watched/key?index={index}&wait=1s")));
    wait_until_blocked(&server.addr, 1).await;
    for n in 0..3 {
        put(&server, &format!("/v1/kv/other/{n}"), "x").await;
    }
    client()
        .delete(server.url("/v1/kv/other/a"))
        .send()
        .await
        .unwrap();
    let answer = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the wait ends")
        .unwrap();
    assert_eq!(answer.status(), 404);
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "a write to another key ended the wait after {:?}",
        started.elapsed()
    );
}

/// A blocking GET of a missing key returns as soon as that key is written, and a blocking
/// GET of a key returns when it is deleted.
#[tokio::test]
async fn blocking_get_of_a_missing_key_wakes_when_that_key_is_written() {
    let server = ServerProcess::start();
    let index = index_of(&get(&server, "/v1/kv/watched/key").await);
    let mut waiter = spawn_get(server.url(&format!("/v1/kv/watched/key?index={index}&wait=30s")));
    wait_until_blocked(&server.addr, 1).await;
    put(&server, "/v1/kv/other/a", "x").await;
    put(
        &server,
        "/v1/kv/watched/keys",
        "a longer key with this one's name as prefix",
    )
    .await;
    assert!(
        tokio::time::timeout(SETTLE, &mut waiter).await.is_err(),
        "a write to another key woke the query"
    );

    put(&server, "/v1/kv/watched/key", "v").await;
    let woke = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the write wakes the query")
        .unwrap();
    assert_eq!(woke.status(), 200);
    let written = index_of(&woke);
    assert!(written > index);

    let waiter = spawn_get(server.url(&format!("/v1/kv/watched/key?index={written}&wait=30s")));
    wait_until_blocked(&server.addr, 1).await;
    client()
        .delete(server.url("/v1/kv/watched/key"))
        .send()
        .await
        .unwrap();
    let woke = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the delete wakes the query")
        .unwrap();
    assert_eq!(woke.status(), 404);
    assert!(index_of(&woke) > written);
}

/// A blocking list (`?recurse`, `?keys`) of a prefix with nothing under it is not ended by
/// writes outside the prefix, not even by a key that extends the prefix's text; a write
/// under it ends the wait.
#[tokio::test]
async fn blocking_list_is_not_woken_by_writes_outside_its_prefix() {
    let server = ServerProcess::start();
    put(&server, "/v1/kv/other/a", "1").await;
    for (prefix, query) in [("jobs/", "recurse"), ("tasks/", "keys&separator=/")] {
        let first = get(&server, &format!("/v1/kv/{prefix}?{query}")).await;
        assert_eq!(first.status(), 404);
        let index = index_of(&first);
        let mut waiter =
            spawn_get(server.url(&format!("/v1/kv/{prefix}?{query}&index={index}&wait=30s")));
        wait_until_blocked(&server.addr, 1).await;
        put(
            &server,
            &format!("/v1/kv/{}x", prefix.trim_end_matches('/')),
            "x",
        )
        .await;
        put(&server, "/v1/kv/other/b", "x").await;
        client()
            .delete(server.url("/v1/kv/other/?recurse"))
            .send()
            .await
            .unwrap();
        assert!(
            tokio::time::timeout(SETTLE, &mut waiter).await.is_err(),
            "a write outside {prefix} woke the {query} listing"
        );

        put(&server, &format!("/v1/kv/{prefix}deep/one"), "1").await;
        let woke = tokio::time::timeout(Duration::from_secs(10), waiter)
            .await
            .expect("a write under the prefix wakes the listing")
            .unwrap();
        assert_eq!(woke.status(), 200, "{query}");
        assert!(index_of(&woke) > index);
    }
}

/// A read made while a slow commit is on its way to disk answers at once, from the last
/// committed state: the write in flight is not visible until it is durable.
#[tokio::test]
async fn a_read_does_not_wait_for_a_commit_in_flight() {
    let delay = Duration::from_secs(1);
    let server = ServerProcess::start_in_temp(&["--test-commit-delay", "1s"]);
    put(&server, "/v1/kv/slow/a", "1").await;

    let write_started = Instant::now();
    let url = server.url("/v1/kv/slow/b");
    let writing = tokio::spawn(async move { client().put(url).body("2").send().await.unwrap() });
    // Let the write reach the writer, which then spends `delay` on its commit.
    tokio::time::sleep(Duration::from_millis(200)).await;

    let started = Instant::now();
    let read = get(&server, "/v1/kv/slow/a").await;
    let took = started.elapsed();
    assert_eq!(read.status(), 200);
    assert!(
        took < Duration::from_millis(400),
        "the read waited {took:?} for the commit in flight"
    );
    let unacknowledged = get(&server, "/v1/kv/slow/b").await;
    assert!(
        write_started.elapsed() < delay,
        "the commit was not in flight"
    );
    assert_eq!(
        unacknowledged.status(),
        404,
        "a write was seen before its commit"
    );

    let written = writing.await.unwrap();
    assert_eq!(written.text().await.unwrap(), "true");
    assert!(write_started.elapsed() >= delay);
    assert_eq!(get(&server, "/v1/kv/slow/b").await.status(), 200);
}

/// Two updates written back to back, the second sent while the first is being committed, are
/// each seen by every query watching the key, with rising indexes, even though the second
/// commit is slow: a query woken by the first commit reads without waiting for the next.
#[tokio::test]
async fn back_to_back_updates_of_a_watched_key_are_each_observed() {
    const WATCHERS: usize = 30;
    let server = ServerProcess::start_in_temp(&["--test-commit-delay", "300ms"]);
    put(&server, "/v1/kv/watched", "0").await;
    let start = index_of(&get(&server, "/v1/kv/watched").await);

    let mut watchers = Vec::new();
    for _ in 0..WATCHERS {
        let url = server.url("/v1/kv/watched");
        watchers.push(tokio::spawn(async move {
            let mut seen = Vec::new();
            let mut index = start;
            for _ in 0..2 {
                let response = client()
                    .get(format!("{url}?index={index}&wait=3s"))
                    .send()
                    .await
                    .unwrap();
                index = index_of(&response);
                let entries: Value = response.json().await.unwrap();
                seen.push((index, entries[0]["Value"].as_str().unwrap().to_string()));
            }
            seen
        }));
    }
    wait_until_blocked(&server.addr, WATCHERS).await;
    let url = server.url("/v1/kv/watched");
    let first = tokio::spawn(async move { client().put(url).body("1").send().await.unwrap() });
    // The second update queues behind the first one's slow commit, so the writer starts
    // committing it the moment the first is published.
    tokio::time::sleep(Duration::from_millis(100)).await;
    put(&server, "/v1/kv/watched", "2").await;
    assert_eq!(first.await.unwrap().status(), 200);

    for watcher in watchers {
        let seen = tokio::time::timeout(Duration::from_secs(20), watcher)
            .await
            .expect("watchers finish")
            .unwrap();
        let values: Vec<&str> = seen.iter().map(|(_, value)| value.as_str()).collect();
        assert_eq!(values, [b64("1"), b64("2")], "a watcher missed an update");
        assert!(start < seen[0].0 && seen[0].0 < seen[1].0, "{seen:?}");
    }
}

/// A write wakes only the blocked queries that read what it changed: of twenty queries on
/// twenty keys and one on the session list, a write to one key wakes one query.
#[tokio::test]
async fn a_write_wakes_only_the_queries_that_read_what_it_changed() {
    const KEYS: usize = 20;
    let server = ServerProcess::start();
    let mut indexes = Vec::new();
    for n in 0..KEYS {
        put(&server, &format!("/v1/kv/many/{n}"), "0").await;
        indexes.push(index_of(&get(&server, &format!("/v1/kv/many/{n}")).await));
    }
    let sessions = index_of(&get(&server, "/v1/session/list").await);
    let session_waiter =
        spawn_get(server.url(&format!("/v1/session/list?index={sessions}&wait=30s")));
    let mut waiters: Vec<_> = indexes
        .iter()
        .enumerate()
        .map(|(n, index)| spawn_get(server.url(&format!("/v1/kv/many/{n}?index={index}&wait=30s"))))
        .collect();
    wait_until_blocked(&server.addr, KEYS + 1).await;
    let before = metric(&server, "leaderq_server_blocked_query_wakeups_total").await;

    put(&server, "/v1/kv/many/0", "1").await;
    let woke = tokio::time::timeout(Duration::from_secs(10), waiters.remove(0))
        .await
        .expect("the written key's query wakes")
        .unwrap();
    assert_eq!(woke.status(), 200);
    // Asserts that nothing happens: a query the write wrongly woke would be counted by then.
    tokio::time::sleep(SETTLE).await;
    let after = metric(&server, "leaderq_server_blocked_query_wakeups_total").await;
    assert_eq!(
        after - before,
        1.0,
        "one write woke {} queries",
        after - before
    );
    assert!(waiters.iter().all(|waiter| !waiter.is_finished()));
    assert!(!session_waiter.is_finished());
}
