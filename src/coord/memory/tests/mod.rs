//! Tests of the in-memory coordinator: the pure state driven with scripted instants (here)
//! and the shell's waits on tokio's paused clock (`shell.rs`). The contract suite runs on it
//! in `tests/contract_memory.rs`, through testkit, which links leaderq as a crate of its own.

mod shell;

use std::time::Duration;

use tokio::time::Instant;

use super::state::{Op, Outcome, State, MAX_TAKEOVER_DELAY};
use super::*;
use crate::coord::{FencingToken, TaskVersion};

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

fn state() -> (State, Instant) {
    (State::new(MemoryConfig::default()), Instant::now())
}

fn spec(node: &str, ttl: u64, takeover_delay: u64) -> LeaseSpec {
    LeaseSpec {
        node_id: node.into(),
        ttl: secs(ttl),
        takeover_delay: secs(takeover_delay),
        previous: None,
    }
}

fn open(state: &mut State, spec: LeaseSpec, now: Instant) -> LeaseId {
    match state.apply(Op::OpenLease(spec), now) {
        Ok(Outcome::Granted(grant)) => grant.lease,
        other => panic!("open_lease answered {other:?}"),
    }
}

fn campaign(state: &mut State, lease: &LeaseId, now: Instant) -> Campaign {
    let op = Op::Campaign {
        lease: lease.clone(),
        record: HolderRecord {
            node: lease.0.clone(),
            ..HolderRecord::default()
        },
    };
    match state.apply(op, now) {
        Ok(Outcome::Campaigned(campaign)) => campaign,
        other => panic!("campaign answered {other:?}"),
    }
}

fn lead(state: &mut State, lease: &LeaseId, now: Instant) -> Leadership {
    match campaign(state, lease, now) {
        Campaign::Won(leadership) => leadership,
        other => panic!("{lease} did not win: {other:?}"),
    }
}

fn keep_alive(state: &mut State, lease: &LeaseId, now: Instant) -> Renewal {
    match state.apply(Op::KeepAlive(lease.clone()), now) {
        Ok(Outcome::Renewed(renewal)) => renewal,
        other => panic!("keep_alive answered {other:?}"),
    }
}

fn put(state: &mut State, key: &str, value: &[u8], now: Instant) {
    let op = Op::Put {
        key: key.into(),
        value: value.to_vec(),
    };
    assert_eq!(state.apply(op, now), Ok(Outcome::Done));
}

fn write(state: &mut State, leadership: &Leadership, ops: Vec<TaskOp>, now: Instant) -> Written {
    let op = Op::Write {
        leadership: leadership.clone(),
        ops,
    };
    match state.apply(op, now) {
        Ok(Outcome::Written(written)) => written,
        other => panic!("write answered {other:?}"),
    }
}

fn write_own(state: &mut State, lease: &LeaseId, ops: Vec<TaskOp>, now: Instant) -> Written {
    let op = Op::WriteOwn {
        lease: lease.clone(),
        ops,
    };
    match state.apply(op, now) {
        Ok(Outcome::Written(written)) => written,
        other => panic!("write_own answered {other:?}"),
    }
}

fn task(state: &State, key: &str) -> StoredTask {
    state
        .get(&[key.to_string()])
        .pop()
        .unwrap_or_else(|| panic!("{key} is missing"))
}

fn claim(key: &str, version: TaskVersion, value: &[u8]) -> TaskOp {
    TaskOp::Claim {
        key: key.into(),
        version,
        value: value.to_vec(),
    }
}

fn release(key: &str, version: TaskVersion, value: &[u8]) -> TaskOp {
    TaskOp::Release {
        key: key.into(),
        version,
        value: value.to_vec(),
    }
}

/// A lease lives its TTL from its last keep-alive, to the instant, and is gone after.
#[test]
fn lease_lives_its_ttl_from_the_last_keep_alive() {
    let (mut state, t0) = state();
    let lease = open(&mut state, spec("a", 10, 0), t0);
    assert_eq!(state.next_deadline(), Some(t0 + secs(10)));
    assert_eq!(keep_alive(&mut state, &lease, t0 + secs(9)), Renewal::Alive);
    assert_eq!(state.next_deadline(), Some(t0 + secs(19)));
    let just_before = t0 + secs(19) - Duration::from_millis(1);
    assert_eq!(keep_alive(&mut state, &lease, just_before), Renewal::Alive);
    let after = just_before + secs(10);
    assert_eq!(keep_alive(&mut state, &lease, after), Renewal::Gone);
    assert_eq!(state.next_deadline(), None);
}

