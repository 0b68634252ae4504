//! The Consul coordinator (`coord::consul`) over real HTTP against a real `leaderq server`:
//! leases are sessions bound to the node's check, leadership is the leader key with the
//! ModifyIndex of the winning acquire as fencing token, queue writes are transactions
//! guarded by `check-session` and `check-index` on it, a restart that takes its session up
//! again campaigns under a higher token, and so does anyone after an operator deleted or
//! rewrote the key.

use std::process::Command;
use std::sync::Arc;

use leaderq::coord::consul::client::{Client, ClientConfig};
use leaderq::coord::consul::{ConsulCoordSettings, ConsulCoordinator};
use leaderq::coord::{
    admit, Campaign, CoordError, Coordinator, HolderRecord, Leadership, LeaseId, LeaseSpec,
    Renewal, StoredTask, TaskOp, TaskVersion, Version, Written,
};

use super::*;

const LEADER_KEY: &str = "consumerLeader";
const PREFIX: &str = "oracleTask/";

fn coordinator(server: &ServerProcess, health_check: bool) -> ConsulCoordinator {
    let client = Client::new(&ClientConfig {
        addresses: vec![server.addr.clone()],
        token: String::new(),
        token_file: String::new(),
        tls: Default::default(),
        request_timeout: Duration::from_secs(10),
    })
    .expect("client");
    ConsulCoordinator::new(
        Arc::new(client),
        ConsulCoordSettings {
            leader_key: LEADER_KEY.into(),
            health_check,
            txn_max_ops: 128,
            check_suffix: String::new(),
        },
    )
}

fn spec(node: &str) -> LeaseSpec {
    LeaseSpec {
        node_id: node.into(),
        ttl: Duration::from_secs(3),
        takeover_delay: Duration::from_millis(300),
        previous: None,
    }
}

fn record(node: &str, lease: &LeaseId) -> HolderRecord {
    HolderRecord {
        node: node.into(),
        host: "test-host".into(),
        pid: 1,
        session: lease.0.clone(),
        since: "2024-01-01T00:00:00Z".into(),
        floor: None,
    }
}

async fn won(coord: &ConsulCoordinator, lease: &LeaseId, node: &str) -> Leadership {
    match coord.campaign(lease, &record(node, lease)).await.unwrap() {
        Campaign::Won(leadership) => leadership,
        other => panic!("{node} did not win: {other:?}"),
    }
}

/// Campaigns until won, through lock-delay (`Delayed`), within `limit`.
async fn won_within(
    coord: &ConsulCoordinator,
    lease: &LeaseId,
    node: &str,
    limit: Duration,
) -> Leadership {
    wait_until(limit, &format!("{node} won"), async || {
        match coord.campaign(lease, &record(node, lease)).await.unwrap() {
            Campaign::Won(leadership) => Ok(leadership),
            Campaign::Delayed => Err("delayed"),
            other => panic!("{node} cannot win: {other:?}"),
        }
    })
    .await
}

async fn get_status_json(server: &ServerProcess, path: &str) -> (u16, Value) {
    let response = client().get(server.url(path)).send().await.unwrap();
    let status = response.status().as_u16();
    let text = response.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

async fn put_raw(server: &ServerProcess, key: &str, value: &str) {
    let response = client()
        .put(server.url(&format!("/v1/kv/{key}")))
        .body(value.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(response.text().await.unwrap(), "true");
}

/// An operator's `curl -X DELETE` of `key`.
async fn delete_raw(server: &ServerProcess, key: &str) {
    let response = client()
        .delete(server.url(&format!("/v1/kv/{key}")))
        .send()
        .await
        .unwrap();
    assert_eq!(response.text().await.unwrap(), "true");
}

async fn agent_check_ids(server: &ServerProcess) -> Vec<String> {
    let (_, checks) = get_status_json(server, "/v1/agent/checks").await;
    checks
        .as_object()
        .map(|checks| checks.keys().cloned().collect())
        .unwrap_or_default()
}

async fn session_exists(server: &ServerProcess, lease: &LeaseId) -> bool {
    let (_, info) = get_status_json(server, &format!("/v1/session/info/{lease}")).await;
    info.as_array().is_some_and(|sessions| !sessions.is_empty())
}

fn task_json(id: &str) -> String {
    json!({"taskId": id, "taskType": "Work", "taskTime": 1}).to_string()
}

fn find<'a>(tasks: &'a [StoredTask], key: &str) -> &'a StoredTask {
    tasks
        .iter()
        .find(|task| task.key == key)
        .unwrap_or_else(|| panic!("{key} not in {tasks:?}"))
}

