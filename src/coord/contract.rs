//! The contract every coordinator passes: the module header of [`crate::coord`] as checks
//! that run against any [`Coordinator`], the in-memory one in unit tests and real servers
//! (`leaderq server` through the Consul backend, later ZooKeeper, Redis, etcd) in the
//! integration tests.
//!
//! Each check takes a fresh [`Subject`] (a coordinator nobody else uses, a producer to
//! write tasks with, prefixes of its own and the timing to use) and answers `Ok(())` or
//! what broke. [`CHECKS`] lists them all; [`run_all`] runs them at once and reports every
//! failure. The checks only use the trait and wait with `tokio::time`, so a coordinator on
//! tokio's paused clock runs the whole suite in no real time, and a real server with a 1 s
//! TTL in a few seconds.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::{
    Campaign, CoordError, CoordFuture, Coordinator, HolderRecord, Leadership, LeaseId, LeaseSpec,
    Renewal, StoredTask, TaskOp, Version, Written,
};

/// How the checks write tasks: as a producer does, outside the coordinator trait (a KV
/// PUT on Consul).
pub trait Producer: Send + Sync {
    /// Creates the task at `key` or replaces its value.
    fn put<'a>(&'a self, key: &'a str, value: &'a [u8]) -> CoordFuture<'a, ()>;
}

/// The times a run uses: the backend's shortest TTL keeps the suite fast.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timing {
    /// The TTL of every lease the checks open; also the lock-delay where one is wanted.
    pub ttl: Duration,
    /// How long after its last keep-alive the backend may take to end a lease (Consul ends
    /// a session after twice its TTL, and its timer may run a little late).
    pub expiry: Duration,
}

impl Timing {
    /// `ttl`, and an expiry bound of three TTLs.
    pub fn new(ttl: Duration) -> Timing {
        Timing {
            ttl,
            expiry: ttl * 3,
        }
    }
}

/// What one check runs against. Make a fresh one for every check: a coordinator with a
/// leadership no one else contends for, and prefixes no other check writes under.
#[derive(Clone)]
pub struct Subject {
    /// The coordinator under test.
    pub coord: Arc<dyn Coordinator>,
    /// Writes tasks into that same coordinator.
    pub producer: Arc<dyn Producer>,
    /// Where the checks' tasks live, e.g. `contract/<check>/queue/`.
    pub queue_prefix: String,
    /// Where they dead-letter tasks; must not lie under `queue_prefix`.
    pub dead_prefix: String,
    pub timing: Timing,
}

/// What a check returns: `Err` says what broke.
pub type CheckFuture = Pin<Box<dyn Future<Output = Result<(), String>> + Send>>;

/// One check of the contract.
#[derive(Clone, Copy)]
pub struct Check {
    /// The check's function name, a sentence of what it shows.
    pub name: &'static str,
    /// Runs the check on a fresh subject.
    pub run: fn(Subject) -> CheckFuture,
}