/// A TTL outside the configured range is refused, naming the range.
#[test]
fn a_ttl_out_of_range_is_refused() {
    let (mut state, t0) = state();
    let mut short = spec("a", 1, 0);
    short.ttl = Duration::from_millis(500);
    let refused = state.apply(Op::OpenLease(short), t0);
    assert!(
        matches!(&refused, Err(CoordError::Refused(why)) if why.contains("1s")),
        "{refused:?}"
    );
    let long = spec("a", 25 * 3600, 0);
    assert!(matches!(
        state.apply(Op::OpenLease(long), t0),
        Err(CoordError::Refused(_))
    ));
}

/// Tokens rise by one on every acquisition, a re-campaign by the holder included; a
/// campaign on held leadership hears `Held` and a dead lease hears `LeaseGone`.
#[test]
fn every_acquisition_raises_the_token() {
    let (mut state, t0) = state();
    let a = open(&mut state, spec("a", 10, 0), t0);
    let b = open(&mut state, spec("b", 10, 0), t0);
    assert_eq!(lead(&mut state, &a, t0).fencing_token, FencingToken(1));
    assert_eq!(campaign(&mut state, &b, t0), Campaign::Held);
    let again = lead(&mut state, &a, t0);
    assert_eq!(again.fencing_token, FencingToken(2));
    state.apply(Op::Resign(again.lease), t0).unwrap();
    assert_eq!(lead(&mut state, &b, t0).fencing_token, FencingToken(3));
    state.apply(Op::Revoke(a.clone()), t0).unwrap();
    assert_eq!(campaign(&mut state, &a, t0), Campaign::LeaseGone);
    let (holder, _) = state.holder();
    assert_eq!((holder.lease, holder.token), (Some(b), FencingToken(3)));
}

/// A write answers `NotLeader` under a leadership that is not the current one, though its
/// lease may still lead: one superseded by the holder's own re-campaign (Consul's guard
/// checks the leader key's index, not only its session), or one whose record an operator
/// deleted; the next acquisition's token still rises past every earlier one.
#[test]
fn only_the_current_leadership_writes() {
    let (mut state, t0) = state();
    let a = open(&mut state, spec("a", 10, 0), t0);
    let first = lead(&mut state, &a, t0);
    let again = lead(&mut state, &a, t0);
    assert_eq!(
        write(&mut state, &first, Vec::new(), t0),
        Written::NotLeader
    );
    assert_eq!(
        write(&mut state, &again, Vec::new(), t0),
        Written::Done {
            versions: Vec::new(),
            fencing_token: again.fencing_token
        }
    );
    state.apply(Op::DeleteLeaderRecord, t0).unwrap();
    let free = Holder {
        token: FencingToken(2),
        ..Holder::default()
    };
    assert_eq!(
        state.holder().0,
        free,
        "the record goes, the last token stays"
    );
    assert_eq!(
        write(&mut state, &again, Vec::new(), t0),
        Written::NotLeader
    );
    assert_eq!(lead(&mut state, &a, t0).fencing_token, FencingToken(3));
}

/// A holder whose lease expires holds leadership back for its lock-delay counted from its
/// deadline, not from when the expiry was noticed; a resignation holds nothing back.
#[test]
fn lock_delay_runs_from_the_death_of_the_holder() {
    let (mut state, t0) = state();
    let a = open(&mut state, spec("a", 10, 5), t0);
    let b = open(&mut state, spec("b", 100, 5), t0);
    let by_a = lead(&mut state, &a, t0);
    state.apply(Op::Resign(by_a.lease), t0).unwrap();
    let by_b = lead(&mut state, &b, t0);
    state.apply(Op::Resign(by_b.lease), t0).unwrap();
    lead(&mut state, &a, t0);
    // a dies at t0+10 (its TTL): nobody may lead before t0+15.
    assert_eq!(campaign(&mut state, &b, t0 + secs(12)), Campaign::Delayed);
    let almost = t0 + secs(15) - Duration::from_millis(1);
    assert_eq!(campaign(&mut state, &b, almost), Campaign::Delayed);
    assert!(matches!(
        campaign(&mut state, &b, t0 + secs(15)),
        Campaign::Won(_)
    ));
}