/// A lease is a session named `leaderq:<node>` with behaviour release, bound to serfHealth
/// and the node's passing TTL check; it stays alive while kept alive, is gone once revoked,
/// and closing removes the check. The first open also removes a critical check an older
/// version left on this host for a process that is gone.
#[tokio::test]
async fn consul_lease_is_a_session_bound_to_the_nodes_check() {
    let server = ServerProcess::start();
    let host = leaderq::util::hostname();
    let mut gone = Command::new("true").spawn().unwrap();
    let dead_pid = gone.id();
    gone.wait().unwrap();
    let stale = format!("leaderq:{host}-{dead_pid}");
    let body = json!({"ID": stale, "Name": "old", "TTL": "30s", "Status": "critical"});
    let response = client()
        .put(server.url("/v1/agent/check/register"))
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);

    let coord = coordinator(&server, true);
    let grant = coord.open_lease(&spec("web-1")).await.unwrap();
    assert!(!grant.reused);
    let (_, info) = get_status_json(&server, &format!("/v1/session/info/{}", grant.lease)).await;
    let session = &info[0];
    assert_eq!(session["Name"], "leaderq:web-1");
    assert_eq!(session["Behavior"], "release");
    let mut checks: Vec<&str> = session["NodeChecks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap())
        .collect();
    checks.sort_unstable();
    assert_eq!(checks, ["leaderq:web-1", "serfHealth"]);
    let ids = agent_check_ids(&server).await;
    assert!(ids.contains(&"leaderq:web-1".to_string()), "{ids:?}");
    assert!(
        !ids.contains(&stale),
        "the stale check is still there: {ids:?}"
    );

    assert_eq!(
        coord.keep_alive(&grant.lease).await.unwrap(),
        Renewal::Alive
    );
    coord.revoke(&grant.lease).await.unwrap();
    assert!(!session_exists(&server, &grant.lease).await);
    assert_eq!(coord.keep_alive(&grant.lease).await.unwrap(), Renewal::Gone);
    coord.close(None).await.unwrap();
    let ids = agent_check_ids(&server).await;
    assert!(!ids.contains(&"leaderq:web-1".to_string()), "{ids:?}");
}

/// A TTL the coordinator refuses is `Refused`, with the setting to change named.
#[tokio::test]
async fn consul_lease_below_the_ttl_minimum_is_refused() {
    let server = ServerProcess::start();
    let coord = coordinator(&server, false);
    let mut spec = spec("web-1");
    spec.ttl = Duration::from_millis(500);
    match coord.open_lease(&spec).await {
        Err(CoordError::Refused(message)) => {
            assert!(message.contains("election.lease_ttl"), "{message}")
        }
        other => panic!("not refused: {other:?}"),
    }
}