impl std::fmt::Debug for Check {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

macro_rules! checks {
    ($($name:ident),* $(,)?) => {
        /// Every check of the contract, in the order of this module.
        pub const CHECKS: &[Check] = &[
            $(Check { name: stringify!($name), run: |subject| Box::pin($name(subject)) }),*
        ];
    };
}

checks!(
    one_leader_among_concurrent_campaigners,
    fencing_rises_across_leaders,
    lock_delay_follows_a_death_not_a_resignation,
    previous_lease_is_taken_up_only_if_alive_and_own,
    deposed_leader_writes_nothing,
    conflict_names_the_key_and_applies_nothing,
    completing_or_moving_a_gone_task_conflicts,
    claim_and_complete_follow_versions,
    list_gives_versions_and_creation_order,
    list_and_observe_wait_for_a_change_or_the_wait,
    dead_lease_leaves_its_claims_unheld,
    move_and_rewrite_keep_the_data,
    write_own_touches_only_own_claims,
    write_own_cannot_complete_or_move_what_it_does_not_hold,
    over_limit_writes_are_refused_whole,
    keep_alive_of_an_ended_lease_is_gone,
);

/// Runs every check at once, each on a subject from `make(check name)`, each bounded in
/// time; `Err` lists every check that failed and why.
pub async fn run_all<F, Fut>(make: F) -> Result<(), String>
where
    F: Fn(&'static str) -> Fut,
    Fut: Future<Output = Subject>,
{
    let mut runs = Vec::new();
    for check in CHECKS {
        let subject = make(check.name).await;
        runs.push((check.name, tokio::spawn(run_one(*check, subject))));
    }
    let mut failures = Vec::new();
    for (name, run) in runs {
        match run.await {
            Ok(Ok(())) => {}
            Ok(Err(why)) => failures.push(format!("{name}: {why}")),
            Err(err) => failures.push(format!("{name}: panicked: {err}")),
        }
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures.join("\n"))
    }
}

/// Runs one check, failing it if it takes far longer than its waits allow (a hang).
pub async fn run_one(check: Check, subject: Subject) -> Result<(), String> {
    let bound = subject.timing.expiry * 10 + Duration::from_secs(10);
    match tokio::time::timeout(bound, (check.run)(subject)).await {
        Ok(result) => result,
        Err(_) => Err(format!("no answer within {bound:?}: a call hangs")),
    }
}

// ---- the checks ----

/// Of several leases campaigning at once, exactly one wins; the others hear `Held`, and
/// the holder observed is the winner, with its record and token.
pub async fn one_leader_among_concurrent_campaigners(s: Subject) -> Result<(), String> {
    const CAMPAIGNERS: usize = 5;
    let mut leases = Vec::new();
    for n in 0..CAMPAIGNERS {
        leases.push(open(&s, &format!("node-{n}"), Duration::ZERO).await?);
    }
    let _renewers: Vec<Renewer> = leases.iter().map(|l| Renewer::start(&s, l)).collect();
    let mut runs = Vec::new();
    for (n, lease) in leases.iter().enumerate() {
        let coord = s.coord.clone();
        let lease = lease.clone();
        runs.push(tokio::spawn(async move {
            coord.campaign(&lease, &record(&format!("node-{n}"))).await
        }));
    }
    let mut winners = Vec::new();
    for (n, run) in runs.into_iter().enumerate() {
        match run
            .await
            .map_err(|err| format!("campaign panicked: {err}"))?
        {
            Ok(Campaign::Won(leadership)) => winners.push((n, leadership)),
            Ok(Campaign::Held) => {}
            other => return Err(format!("a losing campaign answered {other:?}, not Held")),
        }
    }
    let [(n, leadership)] = winners.as_slice() else {
        return Err(format!("{} campaigns won, not one", winners.len()));
    };
    let (holder, _) = s
        .coord
        .observe(Version(0), Duration::ZERO)
        .await
        .ctx("observe")?;
    ensure(holder.lease.as_ref() == Some(&leadership.lease), || {
        format!("the holder observed is {holder:?}, not the winner {leadership:?}")
    })?;
    ensure(
        holder.record.as_ref().map(|r| r.node.as_str()) == Some(format!("node-{n}").as_str()),
        || {
            format!(
                "the holder's record is {:?}, not the winner's",
                holder.record
            )
        },
    )?;
    ensure(holder.token == leadership.fencing_token, || {
        format!(
            "the holder's token is {}, the winner's {}",
            holder.token, leadership.fencing_token
        )
    })
}

/// Every new leadership gets a token above all before it: after a resignation, a
/// revocation, a re-campaign by the holder, a restart that took its lease up again, and
/// the expiry of a lease not kept alive.
pub async fn fencing_rises_across_leaders(s: Subject) -> Result<(), String> {
    let a = open(&s, "node-a", Duration::ZERO).await?;
    let b = open(&s, "node-b", Duration::ZERO).await?;
    let _renew_a = Renewer::start(&s, &a);
    let _renew_b = Renewer::start(&s, &b);
    let mut tokens = Vec::new();

    let first = lead(&s, &a, "node-a").await?;
    tokens.push(("first", first.fencing_token));
    let again = lead(&s, &a, "node-a").await?;
    tokens.push(("a re-campaign by the holder", again.fencing_token));
    s.coord.resign(&again).await.ctx("resign")?;
    let by_b = lead(&s, &b, "node-b").await?;
    tokens.push(("after a resignation", by_b.fencing_token));
    s.coord.revoke(&b).await.ctx("revoke")?;
    let by_a = lead(&s, &a, "node-a").await?;
    tokens.push(("after a revocation", by_a.fencing_token));

    let grant = s
        .coord
        .open_lease(&spec(&s, "node-a", Duration::ZERO, Some(a.clone())))
        .await
        .ctx("open_lease with the previous lease")?;
    ensure(grant.reused && grant.lease == a, || {
        format!("a live lease of the same node was not taken up: {grant:?}")
    })?;
    let restarted = lead(&s, &a, "node-a").await?;
    tokens.push(("after a restart on the same lease", restarted.fencing_token));
    let (holder, _) = s
        .coord
        .observe(Version(0), Duration::ZERO)
        .await
        .ctx("observe")?;
    ensure(holder.token == restarted.fencing_token, || {
        format!(
            "the holder's token is {}, the leader's {}",
            holder.token, restarted.fencing_token
        )
    })?;
    s.coord.revoke(&a).await.ctx("revoke")?;

    let e = open(&s, "node-e", Duration::ZERO).await?;
    let by_e = lead(&s, &e, "node-e").await?;
    tokens.push(("a lease left to expire", by_e.fencing_token));
    wait_until_not_held_by(&s, &e).await?;
    let f = open(&s, "node-f", Duration::ZERO).await?;
    let by_f = lead(&s, &f, "node-f").await?;
    tokens.push(("after an expiry", by_f.fencing_token));

    for pair in tokens.windows(2) {
        let ((_, before), (when, after)) = (pair[0], pair[1]);
        ensure(after > before, || {
            format!("the token {when} is {after}, not above {before}: tokens {tokens:?}")
        })?;
    }
    Ok(())
}

/// A lease that dies holding leadership keeps it from being taken for its lock-delay
/// (`Delayed`, then `Won`); a resignation frees it at once.
pub async fn lock_delay_follows_a_death_not_a_resignation(s: Subject) -> Result<(), String> {
    let delay = s.timing.ttl;
    let a = open(&s, "node-a", delay).await?;
    let b = open(&s, "node-b", delay).await?;
    let _renew_a = Renewer::start(&s, &a);
    let _renew_b = Renewer::start(&s, &b);
    let by_a = lead(&s, &a, "node-a").await?;
    s.coord.resign(&by_a).await.ctx("resign")?;
    lead(&s, &b, "node-b")
        .await
        .map_err(|why| format!("after a resignation: {why}"))?;

    s.coord.revoke(&b).await.ctx("revoke")?;
    let revoked = Instant::now();
    match s
        .coord
        .campaign(&a, &record("node-a"))
        .await
        .ctx("campaign")?
    {
        Campaign::Delayed => {}
        other => {
            return Err(format!(
            "a campaign right after the holder's lease was revoked answered {other:?}, not Delayed"
        ))
        }
    }
    loop {
        match s.coord.campaign(&a, &record("node-a")).await.ctx("campaign")? {
            Campaign::Won(_) => break,
            Campaign::Delayed if revoked.elapsed() < delay + s.timing.expiry => {
                tokio::time::sleep(delay / 4).await;
            }
            other => {
                return Err(format!(
                    "{:?} after the revocation a campaign answered {other:?}, with a lock-delay of {delay:?}",
                    revoked.elapsed()
                ))
            }
        }
    }
    ensure(revoked.elapsed() >= delay / 2, || {
        format!(
            "the lock-delay of {delay:?} ended after {:?}",
            revoked.elapsed()
        )
    })
}

/// `open_lease` takes up the previous lease only if it is alive and this node's own; a
/// campaign with an ended lease answers `LeaseGone`.
pub async fn previous_lease_is_taken_up_only_if_alive_and_own(s: Subject) -> Result<(), String> {
    let a = open(&s, "node-a", Duration::ZERO).await?;
    let _renew_a = Renewer::start(&s, &a);
    let other = s
        .coord
        .open_lease(&spec(&s, "node-b", Duration::ZERO, Some(a.clone())))
        .await
        .ctx("open_lease")?;
    ensure(!other.reused && other.lease != a, || {
        format!("another node took up node-a's lease: {other:?}")
    })?;
    let own = s
        .coord
        .open_lease(&spec(&s, "node-a", Duration::ZERO, Some(a.clone())))
        .await
        .ctx("open_lease")?;
    ensure(own.reused && own.lease == a, || {
        format!("node-a did not take up its own live lease: {own:?}")
    })?;
    s.coord.revoke(&a).await.ctx("revoke")?;
    let after = s
        .coord
        .open_lease(&spec(&s, "node-a", Duration::ZERO, Some(a.clone())))
        .await
        .ctx("open_lease")?;
    ensure(!after.reused && after.lease != a, || {
        format!("a revoked lease was taken up: {after:?}")
    })?;
    match s
        .coord
        .campaign(&a, &record("node-a"))
        .await
        .ctx("campaign")?
    {
        Campaign::LeaseGone => Ok(()),
        other => Err(format!(
            "a campaign with a revoked lease answered {other:?}, not LeaseGone"
        )),
    }
}

/// A leader that resigned, or whose lease was revoked, writes nothing: every write answers
/// `NotLeader` and the task stays as it was.
pub async fn deposed_leader_writes_nothing(s: Subject) -> Result<(), String> {
    let a = open(&s, "node-a", Duration::ZERO).await?;
    let b = open(&s, "node-b", Duration::ZERO).await?;
    let _renew_a = Renewer::start(&s, &a);
    let _renew_b = Renewer::start(&s, &b);
    let key = put(&s, "t1", b"{\"n\":1}").await?;
    let before = get_one(&s, &key).await?;
    let by_a = lead(&s, &a, "node-a").await?;
    s.coord.resign(&by_a).await.ctx("resign")?;
    let by_b = lead(&s, &b, "node-b").await?;
    let writes = |version| {
        [
            claim(&key, version, b"{\"taken\":true}"),
            TaskOp::Complete {
                key: key.clone(),
                version,
            },
        ]
    };
    for op in writes(before.version) {
        let written = s
            .coord
            .write(&by_a, std::slice::from_ref(&op))
            .await
            .ctx("write")?;
        ensure(written == Written::NotLeader, || {
            format!("{op:?} by a resigned leader answered {written:?}, not NotLeader")
        })?;
    }
    s.coord.revoke(&b).await.ctx("revoke")?;
    for op in writes(before.version) {
        let written = s
            .coord
            .write(&by_b, std::slice::from_ref(&op))
            .await
            .ctx("write")?;
        ensure(written == Written::NotLeader, || {
            format!(
                "{op:?} by a leader whose lease was revoked answered {written:?}, not NotLeader"
            )
        })?;
    }
    let after = get_one(&s, &key).await?;
    ensure(after == before, || {
        format!("writes by deposed leaders changed the task: {before:?} became {after:?}")
    })
}

/// A batch with one stale version answers `Conflict` naming that task alone and applies
/// none of its ops.
pub async fn conflict_names_the_key_and_applies_nothing(s: Subject) -> Result<(), String> {
    let a = open(&s, "node-a", Duration::ZERO).await?;
    let _renew = Renewer::start(&s, &a);
    let leader = lead(&s, &a, "node-a").await?;
    let k1 = put(&s, "t1", b"{\"n\":1}").await?;
    let k2 = put(&s, "t2", b"{\"n\":2}").await?;
    let t1 = get_one(&s, &k1).await?;
    let stale = get_one(&s, &k2).await?;
    put(&s, "t2", b"{\"n\":2,\"again\":true}").await?;
    let ops = [
        claim(&k1, t1.version, b"{\"taken\":1}"),
        claim(&k2, stale.version, b"{\"taken\":2}"),
    ];
    let written = s.coord.write(&leader, &ops).await.ctx("write")?;
    ensure(written == Written::Conflict(vec![k2.clone()]), || {
        format!("a claim on a task rewritten since it was read answered {written:?}, not Conflict([{k2:?}])")
    })?;
    let after = get_one(&s, &k1).await?;
    ensure(after == t1, || {
        format!("the conflicting batch still changed {k1}: {t1:?} became {after:?}")
    })
}

/// A task that went (completed by someone else) conflicts: completing or dead-lettering
/// it again answers `Conflict` naming it and writes nothing, not even the dead letter.
pub async fn completing_or_moving_a_gone_task_conflicts(s: Subject) -> Result<(), String> {
    let a = open(&s, "node-a", Duration::ZERO).await?;
    let _renew = Renewer::start(&s, &a);
    let leader = lead(&s, &a, "node-a").await?;
    let key = put(&s, "t1", b"{\"n\":1}").await?;
    let task = get_one(&s, &key).await?;
    let complete = TaskOp::Complete {
        key: key.clone(),
        version: task.version,
    };
    let written = s
        .coord
        .write(&leader, std::slice::from_ref(&complete))
        .await
        .ctx("write")?;
    ensure(matches!(written, Written::Done { .. }), || {
        format!("completing a pending task answered {written:?}")
    })?;
    let dead = format!("{}t1", s.dead_prefix);
    let moved = TaskOp::Move {
        key: key.clone(),
        version: task.version,
        to: dead.clone(),
        value: b"{\"n\":1}".to_vec(),
    };
    for op in [complete, moved] {
        let written = s
            .coord
            .write(&leader, std::slice::from_ref(&op))
            .await
            .ctx("write")?;
        ensure(written == Written::Conflict(vec![key.clone()]), || {
            format!(
                "{op:?} of a task already completed answered {written:?}, not Conflict([{key:?}])"
            )
        })?;
    }
    let written = get(&s, &[key.clone(), dead]).await?;
    ensure(written.is_empty(), || {
        format!("writes to a task that went left {written:?}")
    })
}

/// A claim answers the task's new version and the leadership's token; the task is then
/// held by the leader's lease; completing it with the version before the claim conflicts,
/// with the claim's version it deletes the task.
pub async fn claim_and_complete_follow_versions(s: Subject) -> Result<(), String> {
    let a = open(&s, "node-a", Duration::ZERO).await?;
    let _renew = Renewer::start(&s, &a);
    let leader = lead(&s, &a, "node-a").await?;
    let key = put(&s, "t1", b"{\"n\":1}").await?;
    let pending = get_one(&s, &key).await?;
    let value = b"{\"n\":1,\"taken\":true}";
    let written = s
        .coord
        .write(&leader, &[claim(&key, pending.version, value)])
        .await
        .ctx("write")?;
    let Written::Done {
        versions,
        fencing_token,
    } = written
    else {
        return Err(format!("a claim of a pending task answered {written:?}"));
    };
    ensure(fencing_token == leader.fencing_token, || {
        format!(
            "the claim saw token {fencing_token}, the leadership has {}",
            leader.fencing_token
        )
    })?;
    let [(claimed_key, claimed)] = versions.as_slice() else {
        return Err(format!(
            "a claim of one task answered versions {versions:?}"
        ));
    };
    let held = get_one(&s, &key).await?;
    ensure(
        claimed_key == &key
            && *claimed == held.version
            && held.version != pending.version
            && held.holder.as_ref() == Some(&a)
            && held.value == value,
        || {
            format!("after a claim answering ({claimed_key}, {claimed}) the task is {held:?}, was {pending:?}")
        },
    )?;
    let complete = |version| TaskOp::Complete {
        key: key.clone(),
        version,
    };
    let written = s
        .coord
        .write(&leader, &[complete(pending.version)])
        .await
        .ctx("write")?;
    ensure(written == Written::Conflict(vec![key.clone()]), || {
        format!("completing with the version before the claim answered {written:?}")
    })?;
    let written = s
        .coord
        .write(&leader, &[complete(held.version)])
        .await
        .ctx("write")?;
    ensure(matches!(written, Written::Done { .. }), || {
        format!("completing with the claim's version answered {written:?}")
    })?;
    let left = get(&s, std::slice::from_ref(&key)).await?;
    ensure(left.is_empty(), || {
        format!("a completed task is still there: {left:?}")
    })
}

/// `list` gives the tasks under the prefix in key order with their values, versions and
/// creation order (kept across rewrites); `keys` and `get` agree with it.
pub async fn list_gives_versions_and_creation_order(s: Subject) -> Result<(), String> {
    let kb = put(&s, "b", b"{\"n\":\"b\"}").await?;
    let ka = put(&s, "a", b"{\"n\":\"a\"}").await?;
    let kc = put(&s, "c", b"{\"n\":\"c\"}").await?;
    let dead = format!("{}a", s.dead_prefix);
    s.producer.put(&dead, b"{}").await.ctx("put")?;
    let (first, _) = list_now(&s).await?;
    let a_first = first.iter().find(|t| t.key == ka).cloned();
    s.producer
        .put(&ka, b"{\"n\":\"a\",\"again\":true}")
        .await
        .ctx("put")?;
    let (tasks, version) = list_now(&s).await?;
    let keys: Vec<&str> = tasks.iter().map(|t| t.key.as_str()).collect();
    ensure(keys == [ka.as_str(), kb.as_str(), kc.as_str()], || {
        format!("list gave the keys {keys:?}, not a, b, c under the prefix")
    })?;
    let [a, b, c] = tasks.as_slice() else {
        return Err(format!("list gave {tasks:?}"));
    };
    ensure(b.created < a.created && a.created < c.created, || {
        format!("the creation order is not b, a, c: {tasks:?}")
    })?;
    ensure(
        a.value == b"{\"n\":\"a\",\"again\":true}" && b.value == b"{\"n\":\"b\"}",
        || format!("list gave other values than were written: {tasks:?}"),
    )?;
    let a_first = a_first.ok_or("the first list did not give a")?;
    ensure(
        a.version != a_first.version && a.created == a_first.created,
        || {
            format!(
                "a rewrite should move the version and keep the creation: {a_first:?} became {a:?}"
            )
        },
    )?;
    ensure(
        tasks
            .iter()
            .all(|t| t.version >= t.created && t.holder.is_none()),
        || format!("a version before the creation, or a holder: {tasks:?}"),
    )?;
    let newest = tasks.iter().map(|t| t.version).max().unwrap_or(0);
    ensure(version.0 >= newest, || {
        format!("list's version {version:?} is below a task's version {newest}")
    })?;
    let (keys, _) = s.coord.keys(&s.queue_prefix).await.ctx("keys")?;
    ensure(keys == [ka.clone(), kb.clone(), kc.clone()], || {
        format!("keys gave {keys:?}")
    })?;
    let missing = format!("{}missing", s.queue_prefix);
    let got = get(&s, &[kc.clone(), missing]).await?;
    ensure(got.len() == 1 && got[0] == *c, || {
        format!("get of c and a missing key gave {got:?}, not c alone")
    })
}

/// A `list` or `observe` past the current version waits: it answers unchanged after the
/// wait, and at once (well before the wait) when a task is written or the leader resigns.
pub async fn list_and_observe_wait_for_a_change_or_the_wait(s: Subject) -> Result<(), String> {
    let wait = s.timing.ttl / 2;
    put(&s, "t1", b"{}").await?;
    let (_, version) = list_now(&s).await?;
    let started = Instant::now();
    let (tasks, unchanged) = s
        .coord
        .list(&s.queue_prefix, version, wait)
        .await
        .ctx("list")?;
    let tasks = seen(tasks);
    ensure(started.elapsed() >= wait / 2 && tasks.len() == 1, || {
        format!("a list with nothing to wait for answered after {:?} of a {wait:?} wait with {tasks:?} at {unchanged:?}", started.elapsed())
    })?;

    let long = s.timing.expiry * 4;
    let coord = s.coord.clone();
    let prefix = s.queue_prefix.clone();
    let started = Instant::now();
    let waiter = tokio::spawn(async move { coord.list(&prefix, version, long).await });
    tokio::time::sleep(wait / 2).await;
    let key = put(&s, "t2", b"{}").await?;
    let (tasks, moved) = waiter
        .await
        .map_err(|err| format!("list panicked: {err}"))?
        .ctx("list")?;
    let tasks = seen(tasks);
    ensure(
        moved > version && tasks.iter().any(|t| t.key == key) && started.elapsed() < long / 2,
        || {
            format!("a list waiting past {version:?} answered after {:?} with version {moved:?} and {tasks:?}", started.elapsed())
        },
    )?;

    // With a holder in place: on Consul a missing leader key answers the index of the
    // whole KV store, which other writes may move while the check waits.
    let a = open(&s, "node-a", Duration::ZERO).await?;
    let _renew = Renewer::start(&s, &a);
    let by_a = lead(&s, &a, "node-a").await?;
    let (holder, version) = s
        .coord
        .observe(Version(0), Duration::ZERO)
        .await
        .ctx("observe")?;
    let started = Instant::now();
    s.coord.observe(version, wait).await.ctx("observe")?;
    ensure(started.elapsed() >= wait / 2, || {
        format!("an observe with nothing to wait for answered after {:?} of a {wait:?} wait (holder {holder:?})", started.elapsed())
    })?;
    let coord = s.coord.clone();
    let started = Instant::now();
    let waiter = tokio::spawn(async move { coord.observe(version, long).await });
    tokio::time::sleep(wait / 2).await;
    s.coord.resign(&by_a).await.ctx("resign")?;
    let (holder, moved) = waiter
        .await
        .map_err(|err| format!("observe panicked: {err}"))?
        .ctx("observe")?;
    ensure(
        moved > version && holder.lease.is_none() && started.elapsed() < long / 2,
        || {
            format!("an observe waiting past {version:?} answered after {:?} with {holder:?} at {moved:?}", started.elapsed())
        },
    )
}

/// A task claimed by a lease that then expires stays in the queue with its value, its
/// version moved and no holder, and the next leader can requeue and claim it.
pub async fn dead_lease_leaves_its_claims_unheld(s: Subject) -> Result<(), String> {
    let a = open(&s, "node-a", Duration::ZERO).await?;
    let by_a = lead(&s, &a, "node-a").await?;
    let key = put(&s, "t1", b"{\"n\":1}").await?;
    let pending = get_one(&s, &key).await?;
    let taken = b"{\"n\":1,\"taken\":true}";
    let written = s
        .coord
        .write(&by_a, &[claim(&key, pending.version, taken)])
        .await
        .ctx("write")?;
    ensure(matches!(written, Written::Done { .. }), || {
        format!("the claim answered {written:?}")
    })?;
    let held = get_one(&s, &key).await?;
    wait_until_not_held_by(&s, &a).await?;
    let orphan = get_one(&s, &key).await?;
    ensure(
        orphan.holder.is_none() && orphan.value == taken && orphan.version != held.version,
        || format!("after its lease expired the claimed task {held:?} is {orphan:?}"),
    )?;

    let b = open(&s, "node-b", Duration::ZERO).await?;
    let _renew = Renewer::start(&s, &b);
    let by_b = lead(&s, &b, "node-b").await?;
    let requeued = b"{\"n\":1,\"attempts\":1}";
    let written = s
        .coord
        .write(
            &by_b,
            &[TaskOp::Rewrite {
                key: key.clone(),
                version: orphan.version,
                value: requeued.to_vec(),
            }],
        )
        .await
        .ctx("write")?;
    ensure(matches!(written, Written::Done { .. }), || {
        format!("requeueing the orphan answered {written:?}")
    })?;
    let back = get_one(&s, &key).await?;
    let written = s
        .coord
        .write(&by_b, &[claim(&key, back.version, taken)])
        .await
        .ctx("write")?;
    ensure(
        back.value == requeued && matches!(written, Written::Done { .. }),
        || format!("the requeued task is {back:?} and claiming it answered {written:?}"),
    )
}

/// `Move` (dead-letter) and `Rewrite` (requeue) store the value given byte for byte: the
/// moved task is gone from the queue and unheld at its new key, even if it was claimed;
/// the rewritten one keeps its place in the creation order.
pub async fn move_and_rewrite_keep_the_data(s: Subject) -> Result<(), String> {
    let a = open(&s, "node-a", Duration::ZERO).await?;
    let _renew = Renewer::start(&s, &a);
    let leader = lead(&s, &a, "node-a").await?;
    let k1 = put(&s, "t1", b"{\"n\":1}").await?;
    let k2 = put(&s, "t2", b"{\"n\":2}").await?;
    let k3 = put(&s, "t3", b"{\"n\":3}").await?;
    let t3 = get_one(&s, &k3).await?;
    let written = s
        .coord
        .write(
            &leader,
            &[claim(&k3, t3.version, b"{\"n\":3,\"taken\":true}")],
        )
        .await
        .ctx("write")?;
    ensure(matches!(written, Written::Done { .. }), || {
        format!("the claim answered {written:?}")
    })?;
    let (t1, t2, t3) = (
        get_one(&s, &k1).await?,
        get_one(&s, &k2).await?,
        get_one(&s, &k3).await?,
    );
    let dead_value = "{\"n\":1,\"reason\":\"bad \\\"taskType\\\"\\n\",\"é\":\"✓\"}".as_bytes();
    let requeued = b"{\"n\":2,\"attempts\":3,\"notBefore\":\"2030-01-01T00:00:00Z\"}";
    let (d1, d3) = (
        format!("{}t1", s.dead_prefix),
        format!("{}t3", s.dead_prefix),
    );
    let ops = [
        TaskOp::Move {
            key: k1.clone(),
            version: t1.version,
            to: d1.clone(),
            value: dead_value.to_vec(),
        },
        TaskOp::Rewrite {
            key: k2.clone(),
            version: t2.version,
            value: requeued.to_vec(),
        },
        TaskOp::Move {
            key: k3.clone(),
            version: t3.version,
            to: d3.clone(),
            value: b"{\"n\":3}".to_vec(),
        },
    ];
    let written = s.coord.write(&leader, &ops).await.ctx("write")?;
    ensure(matches!(written, Written::Done { .. }), || {
        format!("a dead-letter and a requeue answered {written:?}")
    })?;
    let (queue, _) = list_now(&s).await?;
    let keys: Vec<&str> = queue.iter().map(|t| t.key.as_str()).collect();
    ensure(keys == [k2.as_str()], || {
        format!("after moving t1 and t3 the queue holds {keys:?}")
    })?;
    let t2_after = &queue[0];
    ensure(
        t2_after.value == requeued
            && t2_after.created == t2.created
            && t2_after.version != t2.version
            && t2_after.holder.is_none(),
        || format!("the requeued task {t2:?} became {t2_after:?}"),
    )?;
    let (dead, _) = list(&s, &s.dead_prefix).await?;
    ensure(
        dead.len() == 2
            && dead[0].key == d1
            && dead[0].value == dead_value
            && dead[1].key == d3
            && dead.iter().all(|t| t.holder.is_none()),
        || format!("the dead letters are {dead:?}"),
    )
}

/// Without leadership a lease can write only tasks it holds itself, all or nothing:
/// another lease's claim, or a batch with one task not its own, changes nothing.
pub async fn write_own_touches_only_own_claims(s: Subject) -> Result<(), String> {
    let a = open(&s, "node-a", Duration::ZERO).await?;
    let b = open(&s, "node-b", Duration::ZERO).await?;
    let _renew_a = Renewer::start(&s, &a);
    let _renew_b = Renewer::start(&s, &b);
    let by_a = lead(&s, &a, "node-a").await?;
    let k1 = put(&s, "t1", b"{\"n\":1}").await?;
    let k2 = put(&s, "t2", b"{\"n\":2}").await?;
    let k3 = put(&s, "t3", b"{\"n\":3}").await?;
    let (t1, t2) = (get_one(&s, &k1).await?, get_one(&s, &k2).await?);
    let written = s
        .coord
        .write(
            &by_a,
            &[
                claim(&k1, t1.version, b"{\"n\":1,\"taken\":true}"),
                claim(&k2, t2.version, b"{\"n\":2,\"taken\":true}"),
            ],
        )
        .await
        .ctx("write")?;
    let Written::Done { versions, .. } = written else {
        return Err(format!("claiming two tasks answered {written:?}"));
    };
    s.coord.resign(&by_a).await.ctx("resign")?;
    lead(&s, &b, "node-b").await?;
    let version_of = |key: &str| {
        versions
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| *v)
            .ok_or_else(|| format!("the claim answered no version for {key}: {versions:?}"))
    };
    let (v1, v2) = (version_of(&k1)?, version_of(&k2)?);
    let t3 = get_one(&s, &k3).await?;
    let release = |key: &str, version, value: &[u8]| TaskOp::Release {
        key: key.to_string(),
        version,
        value: value.to_vec(),
    };

