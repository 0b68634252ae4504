//! The contract's checks of the queue: listing and waiting, claims of a dead lease,
//! dead-letters and requeues, a lease's writes to its own claims, and the settling of an
//! orphan by its former holder.

use std::time::Duration;

use tokio::time::Instant;

use super::support::*;
use super::Subject;
use leaderq::coord::{Edit, Edited, TaskOp, Version, Written};

/// `list` gives the tasks under the prefix in key order with their values, versions and
/// creation order (kept across rewrites); `list_each`, `keys` and `get` agree with it.
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
    let mut handed = Vec::new();
    let handed_at = s
        .coord
        .list_each(&s.queue_prefix, Version(0), Duration::ZERO, &mut |task| {
            handed.push(task)
        })
        .await
        .ctx("list_each")?;
    let handed = seen(handed);
    // Other writes to the coordinator (another check's, on a shared one) may move the
    // version between the two reads; these tasks were not written meanwhile.
    ensure(handed == tasks && handed_at >= version, || {
        format!("list_each gave {handed:?} at {handed_at:?}; list gave {tasks:?} at {version:?}")
    })?;
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
            .all(|t| t.version.0 >= t.created && t.holder.is_none()),
        || format!("a version before the creation, or a holder: {tasks:?}"),
    )?;
    let newest = tasks.iter().map(|t| t.version.0).max().unwrap_or(0);
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
    s.coord.resign(&by_a.lease).await.ctx("resign")?;
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
    // Kept alive until its claim is read back, so that a slow machine does not end it
    // before; then left to expire.
    let renew_a = Renewer::start(&s, &a);
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
    drop(renew_a);
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

/// A task whose claiming lease died is refused to every other lease for that lease's
/// takeover delay, where the backend has one (Consul's lock-delay): the claim answers
/// `Deferred` naming it (nothing moved it, so nothing needs reading), applies nothing, and
/// once the delay is over the same claim goes through. Elsewhere it is claimed at once.
pub async fn a_claim_within_a_dead_leases_delay_is_deferred(s: Subject) -> Result<(), String> {
    let delay = s.timing.ttl;
    let a = open(&s, "node-a", delay).await?;
    let _renew_a = Renewer::start(&s, &a);
    let by_a = lead(&s, &a, "node-a").await?;
    let key = put(&s, "t1", b"{\"n\":1}").await?;
    let pending = get_one(&s, &key).await?;
    let written = s
        .coord
        .write(&by_a, &[claim(&key, pending.version, b"{\"by\":\"a\"}")])
        .await
        .ctx("write")?;
    ensure(matches!(written, Written::Done { .. }), || {
        format!("the claim answered {written:?}")
    })?;
    // Leadership is given up first (no delay on it), then the lease ends holding the task.
    s.coord.resign(&by_a.lease).await.ctx("resign")?;
    s.coord.revoke(&a).await.ctx("revoke")?;
    let revoked = Instant::now();
    wait_until_not_held_by(&s, &a).await?;
    let orphan = get_one(&s, &key).await?;

    let b = open(&s, "node-b", Duration::ZERO).await?;
    let _renew = Renewer::start(&s, &b);
    let by_b = lead(&s, &b, "node-b").await?;
    let by_b_claim = [claim(&key, orphan.version, b"{\"by\":\"b\"}")];
    let first = s.coord.write(&by_b, &by_b_claim).await.ctx("write")?;
    if !s.timing.takeover_delay {
        return ensure(matches!(first, Written::Done { .. }), || {
            format!("without a takeover delay, claiming the orphan answered {first:?}")
        });
    }
    ensure(first == Written::Deferred(vec![key.clone()]), || {
        format!("claiming the orphan right after its lease was revoked answered {first:?}")
    })?;
    let unchanged = get_one(&s, &key).await?;
    ensure(unchanged.version == orphan.version, || {
        format!("a deferred claim changed the task: {orphan:?} is now {unchanged:?}")
    })?;
    loop {
        match s.coord.write(&by_b, &by_b_claim).await.ctx("write")? {
            Written::Done { .. } => return Ok(()),
            Written::Deferred(_) if revoked.elapsed() < delay + s.timing.expiry => {
                tokio::time::sleep(delay / 4).await;
            }
            other => {
                return Err(format!(
                "{:?} after the revocation the claim answered {other:?}, with a delay of {delay:?}",
                revoked.elapsed()
            ))
            }
        }
    }
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
    s.coord.resign(&by_a.lease).await.ctx("resign")?;
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

    let written = s
        .coord
        .write_own(&a, &[release(&k1, v1, b"{\"n\":1}")])
        .await
        .ctx("write_own")?;
    let after = get_one(&s, &k1).await?;
    ensure(
        matches!(written, Written::Done { .. })
            && after.holder.is_none()
            && after.value == b"{\"n\":1}",
        || {
            format!("the lease's own release without leadership answered {written:?} and left {after:?}")
        },
    )?;

    let t2_held = get_one(&s, &k2).await?;
    let written = s
        .coord
        .write_own(&b, &[release(&k2, v2, b"{\"n\":2}")])
        .await
        .ctx("write_own")?;
    let after = get_one(&s, &k2).await?;
    ensure(
        after == t2_held && written == Written::Conflict(vec![k2.clone()]),
        || {
            format!("another lease's release of a's claim answered {written:?}: {t2_held:?} became {after:?}")
        },
    )?;

    let written = s
        .coord
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
    ensure(matches!(written, Written::Conflict(_)), || {
        format!("a batch with a task the lease does not hold answered {written:?}")
    })?;
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
        let written = s
            .coord
            .write_own(&a, std::slice::from_ref(&op))
            .await
            .ctx("write_own")?;
        let after = get(&s, &[key.clone(), dead.clone()]).await?;
        ensure(
            after.len() == 1 && after[0] == task && written == Written::Conflict(vec![key.clone()]),
            || {
                format!("{op:?} without leadership, of a task the lease does not hold, answered {written:?} and left {after:?}")
            },
        )?;
    }
    Ok(())
}