/// Revoking the holder's lease sets the lock-delay, capped at 60 s; revoking a lease that
/// resigned first sets none.
#[test]
fn revoking_the_holder_delays_and_the_delay_is_capped() {
    let (mut state, t0) = state();
    let a = open(&mut state, spec("a", 1000, 600), t0);
    let b = open(&mut state, spec("b", 1000, 600), t0);
    lead(&mut state, &a, t0);
    state.apply(Op::Revoke(a), t0).unwrap();
    assert_eq!(
        campaign(&mut state, &b, t0 + MAX_TAKEOVER_DELAY - secs(1)),
        Campaign::Delayed
    );
    let by_b = lead(&mut state, &b, t0 + MAX_TAKEOVER_DELAY);
    let c = open(&mut state, spec("c", 1000, 0), t0 + MAX_TAKEOVER_DELAY);
    state
        .apply(Op::Resign(by_b.lease), t0 + MAX_TAKEOVER_DELAY)
        .unwrap();
    state.apply(Op::Revoke(b), t0 + MAX_TAKEOVER_DELAY).unwrap();
    assert!(matches!(
        campaign(&mut state, &c, t0 + MAX_TAKEOVER_DELAY),
        Campaign::Won(_)
    ));
}

/// The test hook `Expire` ends a lease like its TTL: lock-delay applies.
#[test]
fn an_expire_hook_acts_as_the_ttl() {
    let (mut state, t0) = state();
    let a = open(&mut state, spec("a", 10, 5), t0);
    let b = open(&mut state, spec("b", 10, 0), t0);
    lead(&mut state, &a, t0);
    state.apply(Op::Expire(a.clone()), t0 + secs(1)).unwrap();
    assert_eq!(keep_alive(&mut state, &a, t0 + secs(1)), Renewal::Gone);
    assert_eq!(campaign(&mut state, &b, t0 + secs(5)), Campaign::Delayed);
    assert!(matches!(
        campaign(&mut state, &b, t0 + secs(6)),
        Campaign::Won(_)
    ));
}

/// A dead lease's claims lose their holder and keep their value, all under one new
/// version; a claim on them waits out the lock-delay, a requeue does not.
#[test]
fn a_dead_lease_frees_its_claims_in_one_change() {
    let (mut state, t0) = state();
    let a = open(&mut state, spec("a", 10, 3), t0);
    let b = open(&mut state, spec("b", 100, 0), t0);
    put(&mut state, "q/1", b"one", t0);
    put(&mut state, "q/2", b"two", t0);
    let by_a = lead(&mut state, &a, t0);
    let ops = vec![
        claim("q/1", task(&state, "q/1").version, b"one taken"),
        claim("q/2", task(&state, "q/2").version, b"two taken"),
    ];
    let Written::Done { versions, .. } = write(&mut state, &by_a, ops, t0) else {
        panic!("the claim failed");
    };
    assert_eq!(versions.len(), 2);
    // Resigned, so only the claims are held back when a dies.
    state.apply(Op::Resign(by_a.lease), t0).unwrap();
    let before = state.index();
    let at = t0 + secs(11);
    state.expire(at);
    assert_eq!(state.index(), before + 1, "one change for the whole death");
    let (tasks, version) = state.list("q/");
    assert_eq!(version.0, before + 1);
    for (task, value) in tasks.iter().zip([&b"one taken"[..], b"two taken"]) {
        assert_eq!(task.holder, None);
        assert_eq!(task.value, value);
        assert_eq!(task.version, TaskVersion(before + 1));
    }
    // a died at t0+10 with a lock-delay of 3 s: its claims can be taken from t0+13.
    let by_b = lead(&mut state, &b, at);
    let v1 = tasks[0].version;
    assert_eq!(
        write(&mut state, &by_b, vec![claim("q/1", v1, b"x")], at),
        Written::Deferred(vec!["q/1".into()])
    );
    let requeue = TaskOp::Rewrite {
        key: "q/2".into(),
        version: tasks[1].version,
        value: b"two again".to_vec(),
    };
    assert!(matches!(
        write(&mut state, &by_b, vec![requeue], at),
        Written::Done { .. }
    ));
    assert!(matches!(
        write(
            &mut state,
            &by_b,
            vec![claim("q/1", v1, b"x")],
            t0 + secs(13)
        ),
        Written::Done { .. }
    ));
}

/// Every failing op of a batch is named once, in op order, and nothing is applied: not a
/// task, not the version.
#[test]
fn a_conflict_names_every_failed_key_and_applies_nothing() {
    let (mut state, t0) = state();
    let a = open(&mut state, spec("a", 10, 0), t0);
    let by_a = lead(&mut state, &a, t0);
    put(&mut state, "q/1", b"one", t0);
    put(&mut state, "q/2", b"two", t0);
    let v1 = task(&state, "q/1").version;
    let before = state.list("q/");
    let index = state.index();
    let ops = vec![
        claim("q/2", TaskVersion(1), b"stale"),
        claim("q/1", v1, b"fine"),
        claim("q/3", TaskVersion(1), b"missing"),
        TaskOp::Complete {
            key: "q/2".into(),
            version: TaskVersion(1),
        },
    ];
    assert_eq!(
        write(&mut state, &by_a, ops, t0),
        Written::Conflict(vec!["q/2".into(), "q/3".into()])
    );
    assert_eq!(state.list("q/"), before);
    assert_eq!(state.index(), index);
}