    s.coord
        .write_own(&a, &[release(&k1, v1, b"{\"n\":1}")])
        .await
        .ctx("write_own")?;
    let after = get_one(&s, &k1).await?;
    ensure(
        after.holder.is_none() && after.value == b"{\"n\":1}",
        || format!("the lease's own release without leadership left {after:?}"),
    )?;

    let t2_held = get_one(&s, &k2).await?;
    s.coord
        .write_own(&b, &[release(&k2, v2, b"{\"n\":2}")])
        .await
        .ctx("write_own")?;
    let after = get_one(&s, &k2).await?;
    ensure(after == t2_held, || {
        format!("another lease released a's claim: {t2_held:?} became {after:?}")
    })?;

    s.coord
        .write_own(
            &a,
            &[
                release(&k2, v2, b"{\"n\":2}"),
                release(&k3, t3.version, b"{\"n\":3,\"x\":1}"),
            ],
        )
        .await
        .ctx("write_own")?;
    let (after2, after3) = (get_one(&s, &k2).await?, get_one(&s, &k3).await?);
    ensure(after2 == t2_held && after3 == t3, || {
        format!("a batch with a task the lease does not hold was applied: {after2:?}, {after3:?}")
    })
}

/// Without leadership a lease cannot complete or dead-letter a task it does not hold.
pub async fn write_own_cannot_complete_or_move_what_it_does_not_hold(
    s: Subject,
) -> Result<(), String> {
    let a = open(&s, "node-a", Duration::ZERO).await?;
    let _renew = Renewer::start(&s, &a);
    let key = put(&s, "t1", b"{\"n\":1}").await?;
    let task = get_one(&s, &key).await?;
    let dead = format!("{}t1", s.dead_prefix);
    let ops = [
        TaskOp::Complete {
            key: key.clone(),
            version: task.version,
        },
        TaskOp::Move {
            key: key.clone(),
            version: task.version,
            to: dead.clone(),
            value: b"{\"n\":1}".to_vec(),
        },
    ];
    for op in ops {
        s.coord
            .write_own(&a, std::slice::from_ref(&op))
            .await
            .ctx("write_own")?;
        let after = get(&s, &[key.clone(), dead.clone()]).await?;
        ensure(after.len() == 1 && after[0] == task, || {
            format!("{op:?} without leadership, of a task the lease does not hold, left {after:?}")
        })?;
    }
    Ok(())
}