/// The replica whose claim a task was settles it after its lease was revoked, with an
/// edit at the version it reads: `Replace` writes what its run left (the task unheld and
/// pending again), `Delete` completes it. At a version that moved since (the next leader
/// requeued or claimed the task) either conflicts and changes nothing.
pub async fn a_revoked_holder_settles_its_orphan_at_the_version_read(
    s: Subject,
) -> Result<(), String> {
    let a = open(&s, "node-a", Duration::ZERO).await?;
    let renew = Renewer::start(&s, &a);
    let by_a = lead(&s, &a, "node-a").await?;
    let put_back = put(&s, "t1", b"{\"n\":1}").await?;
    let done = put(&s, "t2", b"{\"n\":2}").await?;
    let pending = get(&s, &[put_back.clone(), done.clone()]).await?;
    let taken = b"{\"taken\":true}";
    let claims: Vec<TaskOp> = pending
        .iter()
        .map(|task| claim(&task.key, task.version, taken))
        .collect();
    let written = s.coord.write(&by_a, &claims).await.ctx("write")?;
    ensure(matches!(written, Written::Done { .. }), || {
        format!("the claims answered {written:?}")
    })?;
    drop(renew);
    s.coord.revoke(&a).await.ctx("revoke")?;
    let orphan = get_one(&s, &put_back).await?;
    ensure(orphan.holder.is_none() && orphan.value == taken, || {
        format!("after its lease was revoked the claimed task is {orphan:?}")
    })?;
    let back = b"{\"n\":1,\"lastError\":\"interrupted\"}";
    let replace = |version| Edit::Replace {
        key: put_back.clone(),
        version,
        value: back.to_vec(),
    };
    let edited = s.coord.edit(&[replace(orphan.version)]).await.ctx("edit")?;
    ensure(edited == Edited::Done, || {
        format!("replacing the orphan at its version answered {edited:?}")
    })?;
    let replaced = get_one(&s, &put_back).await?;
    ensure(
        replaced.holder.is_none()
            && replaced.value == back
            && replaced.version != orphan.version
            && replaced.created == orphan.created,
        || format!("the orphan {orphan:?} was replaced as {replaced:?}"),
    )?;
    let edited = s.coord.edit(&[replace(orphan.version)]).await.ctx("edit")?;
    ensure(edited == Edited::Conflict(vec![put_back.clone()]), || {
        format!("replacing it again at the old version answered {edited:?}")
    })?;
    ensure(get_one(&s, &put_back).await? == replaced, || {
        "a conflicting replace changed the task".to_string()
    })?;

    let orphan = get_one(&s, &done).await?;
    let edited = s
        .coord
        .edit(&[Edit::Delete {
            key: done.clone(),
            version: orphan.version,
        }])
        .await
        .ctx("edit")?;
    ensure(edited == Edited::Done, || {
        format!("deleting the orphan at its version answered {edited:?}")
    })?;
    let (left, _) = list_now(&s).await?;
    ensure(left.iter().all(|task| task.key != done), || {
        format!("the completed orphan is still listed: {left:?}")
    })
}
