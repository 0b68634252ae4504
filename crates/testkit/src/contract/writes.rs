//! The contract's checks of guarded writes: leadership, versions and conflicts, claims
//! and completions, the write limits.

use std::time::Duration;

use super::support::*;
use super::Subject;
use leaderq::coord::{batch_cost, CoordError, Edit, Edited, TaskOp, TaskVersion, Written};

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
    s.coord.resign(&by_a.lease).await.ctx("resign")?;
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
    // Completing a task that went is done already: either answer is right, as long as
    // nothing is written. Moving it must conflict: a dead letter for it would be a task
    // that never was.
    let written = s
        .coord
        .write(&leader, std::slice::from_ref(&complete))
        .await
        .ctx("write")?;
    ensure(
        matches!(written, Written::Done { .. }) || written == Written::Conflict(vec![key.clone()]),
        || format!("completing a task already completed answered {written:?}"),
    )?;
    let written = s
        .coord
        .write(&leader, std::slice::from_ref(&moved))
        .await
        .ctx("write")?;
    ensure(written == Written::Conflict(vec![key.clone()]), || {
        format!(
            "{moved:?} of a task already completed answered {written:?}, not Conflict([{key:?}])"
        )
    })?;
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

/// A write over the declared limits (the guard counted, in the backend's own costs:
/// operations or bytes) is refused whole, and changes nothing; a write at the limits is
/// accepted.
pub async fn over_limit_writes_are_refused_whole(s: Subject) -> Result<(), String> {
    let coord = s.coord.as_ref();
    let limits = coord.limits();
    let admits = |ops: &[TaskOp]| limits.admits(batch_cost(coord, ops, true));
    let a = open(&s, "node-a", Duration::ZERO).await?;
    let _renew = Renewer::start(&s, &a);
    let leader = lead(&s, &a, "node-a").await?;
    let key = put(&s, "t0", b"{}").await?;
    let task = get_one(&s, &key).await?;

    // Ops on tasks that do not exist, as many as the limits admit.
    let mut at: Vec<TaskOp> = Vec::new();
    loop {
        let next = TaskOp::Complete {
            key: format!("{}missing-{}", s.queue_prefix, at.len()),
            version: TaskVersion(1),
        };
        at.push(next);
        if !admits(&at) {
            at.pop();
            break;
        }
    }
    // The real task first, then all of those: over the limits.
    let mut over = vec![TaskOp::Complete {
        key: key.clone(),
        version: task.version,
    }];
    over.extend(at.iter().cloned());
    ensure(!admits(&over), || {
        format!("{} ops were expected to be over the limits", over.len())
    })?;
    match s.coord.write(&leader, &over).await {
        Err(CoordError::Refused(_)) => {}
        other => {
            return Err(format!(
                "a write of {} ops, over the limits {limits:?}, answered {other:?}",
                over.len()
            ))
        }
    }
    match s.coord.write(&leader, &at).await {
        // Conflict over the missing tasks; whether they conflict is another check's concern.
        Ok(Written::Conflict(_) | Written::Done { .. }) => {}
        other => {
            return Err(format!(
                "a write of {} ops, at the limits {limits:?}, answered {other:?}",
                at.len()
            ))
        }
    }

    // The largest claim the limits admit, found by its cost, and one byte more.
    let big = |len: usize| claim(&key, task.version, &vec![b'x'; len]);
    let (mut fits, mut too_big) = (0, 2 * limits.max_bytes + 1);
    while too_big - fits > 1 {
        let mid = (fits + too_big) / 2;
        if admits(&[big(mid)]) {
            fits = mid;
        } else {
            too_big = mid;
        }
    }
    let written = s.coord.write(&leader, &[big(too_big)]).await;
    ensure(matches!(written, Err(CoordError::Refused(_))), || {
        format!("a claim of {too_big} bytes, over the limits {limits:?}, answered {written:?}")
    })?;
    let after = get_one(&s, &key).await?;
    ensure(after == task, || {
        format!("refused writes changed the task: {task:?} became {after:?}")
    })?;
    let written = s.coord.write(&leader, &[big(fits)]).await;
    ensure(matches!(written, Ok(Written::Done { .. })), || {
        format!("a claim of {fits} bytes, at the limits, answered {written:?}")
    })
}