/// A write over the declared limits (operations, the guard counted, or bytes) is refused
/// whole, and changes nothing; a write at the limits is accepted.
pub async fn over_limit_writes_are_refused_whole(s: Subject) -> Result<(), String> {
    let limits = s.coord.limits();
    let a = open(&s, "node-a", Duration::ZERO).await?;
    let _renew = Renewer::start(&s, &a);
    let leader = lead(&s, &a, "node-a").await?;
    let key = put(&s, "t0", b"{}").await?;
    let task = get_one(&s, &key).await?;

    let filler = |count: usize| -> Vec<TaskOp> {
        (1..count)
            .map(|n| TaskOp::Complete {
                key: format!("{}missing-{n}", s.queue_prefix),
                version: 1,
            })
            .collect()
    };
    // The real task first, then ops on tasks that do not exist: with the guard, one op
    // more than the limit allows.
    let mut over = vec![TaskOp::Complete {
        key: key.clone(),
        version: task.version,
    }];
    over.extend(filler(limits.max_ops));
    match s.coord.write(&leader, &over).await {
        Err(CoordError::Refused(_)) => {}
        other => {
            return Err(format!(
                "a write of {} ops and the guard, over the limit of {}, answered {other:?}",
                over.len(),
                limits.max_ops
            ))
        }
    }
    // At the limit: ops on missing tasks only, so that the task stays whatever they answer.
    let at = filler(limits.max_ops);
    match s.coord.write(&leader, &at).await {
        // Conflict over the missing tasks; whether they conflict is another check's concern.
        Ok(Written::Conflict(_) | Written::Done { .. }) => {}
        other => {
            return Err(format!(
                "a write of {} ops and the guard, at the limit of {}, answered {other:?}",
                at.len(),
                limits.max_ops
            ))
        }
    }

    let big = |len: usize| claim(&key, task.version, &vec![b'x'; len - key.len()]);
    let written = s.coord.write(&leader, &[big(limits.max_bytes + 1)]).await;
    ensure(matches!(written, Err(CoordError::Refused(_))), || {
        format!(
            "a claim of {} bytes, over the limit of {}, answered {written:?}",
            limits.max_bytes + 1,
            limits.max_bytes
        )
    })?;
    let after = get_one(&s, &key).await?;
    ensure(after == task, || {
        format!("refused writes changed the task: {task:?} became {after:?}")
    })?;
    let written = s.coord.write(&leader, &[big(limits.max_bytes)]).await;
    ensure(matches!(written, Ok(Written::Done { .. })), || {
        format!(
            "a claim of {} bytes, at the limit, answered {written:?}",
            limits.max_bytes
        )
    })
}