/// One holder at a time, seen by observers with its record; a resignation frees the key at
/// once (a blocked observer wakes), a revoked lease's key waits out lock-delay, a lease
/// that is gone is told so, and every new leader's fencing token is higher.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consul_leadership_is_the_leader_key_with_a_rising_token() {
    let server = ServerProcess::start();
    let coord = Arc::new(coordinator(&server, true));
    let a = coord.open_lease(&spec("a")).await.unwrap().lease;
    let b = coord.open_lease(&spec("b")).await.unwrap().lease;

    let (free, _) = coord
        .observe(Version(0), Duration::from_secs(1))
        .await
        .unwrap();
    assert_eq!(free.lease, None);
    let first = won(&coord, &a, "a").await;
    assert_eq!(first.lease, a);
    assert_eq!(
        coord.campaign(&b, &record("b", &b)).await.unwrap(),
        Campaign::Held
    );
    let (held, version) = coord
        .observe(Version(0), Duration::from_secs(1))
        .await
        .unwrap();
    assert_eq!(held.lease, Some(a.clone()));
    assert_eq!(held.token, first.fencing_token);
    // The win wrote the record with the floor of its token (`leadership.rs`).
    let floorless = held.record.map(|r| HolderRecord { floor: None, ..r });
    assert_eq!(floorless, Some(record("a", &a)));

    let watcher = {
        let coord = coord.clone();
        tokio::spawn(async move { coord.observe(version, Duration::from_secs(20)).await })
    };
    let started = Instant::now();
    coord.resign(&first.lease).await.unwrap();
    let (released, after) = tokio::time::timeout(Duration::from_secs(5), watcher)
        .await
        .expect("the observer did not wake")
        .unwrap()
        .unwrap();
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(after > version);
    assert_eq!(released.lease, None);
    assert_eq!(
        released.record.map(|r| r.node),
        Some("a".to_string()),
        "the last holder's record is kept"
    );

    let second = won(&coord, &b, "b").await;
    assert!(second.fencing_token > first.fencing_token);
    coord.revoke(&b).await.unwrap();
    assert_eq!(
        coord.campaign(&a, &record("a", &a)).await.unwrap(),
        Campaign::Delayed,
        "lock-delay after a revoked holder"
    );
    let third = won_within(&coord, &a, "a", Duration::from_secs(5)).await;
    assert!(third.fencing_token > second.fencing_token);

    coord.resign(&third.lease).await.unwrap();
    assert_eq!(
        coord.campaign(&b, &record("b", &b)).await.unwrap(),
        Campaign::LeaseGone
    );
    coord.close(Some(&a)).await.unwrap();
    assert!(!session_exists(&server, &a).await);
    let ids = agent_check_ids(&server).await;
    assert!(
        !ids.iter().any(|id| id.starts_with("leaderq:")),
        "checks left behind: {ids:?}"
    );
}