/// An operator's edit creates only new keys and deletes only at the version read, all or
/// nothing: a retry of a dead letter (delete it, create the task anew) never overwrites a
/// task that took its key meanwhile, and leaves the dead letter where it was.
pub async fn edits_create_only_new_keys_and_apply_whole(s: Subject) -> Result<(), String> {
    let fresh = format!("{}fresh", s.queue_prefix);
    let created = s
        .coord
        .edit(&[Edit::Create {
            key: fresh.clone(),
            value: b"{\"n\":1}".to_vec(),
        }])
        .await
        .ctx("edit")?;
    ensure(created == Edited::Done, || {
        format!("creating a new key answered {created:?}")
    })?;
    let task = get_one(&s, &fresh).await?;
    ensure(task.value == b"{\"n\":1}" && task.holder.is_none(), || {
        format!("a created task reads back as {task:?}")
    })?;
    let again = s
        .coord
        .edit(&[Edit::Create {
            key: fresh.clone(),
            value: b"{\"n\":2}".to_vec(),
        }])
        .await
        .ctx("edit")?;
    ensure(again == Edited::Conflict(vec![fresh.clone()]), || {
        format!("creating an existing key answered {again:?}, not Conflict([{fresh:?}])")
    })?;
    let dead = format!("{}t1", s.dead_prefix);
    s.producer.put(&dead, b"{\"dead\":true}").await.ctx("put")?;
    let letter = get_one(&s, &dead).await?;
    let retry = [
        Edit::Delete {
            key: dead.clone(),
            version: letter.version,
        },
        Edit::Create {
            key: fresh.clone(),
            value: b"{\"n\":3}".to_vec(),
        },
    ];
    let blocked = s.coord.edit(&retry).await.ctx("edit")?;
    ensure(blocked == Edited::Conflict(vec![fresh.clone()]), || {
        format!("a retry onto a taken key answered {blocked:?}, not Conflict([{fresh:?}])")
    })?;
    let kept = get_one(&s, &dead).await?;
    ensure(kept == letter, || {
        format!("a refused edit changed the dead letter: {letter:?} became {kept:?}")
    })?;
    let stale = s
        .coord
        .edit(&[Edit::Delete {
            key: dead.clone(),
            version: TaskVersion(letter.version.0 + 1_000_000),
        }])
        .await
        .ctx("edit")?;
    ensure(stale == Edited::Conflict(vec![dead.clone()]), || {
        format!("a delete at a wrong version answered {stale:?}, not Conflict([{dead:?}])")
    })?;
    let deleted = s
        .coord
        .edit(&[Edit::Delete {
            key: dead.clone(),
            version: letter.version,
        }])
        .await
        .ctx("edit")?;
    let (left, _) = list(&s, &s.dead_prefix).await?;
    ensure(deleted == Edited::Done && left.is_empty(), || {
        format!("a delete at the version read answered {deleted:?} and left {left:?}")
    })
}

/// An operator's `Put` writes a key whatever is there (a replica's heartbeat record): it
/// creates a new key, replaces an existing one (its version moves), also below a nested
/// name, and a batch with a failing op applies none of its puts.
pub async fn put_writes_a_key_whatever_is_there(s: Subject) -> Result<(), String> {
    let key = format!("{}put", s.queue_prefix);
    let put = |value: &[u8]| Edit::Put {
        key: key.clone(),
        value: value.to_vec(),
    };
    let first = s.coord.edit(&[put(b"{\"n\":1}")]).await.ctx("edit")?;
    ensure(first == Edited::Done, || {
        format!("a put of a new key answered {first:?}")
    })?;
    let one = get_one(&s, &key).await?;
    ensure(one.value == b"{\"n\":1}" && one.holder.is_none(), || {
        format!("a put key reads back as {one:?}")
    })?;
    let second = s.coord.edit(&[put(b"{\"n\":2}")]).await.ctx("edit")?;
    let two = get_one(&s, &key).await?;
    ensure(
        second == Edited::Done && two.value == b"{\"n\":2}" && two.version != one.version,
        || format!("a put over an existing key answered {second:?} and left {two:?} (was {one:?})"),
    )?;
    // Another key that exists, so that creating it fails (etcd takes no two writes of one
    // key in a transaction).
    let other = format!("{}put-other", s.queue_prefix);
    s.producer.put(&other, b"{}").await.ctx("put")?;
    let blocked = s
        .coord
        .edit(&[
            put(b"{\"n\":3}"),
            Edit::Create {
                key: other.clone(),
                value: b"{}".to_vec(),
            },
        ])
        .await
        .ctx("edit")?;
    let kept = get_one(&s, &key).await?;
    ensure(
        blocked == Edited::Conflict(vec![other.clone()]) && kept == two,
        || format!("a put beside a failing create answered {blocked:?} and left {kept:?}"),
    )?;
    let nested = format!("{}replicas/r1", s.dead_prefix);
    let both = s
        .coord
        .edit(&[
            Edit::Put {
                key: nested.clone(),
                value: b"{\"r\":1}".to_vec(),
            },
            put(b"{\"n\":4}"),
        ])
        .await
        .ctx("edit")?;
    let deep = get_one(&s, &nested).await?;
    let four = get_one(&s, &key).await?;
    ensure(
        both == Edited::Done && deep.value == b"{\"r\":1}" && four.value == b"{\"n\":4}",
        || format!("two puts answered {both:?} and left {deep:?} and {four:?}"),
    )
}