/// Ops in one batch see the ops before them: a task completed earlier in the batch is
/// gone for a later claim; a claim then a release of the claim's version both apply.
#[test]
fn ops_see_the_ops_before_them_in_the_batch() {
    let (mut state, t0) = state();
    let a = open(&mut state, spec("a", 10, 0), t0);
    let by_a = lead(&mut state, &a, t0);
    put(&mut state, "q/1", b"one", t0);
    let v = task(&state, "q/1").version;
    let gone = vec![
        TaskOp::Complete {
            key: "q/1".into(),
            version: v,
        },
        claim("q/1", v, b"x"),
    ];
    assert_eq!(
        write(&mut state, &by_a, gone, t0),
        Written::Conflict(vec!["q/1".into()])
    );
    let next = TaskVersion(state.index() + 1);
    let both = vec![claim("q/1", v, b"taken"), release("q/1", next, b"back")];
    assert_eq!(
        write(&mut state, &by_a, both, t0),
        Written::Done {
            versions: vec![("q/1".into(), next), ("q/1".into(), next)],
            fencing_token: FencingToken(1),
        }
    );
    let t = task(&state, "q/1");
    assert_eq!(
        (t.value.as_slice(), t.holder, t.version),
        (&b"back"[..], None, next)
    );
}

/// Claims conflict on a task another live lease holds; releases on one this lease does
/// not hold; rewrites on any held task. Moves and completions need only the version.
#[test]
fn each_op_checks_what_it_needs() {
    let (mut state, t0) = state();
    let a = open(&mut state, spec("a", 100, 0), t0);
    let b = open(&mut state, spec("b", 100, 0), t0);
    put(&mut state, "q/1", b"one", t0);
    let by_a = lead(&mut state, &a, t0);
    let v = task(&state, "q/1").version;
    write(&mut state, &by_a, vec![claim("q/1", v, b"a's")], t0);
    state.apply(Op::Resign(by_a.lease), t0).unwrap();
    let by_b = lead(&mut state, &b, t0);
    let held = task(&state, "q/1").version;
    let conflict = Written::Conflict(vec!["q/1".into()]);
    for op in [
        claim("q/1", held, b"b's"),
        release("q/1", held, b"b's"),
        TaskOp::Rewrite {
            key: "q/1".into(),
            version: held,
            value: b"b's".to_vec(),
        },
    ] {
        assert_eq!(
            write(&mut state, &by_b, vec![op.clone()], t0),
            conflict,
            "{op:?}"
        );
    }
    let moved = TaskOp::Move {
        key: "q/1".into(),
        version: held,
        to: "dead/1".into(),
        value: b"dead".to_vec(),
    };
    assert!(matches!(
        write(&mut state, &by_b, vec![moved], t0),
        Written::Done { .. }
    ));
    let dead = task(&state, "dead/1");
    assert_eq!((dead.value.as_slice(), dead.holder), (&b"dead"[..], None));
}

/// A lease that does not lead answers `NotLeader`, after the limits are checked: a batch
/// over them is refused whoever sends it.
#[test]
fn limits_come_before_leadership() {
    let (mut state, t0) = state();
    let a = open(&mut state, spec("a", 10, 0), t0);
    let by_a = lead(&mut state, &a, t0);
    state.apply(Op::Resign(by_a.lease.clone()), t0).unwrap();
    let complete = |n: usize| TaskOp::Complete {
        key: format!("q/{n}"),
        version: TaskVersion(1),
    };
    assert_eq!(
        write(&mut state, &by_a, vec![complete(0)], t0),
        Written::NotLeader
    );
    let over: Vec<TaskOp> = (0..DEFAULT_MAX_OPS).map(complete).collect();
    let refused = state.apply(
        Op::Write {
            leadership: by_a,
            ops: over.clone(),
        },
        t0,
    );
    assert!(
        matches!(refused, Err(CoordError::Refused(_))),
        "{refused:?}"
    );
    // Without the guard, the same count fits.
    assert!(matches!(
        write_own(&mut state, &a, over, t0),
        Written::Conflict(_)
    ));
}