/// A keep-alive of a revoked lease, or of one left to expire, answers `Gone`; a lease
/// kept alive lives on well past its TTL.
pub async fn keep_alive_of_an_ended_lease_is_gone(s: Subject) -> Result<(), String> {
    let a = open(&s, "node-a", Duration::ZERO).await?;
    let kept = open(&s, "node-k", Duration::ZERO).await?;
    let renewer = Renewer::start(&s, &kept);
    s.coord.revoke(&a).await.ctx("revoke")?;
    let renewal = s.coord.keep_alive(&a).await.ctx("keep_alive")?;
    ensure(renewal == Renewal::Gone, || {
        format!("a keep-alive of a revoked lease answered {renewal:?}")
    })?;

    let e = open(&s, "node-e", Duration::ZERO).await?;
    let started = Instant::now();
    lead(&s, &e, "node-e").await?;
    tokio::time::sleep(s.timing.ttl / 2).await;
    let (holder, _) = s
        .coord
        .observe(Version(0), Duration::ZERO)
        .await
        .ctx("observe")?;
    ensure(
        holder.lease.as_ref() == Some(&e) || started.elapsed() >= s.timing.ttl,
        || {
            format!(
                "a lease lost leadership {:?} after its last keep-alive, within its TTL {:?}",
                started.elapsed(),
                s.timing.ttl
            )
        },
    )?;
    wait_until_not_held_by(&s, &e).await?;
    let renewal = s.coord.keep_alive(&e).await.ctx("keep_alive")?;
    ensure(renewal == Renewal::Gone, || {
        format!("a keep-alive of an expired lease answered {renewal:?}")
    })?;
    drop(renewer);
    let renewal = s.coord.keep_alive(&kept).await.ctx("keep_alive")?;
    ensure(renewal == Renewal::Alive, || {
        format!(
            "a lease kept alive through {:?} answered {renewal:?}",
            started.elapsed()
        )
    })
}