/// A leader's `Create` writes only a key that does not exist, all or nothing with the rest
/// of its batch, and a record it created is then rewritten at its version (a schedule's
/// tick and its last-tick record). Without leadership nothing is created: a deposed
/// leader's create answers `NotLeader`, a lease's own write `Conflict`.
pub async fn a_leaders_create_writes_only_a_new_key(s: Subject) -> Result<(), String> {
    let a = open(&s, "node-a", Duration::ZERO).await?;
    let _renew = Renewer::start(&s, &a);
    let leader = lead(&s, &a, "node-a").await?;
    let tick = format!("{}tick-1", s.queue_prefix);
    let state = format!("{}state", s.queue_prefix);
    let create = |key: &str, value: &[u8]| TaskOp::Create {
        key: key.to_string(),
        value: value.to_vec(),
    };
    let written = s
        .coord
        .write(
            &leader,
            &[create(&tick, b"{\"t\":1}"), create(&state, b"{\"last\":1}")],
        )
        .await
        .ctx("write")?;
    ensure(matches!(written, Written::Done { .. }), || {
        format!("creating two new keys answered {written:?}")
    })?;
    let (t, recorded) = (get_one(&s, &tick).await?, get_one(&s, &state).await?);
    ensure(t.value == b"{\"t\":1}" && t.holder.is_none(), || {
        format!("the created task reads back as {t:?}")
    })?;
    let tick2 = format!("{}tick-2", s.queue_prefix);
    let again = s
        .coord
        .write(
            &leader,
            &[create(&tick2, b"{\"t\":2}"), create(&tick, b"{\"t\":9}")],
        )
        .await
        .ctx("write")?;
    ensure(again == Written::Conflict(vec![tick.clone()]), || {
        format!("creating an existing key answered {again:?}, not Conflict([{tick:?}])")
    })?;
    ensure(
        get(&s, std::slice::from_ref(&tick2)).await?.is_empty(),
        || "a batch with a conflicting create created its other key".to_string(),
    )?;
    let advanced = s
        .coord
        .write(
            &leader,
            &[
                create(&tick2, b"{\"t\":2}"),
                TaskOp::Rewrite {
                    key: state.clone(),
                    version: recorded.version,
                    value: b"{\"last\":2}".to_vec(),
                },
            ],
        )
        .await
        .ctx("write")?;
    let now = get_one(&s, &state).await?;
    ensure(
        matches!(advanced, Written::Done { .. }) && now.value == b"{\"last\":2}",
        || format!("the next tick with its record rewritten answered {advanced:?}, record {now:?}"),
    )?;
    let stale = s
        .coord
        .write(
            &leader,
            &[
                create(&format!("{}tick-3", s.queue_prefix), b"{}"),
                TaskOp::Rewrite {
                    key: state.clone(),
                    version: recorded.version,
                    value: b"{\"last\":3}".to_vec(),
                },
            ],
        )
        .await
        .ctx("write")?;
    ensure(stale == Written::Conflict(vec![state.clone()]), || {
        format!("a tick recorded against a stale record answered {stale:?}")
    })?;
    let own = s
        .coord
        .write_own(&a, &[create(&format!("{}own", s.queue_prefix), b"{}")])
        .await
        .ctx("write_own")?;
    ensure(matches!(own, Written::Conflict(_)), || {
        format!("a lease's own create answered {own:?}")
    })?;
    s.coord.resign(&leader.lease).await.ctx("resign")?;
    let deposed = s
        .coord
        .write(
            &leader,
            &[create(&format!("{}late", s.queue_prefix), b"{}")],
        )
        .await
        .ctx("write")?;
    let (listed, _) = list_now(&s).await?;
    let keys: Vec<&str> = listed.iter().map(|t| t.key.as_str()).collect();
    ensure(
        deposed == Written::NotLeader && keys == [state.as_str(), tick.as_str(), tick2.as_str()],
        || format!("a resigned leader's create answered {deposed:?}; the queue holds {keys:?}"),
    )
}