/// `write_own` applies only when every task is held by the lease, leadership or not.
#[test]
fn write_own_needs_every_task_held_by_the_lease() {
    let (mut state, t0) = state();
    let a = open(&mut state, spec("a", 100, 0), t0);
    put(&mut state, "q/1", b"one", t0);
    put(&mut state, "q/2", b"two", t0);
    let by_a = lead(&mut state, &a, t0);
    let v1 = task(&state, "q/1").version;
    write(&mut state, &by_a, vec![claim("q/1", v1, b"taken")], t0);
    state.apply(Op::Resign(by_a.lease), t0).unwrap();
    let held = task(&state, "q/1").version;
    let v2 = task(&state, "q/2").version;
    let mixed = vec![release("q/1", held, b"one"), release("q/2", v2, b"two")];
    assert!(matches!(
        write_own(&mut state, &a, mixed, t0),
        Written::Conflict(keys) if keys == ["q/2"]
    ));
    assert_eq!(task(&state, "q/1").holder, Some(a.clone()));
    assert!(matches!(
        write_own(&mut state, &a, vec![release("q/1", held, b"one")], t0),
        Written::Done { .. }
    ));
    assert_eq!(task(&state, "q/1").holder, None);
}

/// A producer's write keeps the task's claim and creation, and moves its version; a
/// dead-letter onto an existing key keeps that key's creation too.
#[test]
fn writes_over_existing_tasks_keep_creation_and_claims() {
    let (mut state, t0) = state();
    let a = open(&mut state, spec("a", 100, 0), t0);
    put(&mut state, "dead/1", b"old dead", t0);
    put(&mut state, "q/1", b"one", t0);
    let by_a = lead(&mut state, &a, t0);
    let first = task(&state, "q/1");
    write(
        &mut state,
        &by_a,
        vec![claim("q/1", first.version, b"taken")],
        t0,
    );
    put(&mut state, "q/1", b"producer again", t0);
    let again = task(&state, "q/1");
    assert_eq!(again.holder, Some(a.clone()));
    assert_eq!(again.created, first.created);
    assert!(again.version > first.version);
    let dead_created = task(&state, "dead/1").created;
    let moved = TaskOp::Move {
        key: "q/1".into(),
        version: again.version,
        to: "dead/1".into(),
        value: b"new dead".to_vec(),
    };
    write(&mut state, &by_a, vec![moved], t0);
    assert_eq!(task(&state, "dead/1").created, dead_created);
    assert_eq!(state.get(&["q/1".into()]), vec![]);
}

/// A restart takes up its own live lease with the same TTL; another node's lease is left
/// alone; its own lease with another TTL is replaced, giving leadership up without delay.
#[test]
fn previous_leases_are_reused_left_or_replaced() {
    let (mut state, t0) = state();
    let a = open(&mut state, spec("a", 10, 5), t0);
    lead(&mut state, &a, t0);
    let with_previous = |node: &str, ttl| LeaseSpec {
        previous: Some(a.clone()),
        ..spec(node, ttl, 5)
    };
    let grant = |state: &mut State, spec| match state.apply(Op::OpenLease(spec), t0 + secs(5)) {
        Ok(Outcome::Granted(grant)) => grant,
        other => panic!("{other:?}"),
    };
    let own = grant(&mut state, with_previous("a", 10));
    assert_eq!((own.lease.clone(), own.reused), (a.clone(), true));
    assert_eq!(state.next_deadline(), Some(t0 + secs(15)));
    let other = grant(&mut state, with_previous("b", 10));
    assert!(!other.reused && other.lease != a);
    assert_eq!(state.holder().0.lease, Some(a.clone()));
    let replaced = grant(&mut state, with_previous("a", 20));
    assert!(!replaced.reused && replaced.lease != a);
    assert_eq!(keep_alive(&mut state, &a, t0 + secs(5)), Renewal::Gone);
    assert!(matches!(
        campaign(&mut state, &replaced.lease, t0 + secs(5)),
        Campaign::Won(_)
    ));
}

/// Versions start above 0 (0 means "do not wait") and move once per visible change:
/// opening and keeping leases alive move nothing.
#[test]
fn versions_move_once_per_visible_change() {
    let (mut state, t0) = state();
    assert!(state.holder().1 > Version(0) && state.list("").1 > Version(0));
    let start = state.index();
    let a = open(&mut state, spec("a", 10, 0), t0);
    keep_alive(&mut state, &a, t0);
    assert_eq!(state.index(), start);
    let by_a = lead(&mut state, &a, t0);
    assert_eq!(state.holder().1, Version(start + 1));
    put(&mut state, "q/1", b"one", t0);
    assert_eq!(state.list("q/").1, Version(start + 2));
    state.apply(Op::Resign(by_a.lease), t0).unwrap();
    assert_eq!(state.holder().1, Version(start + 3));
    assert_eq!(state.list("q/").1, Version(start + 2));
}