/// Guarded writes: a claim under the current leadership is `Done` with the task's new
/// version and the token; a stale version is a `Conflict` naming the key; complete,
/// release, rewrite and move apply together; a deposed leadership's write is `NotLeader`
/// and applies nothing; the lease's own claims can still be put back after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consul_queue_writes_are_guarded_by_the_leadership() {
    let server = ServerProcess::start();
    let coord = Arc::new(coordinator(&server, false));
    for id in ["t1", "t2", "t3"] {
        put_raw(&server, &format!("{PREFIX}{id}"), &task_json(id)).await;
    }
    let a = coord.open_lease(&spec("a")).await.unwrap().lease;
    let b = coord.open_lease(&spec("b")).await.unwrap().lease;
    let leader = won(&coord, &a, "a").await;

    let (tasks, _) = coord
        .list(PREFIX, Version(0), Duration::from_secs(1))
        .await
        .unwrap();
    let keys: Vec<&str> = tasks.iter().map(|t| t.key.as_str()).collect();
    assert_eq!(keys, ["oracleTask/t1", "oracleTask/t2", "oracleTask/t3"]);
    assert!(tasks
        .iter()
        .all(|t| t.holder.is_none() && t.version > TaskVersion(0)));
    assert!(tasks.iter().all(|t| t.created == t.version.0));
    let (names, _) = coord.keys(PREFIX).await.unwrap();
    assert_eq!(names, keys);
    let [t1, t2, t3] = [0, 1, 2].map(|i| tasks[i].clone());

    let claimed = b"{\"taskTaken\":true}".to_vec();
    let claim = |task: &StoredTask, version: TaskVersion| TaskOp::Claim {
        key: task.key.clone(),
        version,
        value: claimed.clone(),
    };
    let Written::Done {
        versions,
        fencing_token,
    } = coord
        .write(&leader, &[claim(&t1, t1.version)])
        .await
        .unwrap()
    else {
        panic!("the claim was not applied");
    };
    assert_eq!(fencing_token, leader.fencing_token);
    assert_eq!(versions.len(), 1);
    assert_eq!(versions[0].0, t1.key);
    let t1_claimed = versions[0].1;
    assert!(t1_claimed > t1.version);
    let got = coord
        .get(&[t1.key.clone(), format!("{PREFIX}missing")])
        .await
        .unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].version, t1_claimed);
    assert_eq!(got[0].holder, Some(a.clone()));
    assert_eq!(got[0].value, claimed);

    assert_eq!(
        coord
            .write(&leader, &[claim(&t2, TaskVersion(t2.version.0 + 1000))])
            .await
            .unwrap(),
        Written::Conflict(vec![t2.key.clone()])
    );

    // A listing blocked at the queue's version wakes on the batch below.
    let (_, listed) = coord
        .list(PREFIX, Version(0), Duration::from_secs(1))
        .await
        .unwrap();
    let watcher = {
        let coord = coord.clone();
        tokio::spawn(async move { coord.list(PREFIX, listed, Duration::from_secs(20)).await })
    };
    let ops = [
        TaskOp::Complete {
            key: t1.key.clone(),
            version: t1_claimed,
        },
        claim(&t2, t2.version),
        TaskOp::Rewrite {
            key: t3.key.clone(),
            version: t3.version,
            value: b"{\"attempts\":1}".to_vec(),
        },
    ];
    let Written::Done { versions, .. } = coord.write(&leader, &ops).await.unwrap() else {
        panic!("the batch was not applied");
    };
    let version_of: HashMap<String, TaskVersion> = versions.into_iter().collect();
    assert_eq!(version_of.len(), 2, "{version_of:?}");
    let (after, moved) = tokio::time::timeout(Duration::from_secs(5), watcher)
        .await
        .expect("the listing did not wake")
        .unwrap()
        .unwrap();
    assert!(moved > listed);
    let keys: Vec<&str> = after.iter().map(|t| t.key.as_str()).collect();
    assert_eq!(keys, ["oracleTask/t2", "oracleTask/t3"]);
    assert_eq!(find(&after, &t2.key).version, version_of[&t2.key]);
    assert_eq!(find(&after, &t2.key).holder, Some(a.clone()));
    assert_eq!(find(&after, &t3.key).version, version_of[&t3.key]);
    assert_eq!(find(&after, &t3.key).value, b"{\"attempts\":1}");

    let dead = "oracleTaskDead/t3".to_string();
    let ops = [
        TaskOp::Release {
            key: t2.key.clone(),
            version: version_of[&t2.key],
            value: b"{\"released\":true}".to_vec(),
        },
        TaskOp::Move {
            key: t3.key.clone(),
            version: version_of[&t3.key],
            to: dead.clone(),
            value: b"{\"dead\":true}".to_vec(),
        },
    ];
    let Written::Done { versions, .. } = coord.write(&leader, &ops).await.unwrap() else {
        panic!("release and move were not applied");
    };
    assert_eq!(versions.len(), 1);
    let (left, _) = coord
        .list(PREFIX, Version(0), Duration::from_secs(1))
        .await
        .unwrap();
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].holder, None);
    assert_eq!(left[0].version, versions[0].1);
    let (dead_letters, _) = coord
        .list("oracleTaskDead/", Version(0), Duration::from_secs(1))
        .await
        .unwrap();
    assert_eq!(dead_letters.len(), 1);
    assert_eq!(dead_letters[0].key, dead);

    // Deposed: a's writes apply nothing, b's own claims can be put back without leading.
    coord.resign(&leader.lease).await.unwrap();
    let second = won(&coord, &b, "b").await;
    let t2_now = left[0].clone();
    assert_eq!(
        coord
            .write(&leader, &[claim(&t2_now, t2_now.version)])
            .await
            .unwrap(),
        Written::NotLeader
    );
    let Written::Done { versions, .. } = coord
        .write(&second, &[claim(&t2_now, t2_now.version)])
        .await
        .unwrap()
    else {
        panic!("the new leader's claim was not applied");
    };
    coord.resign(&second.lease).await.unwrap();
    coord
        .write_own(
            &b,
            &[TaskOp::Release {
                key: t2_now.key.clone(),
                version: versions[0].1,
                value: t2_now.value.clone(),
            }],
        )
        .await
        .unwrap();
    let got = coord.get(std::slice::from_ref(&t2_now.key)).await.unwrap();
    assert_eq!(got[0].holder, None);
    assert_eq!(got[0].value, t2_now.value);
}