// ---- helpers ----

/// Adds what was called to a coordinator error.
trait Ctx<T> {
    fn ctx(self, call: &str) -> Result<T, String>;
}

impl<T> Ctx<T> for Result<T, CoordError> {
    fn ctx(self, call: &str) -> Result<T, String> {
        self.map_err(|err| format!("{call} failed: {err:?}"))
    }
}

fn ensure(holds: bool, why: impl FnOnce() -> String) -> Result<(), String> {
    if holds {
        Ok(())
    } else {
        Err(why())
    }
}

/// Keeps a lease alive every quarter TTL until dropped.
struct Renewer(JoinHandle<()>);

impl Renewer {
    fn start(s: &Subject, lease: &LeaseId) -> Renewer {
        let coord = s.coord.clone();
        let lease = lease.clone();
        let every = s.timing.ttl / 4;
        Renewer(tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                if let Ok(Renewal::Gone) = coord.keep_alive(&lease).await {
                    return;
                }
            }
        }))
    }
}

impl Drop for Renewer {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn record(node: &str) -> HolderRecord {
    HolderRecord {
        node: node.to_string(),
        host: "contract".into(),
        pid: std::process::id(),
        session: String::new(),
        since: String::new(),
    }
}

fn spec(s: &Subject, node: &str, lock_delay: Duration, previous: Option<LeaseId>) -> LeaseSpec {
    LeaseSpec {
        node_id: node.to_string(),
        ttl: s.timing.ttl,
        lock_delay,
        previous,
    }
}

async fn open(s: &Subject, node: &str, lock_delay: Duration) -> Result<LeaseId, String> {
    let grant = s
        .coord
        .open_lease(&spec(s, node, lock_delay, None))
        .await
        .ctx("open_lease")?;
    Ok(grant.lease)
}

/// Leadership for `lease`, which must win at once.
async fn lead(s: &Subject, lease: &LeaseId, node: &str) -> Result<Leadership, String> {
    match s
        .coord
        .campaign(lease, &record(node))
        .await
        .ctx("campaign")?
    {
        Campaign::Won(leadership) => Ok(leadership),
        other => Err(format!(
            "{node} campaigned for free leadership and heard {other:?}"
        )),
    }
}

/// Waits until `lease` no longer holds leadership, within the expiry bound.
async fn wait_until_not_held_by(s: &Subject, lease: &LeaseId) -> Result<(), String> {
    let deadline = Instant::now() + s.timing.expiry;
    let mut version = Version(0);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let (holder, moved) = s.coord.observe(version, left).await.ctx("observe")?;
        if holder.lease.as_ref() != Some(lease) {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "lease {lease} still leads {:?} after its last keep-alive",
                s.timing.expiry
            ));
        }
        version = moved;
    }
}