/// A replica restarted on its data dir takes up its session (the coordinator still honours
/// it) and campaigns anew: the key is taken again in one transaction, so the token rises
/// past the one the earlier run handed out. A previous session that no longer fits (another
/// TTL) is released and destroyed instead, and leadership is free at once.
#[tokio::test]
async fn consul_restart_takes_up_its_session_under_a_higher_token() {
    let server = ServerProcess::start();
    let before = coordinator(&server, true);
    let a = before.open_lease(&spec("a")).await.unwrap().lease;
    let first = won(&before, &a, "a").await;
    drop(before);

    let after = coordinator(&server, true);
    let mut again = spec("a");
    again.previous = Some(a.clone());
    let grant = after.open_lease(&again).await.unwrap();
    assert!(grant.reused);
    assert_eq!(grant.lease, a);
    let second = won(&after, &a, "a").await;
    assert!(second.fencing_token > first.fencing_token);
    let (holder, _) = after
        .observe(Version(0), Duration::from_secs(1))
        .await
        .unwrap();
    assert_eq!(holder.lease, Some(a.clone()));
    assert_eq!(holder.token, second.fencing_token);

    // Another node's session is not taken up.
    let mut other = spec("b");
    other.previous = Some(a.clone());
    let b = after.open_lease(&other).await.unwrap();
    assert!(!b.reused);
    assert!(session_exists(&server, &a).await);

    let changed = coordinator(&server, true);
    let mut longer = spec("a");
    longer.ttl = Duration::from_secs(4);
    longer.previous = Some(a.clone());
    let grant = changed.open_lease(&longer).await.unwrap();
    assert!(!grant.reused);
    assert!(!session_exists(&server, &a).await);
    let (holder, _) = changed
        .observe(Version(0), Duration::from_secs(1))
        .await
        .unwrap();
    assert_eq!(holder.lease, None);
    let third = won(&changed, &grant.lease, "a").await;
    assert!(third.fencing_token > second.fencing_token);
}

/// An operator deletes the leader key under its holder (`curl -X DELETE`): the holder's
/// guarded write answers NotLeader and claims nothing, and the next leader's token is
/// above the deleted one's, though Consul's LockIndex of the key created anew is 1 again;
/// standbys observe the same token the new leader holds, and its writes commit under it.
#[tokio::test]
async fn consul_token_rises_after_an_operator_deletes_the_leader_key() {
    let server = ServerProcess::start();
    let coord = coordinator(&server, false);
    put_raw(&server, &format!("{PREFIX}t1"), &task_json("t1")).await;
    let (tasks, _) = coord
        .list(PREFIX, Version(0), Duration::from_secs(1))
        .await
        .unwrap();
    let a = coord.open_lease(&spec("a")).await.unwrap().lease;
    let b = coord.open_lease(&spec("b")).await.unwrap().lease;
    let first = won(&coord, &a, "a").await;

    delete_raw(&server, LEADER_KEY).await;
    let claim = TaskOp::Claim {
        key: tasks[0].key.clone(),
        version: tasks[0].version,
        value: b"{\"taskTaken\":true}".to_vec(),
    };
    assert_eq!(
        coord
            .write(&first, std::slice::from_ref(&claim))
            .await
            .unwrap(),
        Written::NotLeader
    );
    let second = won(&coord, &b, "b").await;
    assert!(
        second.fencing_token > first.fencing_token,
        "the token after the leader key was deleted is {}, not above {}",
        second.fencing_token,
        first.fencing_token
    );
    let (holder, _) = coord
        .observe(Version(0), Duration::from_secs(1))
        .await
        .unwrap();
    assert_eq!(holder.lease, Some(b.clone()));
    assert_eq!(holder.token, second.fencing_token);
    let Written::Done { fencing_token, .. } = coord.write(&second, &[claim]).await.unwrap() else {
        panic!("the new leader's claim was not applied");
    };
    assert_eq!(fencing_token, second.fencing_token);
}

/// An operator PUTs over the leader key's value (a rewrite without an acquire, which keeps
/// the lock's session): the holder's guarded write answers NotLeader and claims nothing.
/// Its next campaign takes the key again under a higher token, and writes under that; the
/// earlier leadership of the same session writes nothing, then or ever.
#[tokio::test]
async fn consul_rewriting_the_leader_key_deposes_its_holder() {
    let server = ServerProcess::start();
    let coord = coordinator(&server, false);
    put_raw(&server, &format!("{PREFIX}t1"), &task_json("t1")).await;
    let (tasks, _) = coord
        .list(PREFIX, Version(0), Duration::from_secs(1))
        .await
        .unwrap();
    let a = coord.open_lease(&spec("a")).await.unwrap().lease;
    let first = won(&coord, &a, "a").await;

    put_raw(&server, LEADER_KEY, "{\"node\":\"by-hand\"}").await;
    let claim = TaskOp::Claim {
        key: tasks[0].key.clone(),
        version: tasks[0].version,
        value: b"{\"taskTaken\":true}".to_vec(),
    };
    assert_eq!(
        coord
            .write(&first, std::slice::from_ref(&claim))
            .await
            .unwrap(),
        Written::NotLeader
    );
    let got = coord
        .get(std::slice::from_ref(&tasks[0].key))
        .await
        .unwrap();
    assert_eq!(got, tasks, "a deposed holder's claim was applied");

    let again = won(&coord, &a, "a").await;
    assert!(again.fencing_token > first.fencing_token);
    // The same session holds the key again, under the new win's index: the earlier
    // leadership's guard still fails.
    assert_eq!(
        coord
            .write(&first, std::slice::from_ref(&claim))
            .await
            .unwrap(),
        Written::NotLeader
    );
    let Written::Done { fencing_token, .. } = coord.write(&again, &[claim]).await.unwrap() else {
        panic!("the claim under the new leadership was not applied");
    };
    assert_eq!(fencing_token, again.fencing_token);
}

/// A write at the coordinator's limits (the most operations, values up to the byte budget)
/// is applied; one over Consul's own limits is `Refused`, not retried as if it could pass.
#[tokio::test]
async fn consul_writes_within_the_limits_apply_and_beyond_them_are_refused() {
    let server = ServerProcess::start();
    let coord = coordinator(&server, false);
    let limits = coord.limits();
    // A claim is two of Consul's operations (check-index and lock) beside the guard's two
    // (check-session and check-index on the leader key).
    let count = (limits.max_ops - 2) / 2;
    let keys: Vec<String> = (0..count).map(|i| format!("{PREFIX}big-{i:02}")).collect();
    for key in &keys {
        put_raw(&server, key, "{}").await;
    }
    let (tasks, _) = coord
        .list(PREFIX, Version(0), Duration::from_secs(1))
        .await
        .unwrap();
    let a = coord.open_lease(&spec("a")).await.unwrap().lease;
    let leader = won(&coord, &a, "a").await;
    let claims = |value_len: usize| -> Vec<TaskOp> {
        tasks
            .iter()
            .map(|task| TaskOp::Claim {
                key: task.key.clone(),
                version: task.version,
                value: vec![b'x'; value_len],
            })
            .collect()
    };
    // The largest values the limits admit (values travel base64-encoded: about 3/4).
    let mut value_len = limits.max_bytes * 3 / 4 / count;
    while admit(&coord, &claims(value_len), true).is_err() {
        value_len -= value_len / 100 + 1;
    }
    assert!(value_len > limits.max_bytes / 2 / count, "{value_len}");
    let ops = claims(value_len);
    let Written::Done { versions, .. } = coord.write(&leader, &ops).await.unwrap() else {
        panic!("a write within the limits was not applied");
    };
    assert_eq!(versions.len(), count);

    let too_many: Vec<TaskOp> = (0..100)
        .map(|i| TaskOp::Complete {
            key: format!("{PREFIX}none-{i}"),
            version: TaskVersion(1),
        })
        .flat_map(|op| [op.clone(), op])
        .collect();
    match coord.write(&leader, &too_many).await {
        // Refused before it is sent: over the limits Consul keeps.
        Err(CoordError::Refused(message)) => assert!(message.contains("limits"), "{message}"),
        other => panic!("not refused: {other:?}"),
    }
}