fn claim(key: &str, version: u64, value: &[u8]) -> TaskOp {
    TaskOp::Claim {
        key: key.to_string(),
        version,
        value: value.to_vec(),
    }
}

/// Writes a task under the queue prefix; its full key.
async fn put(s: &Subject, name: &str, value: &[u8]) -> Result<String, String> {
    let key = format!("{}{name}", s.queue_prefix);
    s.producer.put(&key, value).await.ctx("put")?;
    Ok(key)
}

async fn get_one(s: &Subject, key: &str) -> Result<Seen, String> {
    let mut found = get(s, &[key.to_string()]).await?;
    match (found.pop(), found.is_empty()) {
        (Some(task), true) if task.key == key => Ok(task),
        (task, _) => Err(format!("get of {key} gave {task:?} and {found:?}")),
    }
}

async fn get(s: &Subject, keys: &[String]) -> Result<Vec<Seen>, String> {
    Ok(seen(s.coord.get(keys).await.ctx("get")?))
}

async fn list_now(s: &Subject) -> Result<(Vec<Seen>, Version), String> {
    list(s, &s.queue_prefix).await
}

async fn list(s: &Subject, prefix: &str) -> Result<(Vec<Seen>, Version), String> {
    let (tasks, version) = s
        .coord
        .list(prefix, Version(0), Duration::ZERO)
        .await
        .ctx("list")?;
    Ok((seen(tasks), version))
}

/// A task as a check saw it: shown with its value as text, for failure messages.
#[derive(Clone, PartialEq, Eq)]
struct Seen(StoredTask);

impl std::ops::Deref for Seen {
    type Target = StoredTask;

    fn deref(&self) -> &StoredTask {
        &self.0
    }
}

impl std::fmt::Debug for Seen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} = {:?} (version {}, created {}, held by {:?})",
            self.key,
            String::from_utf8_lossy(&self.value),
            self.version,
            self.created,
            self.holder.as_ref().map(|lease| lease.0.as_str())
        )
    }
}

fn seen(tasks: Vec<StoredTask>) -> Vec<Seen> {
    tasks.into_iter().map(Seen).collect()
}
