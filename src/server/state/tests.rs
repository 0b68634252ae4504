//! Scripted-time tests of the state machine: every rule is driven by explicit commands and
//! instants, with no clock, network or disk.
//!
//! Size: one scripted-time test per rule of the state machine.

use super::*;

const NODE: &str = "node-1";

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// A state with the agent's node registered, as the server has after start.
fn state() -> (State, Instant) {
    let mut state = State::new(
        Config {
            session_ttl_min: secs(1),
        },
        Instant::now(),
    );
    let t0 = Instant::now();
    state
        .apply(
            Command::RegisterNode {
                name: NODE.into(),
                id: "00000000-0000-0000-0000-000000000001".into(),
                address: "127.0.0.1".into(),
            },
            t0,
        )
        .unwrap();
    (state, t0)
}

fn spec(id: &str) -> SessionSpec {
    SessionSpec {
        id: id.into(),
        name: String::new(),
        node: NODE.into(),
        lock_delay: DEFAULT_LOCK_DELAY,
        behavior: "release".into(),
        ttl: String::new(),
        node_checks: vec![SERF_CHECK_ID.into()],
        service_checks: None,
        checks: Vec::new(),
    }
}

fn create(state: &mut State, spec: SessionSpec, now: Instant) -> String {
    match state.apply(Command::SessionCreate(spec), now).unwrap() {
        Outcome::SessionCreated(id) => id,
        other => panic!("unexpected {other:?}"),
    }
}

fn put(state: &mut State, key: &str, value: &str, now: Instant) {
    state
        .apply(
            Command::KvSet {
                key: key.into(),
                value: value.into(),
                flags: 0,
            },
            now,
        )
        .unwrap();
}

fn acquire(
    state: &mut State,
    key: &str,
    session: &str,
    now: Instant,
) -> Result<Outcome, ApplyError> {
    state.apply(
        Command::KvLock {
            key: key.into(),
            value: b"v".to_vec(),
            flags: 0,
            session: session.into(),
        },
        now,
    )
}

fn release(state: &mut State, key: &str, session: &str, now: Instant) -> Outcome {
    state
        .apply(
            Command::KvUnlock {
                key: key.into(),
                value: b"v".to_vec(),
                flags: 0,
                session: session.into(),
            },
            now,
        )
        .unwrap()
}

fn op(verb: &str, key: &str) -> TxnOp {
    TxnOp {
        verb: verb.into(),
        key: key.into(),
        ..TxnOp::default()
    }
}

/// Acquire creates with LockIndex 1, re-acquire by the holder keeps it, another session
/// is refused, and a new holder after release increments it.
#[test]
fn lock_index_follows_consul_lock_table() {
    let (mut s, t0) = state();
    let a = create(&mut s, spec("a"), t0);
    let b = create(&mut s, spec("b"), t0);
    assert_eq!(acquire(&mut s, "k", &a, t0), Ok(Outcome::Bool(true)));
    assert_eq!(s.kv_get("k").unwrap().lock_index, 1);
    assert_eq!(s.kv_get("k").unwrap().session.as_deref(), Some("a"));
    assert_eq!(acquire(&mut s, "k", &a, t0), Ok(Outcome::Bool(true)));
    assert_eq!(s.kv_get("k").unwrap().lock_index, 1);
    assert_eq!(acquire(&mut s, "k", &b, t0), Ok(Outcome::Bool(false)));
    assert_eq!(release(&mut s, "k", &b, t0), Outcome::Bool(false));
    assert_eq!(release(&mut s, "k", &a, t0), Outcome::Bool(true));
    let released = s.kv_get("k").unwrap();
    assert_eq!((released.session.clone(), released.lock_index), (None, 1));
    assert_eq!(acquire(&mut s, "k", &b, t0), Ok(Outcome::Bool(true)));
    assert_eq!(s.kv_get("k").unwrap().lock_index, 2);
    assert_eq!(release(&mut s, "missing", &b, t0), Outcome::Bool(false));
}

/// Acquire with an unknown or empty session is an error (HTTP 500), not `false`.
#[test]
fn acquire_with_unknown_session_is_an_error() {
    let (mut s, t0) = state();
    assert_eq!(
        acquire(&mut s, "k", "nope", t0),
        Err(ApplyError::InvalidSession("nope".into()))
    );
    assert_eq!(
        ApplyError::InvalidSession("nope".into()).to_string(),
        "invalid session \"nope\""
    );
    assert_eq!(
        acquire(&mut s, "k", "", t0),
        Err(ApplyError::MissingSession)
    );
    assert!(s.kv_get("k").is_none());
}

/// A plain PUT keeps the lock holder but, as in Consul, takes LockIndex from the request.
#[test]
fn plain_put_keeps_session_and_resets_flags() {
    let (mut s, t0) = state();
    let a = create(&mut s, spec("a"), t0);
    s.apply(
        Command::KvLock {
            key: "k".into(),
            value: b"v".to_vec(),
            flags: 42,
            session: a.clone(),
        },
        t0,
    )
    .unwrap();
    put(&mut s, "k", "new", t0);
    let entry = s.kv_get("k").unwrap();
    assert_eq!(entry.session.as_deref(), Some("a"));
    assert_eq!(entry.flags, 0);
    assert_eq!(entry.value, b"new");
}

/// A write that changes nothing keeps ModifyIndex and uses no index.
#[test]
fn identical_write_is_skipped() {
    let (mut s, t0) = state();
    put(&mut s, "k", "v", t0);
    let before = (s.kv_get("k").unwrap().modify_index, s.index());
    put(&mut s, "k", "v", t0);
    assert_eq!((s.kv_get("k").unwrap().modify_index, s.index()), before);
    put(&mut s, "k", "w", t0);
    assert!(s.kv_get("k").unwrap().modify_index > before.0);
}

/// Destroying a session releases its locks, keeps LockIndex and value, and starts
/// lock-delay, during which any session's acquire returns false; after it, acquire works.
#[test]
fn lock_delay_window_follows_invalidation() {
    let (mut s, t0) = state();
    let a = create(&mut s, spec("a"), t0);
    let b = create(&mut s, spec("b"), t0);
    acquire(&mut s, "k", &a, t0).unwrap();
    s.apply(Command::SessionDestroy { id: a.clone() }, t0)
        .unwrap();
    let entry = s.kv_get("k").unwrap();
    assert_eq!(
        (entry.session.clone(), entry.lock_index, entry.value.clone()),
        (None, 1, b"v".to_vec())
    );
    assert_eq!(
        acquire(&mut s, "k", &b, t0 + secs(14)),
        Ok(Outcome::Bool(false))
    );
    // Lock-delay is checked before the session, as on Consul's leader.
    assert_eq!(
        acquire(&mut s, "k", "ghost", t0 + secs(14)),
        Ok(Outcome::Bool(false))
    );
    assert_eq!(
        acquire(&mut s, "k", &b, t0 + secs(15)),
        Ok(Outcome::Bool(true))
    );
    assert_eq!(s.kv_get("k").unwrap().lock_index, 2);
}

/// Release never starts lock-delay: another session can acquire at once.
#[test]
fn release_sets_no_lock_delay() {
    let (mut s, t0) = state();
    let a = create(&mut s, spec("a"), t0);
    let b = create(&mut s, spec("b"), t0);
    acquire(&mut s, "k", &a, t0).unwrap();
    release(&mut s, "k", &a, t0);
    assert_eq!(acquire(&mut s, "k", &b, t0), Ok(Outcome::Bool(true)));
}

/// Lock-delay is capped at 60s and disabled by 0.
#[test]
fn lock_delay_is_capped_and_can_be_disabled() {
    let (mut s, t0) = state();
    let long = create(
        &mut s,
        SessionSpec {
            lock_delay: secs(600),
            ..spec("long")
        },
        t0,
    );
    let none = create(
        &mut s,
        SessionSpec {
            lock_delay: Duration::ZERO,
            ..spec("none")
        },
        t0,
    );
    let other = create(&mut s, spec("other"), t0);
    acquire(&mut s, "a", &long, t0).unwrap();
    acquire(&mut s, "b", &none, t0).unwrap();
    s.apply(Command::SessionDestroy { id: long }, t0).unwrap();
    s.apply(Command::SessionDestroy { id: none }, t0).unwrap();
    assert_eq!(acquire(&mut s, "b", &other, t0), Ok(Outcome::Bool(true)));
    assert_eq!(
        acquire(&mut s, "a", &other, t0 + secs(59)),
        Ok(Outcome::Bool(false))
    );
    assert_eq!(
        acquire(&mut s, "a", &other, t0 + secs(60)),
        Ok(Outcome::Bool(true))
    );
}

/// A TTL session expires at TTL×2 unless renewed; renewing pushes the deadline.
#[test]
fn ttl_session_expires_after_twice_its_ttl() {
    let (mut s, t0) = state();
    let a = create(
        &mut s,
        SessionSpec {
            ttl: "10s".into(),
            ..spec("a")
        },
        t0,
    );
    acquire(&mut s, "k", &a, t0).unwrap();
    assert_eq!(s.next_deadline(), Some(t0 + secs(20)));
    s.expire(t0 + secs(19));
    assert!(s.session(&a).is_some());
    assert!(matches!(
        s.apply(Command::SessionRenew { id: a.clone() }, t0 + secs(15)),
        Ok(Outcome::Renewed(Some(_)))
    ));
    s.expire(t0 + secs(34));
    assert!(s.session(&a).is_some());
    s.expire(t0 + secs(35));
    assert!(s.session(&a).is_none());
    assert_eq!(s.kv_get("k").unwrap().session, None);
    assert_eq!(
        s.apply(Command::SessionRenew { id: a }, t0 + secs(36)),
        Ok(Outcome::Renewed(None))
    );
}

/// TTL bounds and syntax produce Consul's error texts.
#[test]
fn session_ttl_is_validated() {
    let mut s = State::new(Config::default(), Instant::now());
    let t0 = Instant::now();
    s.apply(
        Command::RegisterNode {
            name: NODE.into(),
            id: "x".into(),
            address: "127.0.0.1".into(),
        },
        t0,
    )
    .unwrap();
    let err = s
        .apply(
            Command::SessionCreate(SessionSpec {
                ttl: "5s".into(),
                ..spec("a")
            }),
            t0,
        )
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "Invalid Session TTL '5000000000', must be between [10s=24h0m0s]"
    );
    let err = s
        .apply(
            Command::SessionCreate(SessionSpec {
                ttl: "10z".into(),
                ..spec("a")
            }),
            t0,
        )
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "Session TTL '10z' invalid: time: unknown unit \"z\" in duration \"10z\""
    );
    // "0s" means no TTL at all.
    create(
        &mut s,
        SessionSpec {
            ttl: "0s".into(),
            ..spec("b")
        },
        t0,
    );
    assert_eq!(s.next_deadline(), None);
}

/// Behavior `delete` deletes held keys (with a tombstone) instead of releasing them.
#[test]
fn delete_behavior_removes_held_keys() {
    let (mut s, t0) = state();
    let a = create(
        &mut s,
        SessionSpec {
            behavior: "delete".into(),
            ..spec("a")
        },
        t0,
    );
    acquire(&mut s, "svc/k", &a, t0).unwrap();
    s.apply(Command::SessionDestroy { id: a }, t0).unwrap();
    assert!(s.kv_get("svc/k").is_none());
    assert_eq!(s.tombstone("svc/k"), Some(s.index()));
    assert_eq!(
        s.apply(
            Command::SessionCreate(SessionSpec {
                behavior: "bogus".into(),
                ..spec("b")
            }),
            t0
        ),
        Err(ApplyError::InvalidBehavior("bogus".into()))
    );
}

/// Sessions need a registered node and non-critical checks that exist.
#[test]
fn session_checks_are_validated() {
    let (mut s, t0) = state();
    assert_eq!(
        s.apply(
            Command::SessionCreate(SessionSpec {
                node: "other".into(),
                ..spec("a")
            }),
            t0
        ),
        Err(ApplyError::MissingNode)
    );
    assert_eq!(
        s.apply(
            Command::SessionCreate(SessionSpec {
                node_checks: vec!["nope".into()],
                ..spec("a")
            }),
            t0
        ),
        Err(ApplyError::MissingCheck("nope".into()))
    );
    s.apply(
        Command::CheckRegister(check_spec("c", CheckStatus::Critical)),
        t0,
    )
    .unwrap();
    assert_eq!(
        s.apply(
            Command::SessionCreate(SessionSpec {
                node_checks: vec!["c".into()],
                ..spec("a")
            }),
            t0
        )
        .unwrap_err()
        .to_string(),
        "Check 'c' is in critical state"
    );
}

fn check_spec(id: &str, status: CheckStatus) -> CheckSpec {
    CheckSpec {
        id: id.into(),
        name: id.into(),
        status,
        notes: String::new(),
        output: String::new(),
        service_id: String::new(),
        ttl: secs(5),
    }
}

/// A TTL check that is not updated within its TTL goes critical and invalidates every
/// session bound to it, releasing its locks with lock-delay, exactly as a destroy does.
#[test]
fn expired_check_invalidates_bound_sessions() {
    let (mut s, t0) = state();
    s.apply(
        Command::CheckRegister(check_spec("c", CheckStatus::Passing)),
        t0,
    )
    .unwrap();
    let a = create(
        &mut s,
        SessionSpec {
            node_checks: vec![SERF_CHECK_ID.into(), "c".into()],
            ..spec("a")
        },
        t0,
    );
    let unbound = create(&mut s, spec("u"), t0);
    acquire(&mut s, "k", &a, t0).unwrap();
    // A pass at 4s pushes the check's deadline to 9s.
    s.apply(
        Command::CheckUpdate {
            id: "c".into(),
            status: CheckStatus::Passing,
            output: String::new(),
        },
        t0 + secs(4),
    )
    .unwrap();
    s.expire(t0 + secs(8));
    assert!(s.session(&a).is_some());
    s.expire(t0 + secs(9));
    assert!(s.session(&a).is_none());
    assert!(s.session(&unbound).is_some());
    let check = s.checks().find(|c| c.id == "c").unwrap();
    assert_eq!(
        (check.status, check.output.as_str()),
        (CheckStatus::Critical, "TTL expired")
    );
    assert_eq!(s.kv_get("k").unwrap().session, None);
    assert_eq!(
        acquire(&mut s, "k", &unbound, t0 + secs(10)),
        Ok(Outcome::Bool(false))
    );
}

/// Warning does not invalidate; fail and deregister do.
#[test]
fn check_status_changes_invalidate_only_on_critical_or_removal() {
    let (mut s, t0) = state();
    s.apply(
        Command::CheckRegister(check_spec("c", CheckStatus::Passing)),
        t0,
    )
    .unwrap();
    s.apply(
        Command::CheckRegister(check_spec("d", CheckStatus::Passing)),
        t0,
    )
    .unwrap();
    let bound = |id: &str, check: &str| SessionSpec {
        node_checks: vec![check.into()],
        ..spec(id)
    };
    let a = create(&mut s, bound("a", "c"), t0);
    let b = create(&mut s, bound("b", "d"), t0);
    let update = |status| Command::CheckUpdate {
        id: "c".into(),
        status,
        output: String::new(),
    };
    s.apply(update(CheckStatus::Warning), t0).unwrap();
    assert!(s.session(&a).is_some());
    s.apply(update(CheckStatus::Critical), t0).unwrap();
    assert!(s.session(&a).is_none());
    s.apply(Command::CheckDeregister { id: "d".into() }, t0)
        .unwrap();
    assert!(s.session(&b).is_none());
    assert_eq!(
        s.apply(Command::CheckDeregister { id: "d".into() }, t0),
        Err(ApplyError::UnknownCheck("d".into()))
    );
    assert_eq!(
        s.apply(
            Command::CheckUpdate {
                id: SERF_CHECK_ID.into(),
                status: CheckStatus::Passing,
                output: String::new()
            },
            t0
        ),
        Err(ApplyError::UnknownCheck(SERF_CHECK_ID.into()))
    );
}

/// Missing-key reads report the table index; prefix reads report the newest entry or
/// tombstone under the prefix, so deleting the newest key never moves it backwards.
#[test]
fn indexes_and_tombstones_follow_consul() {
    let (mut s, t0) = state();
    put(&mut s, "a/1", "x", t0);
    put(&mut s, "a/2", "x", t0);
    let newest = s.kv_get("a/2").unwrap().modify_index;
    put(&mut s, "b/1", "x", t0);
    assert_eq!(s.kv_prefix_index("a/"), newest);
    assert_eq!(s.kv_key_index("a/1"), s.kv_get("a/1").unwrap().modify_index);
    assert_eq!(s.kv_key_index("missing"), s.index());
    s.apply(Command::KvDelete { key: "a/2".into() }, t0)
        .unwrap();
    let deleted_at = s.index();
    assert!(deleted_at > newest);
    assert_eq!(s.kv_prefix_index("a/"), deleted_at);
    // A prefix with nothing under it falls back to the whole table's index.
    assert_eq!(s.kv_prefix_index("zzz/"), deleted_at);
    // Deleting a missing key writes no tombstone and uses no index.
    s.apply(Command::KvDelete { key: "nope".into() }, t0)
        .unwrap();
    assert_eq!(s.index(), deleted_at);
    // Tombstones are reaped after 15 minutes; then the prefix index may go back.
    s.expire(t0 + TOMBSTONE_TTL);
    assert_eq!(s.tombstone("a/2"), None);
    assert_eq!(
        s.kv_prefix_index("a/"),
        s.kv_get("a/1").unwrap().modify_index
    );
}

/// Delete-tree leaves one tombstone for a non-empty prefix and none for the root.
#[test]
fn delete_tree_tombstones() {
    let (mut s, t0) = state();
    put(&mut s, "p/1", "x", t0);
    put(&mut s, "p/2", "x", t0);
    put(&mut s, "q", "x", t0);
    s.apply(
        Command::KvDeleteTree {
            prefix: "p/".into(),
        },
        t0,
    )
    .unwrap();
    assert_eq!(s.kv_list("p/").count(), 0);
    assert_eq!(s.tombstone("p/"), Some(s.index()));
    assert_eq!(s.tombstone("p/1"), None);
    s.apply(
        Command::KvDeleteTree {
            prefix: String::new(),
        },
        t0,
    )
    .unwrap();
    assert_eq!(s.kv_len(), 0);
    assert_eq!(s.tombstone(""), None);
}

/// CAS: 0 creates only; N needs the exact ModifyIndex; delete-cas of a missing key is true.
#[test]
fn cas_rules() {
    let (mut s, t0) = state();
    let cas = |key: &str, index| Command::KvCas {
        key: key.into(),
        value: b"v".to_vec(),
        flags: 0,
        index,
    };
    assert_eq!(s.apply(cas("k", 0), t0), Ok(Outcome::Bool(true)));
    assert_eq!(s.apply(cas("k", 0), t0), Ok(Outcome::Bool(false)));
    let idx = s.kv_get("k").unwrap().modify_index;
    assert_eq!(s.apply(cas("k", idx + 1), t0), Ok(Outcome::Bool(false)));
    assert_eq!(s.apply(cas("missing", 5), t0), Ok(Outcome::Bool(false)));
    let dcas = |key: &str, index| Command::KvDeleteCas {
        key: key.into(),
        index,
    };
    assert_eq!(s.apply(dcas("k", 0), t0), Ok(Outcome::Bool(false)));
    assert_eq!(s.apply(dcas("k", idx), t0), Ok(Outcome::Bool(true)));
    assert_eq!(s.apply(dcas("k", 99), t0), Ok(Outcome::Bool(true)));
}

/// A txn applies all ops under one index and returns write results without values.
#[test]
fn txn_commits_atomically_with_one_index() {
    let (mut s, t0) = state();
    put(&mut s, "old", "x", t0);
    let ops = vec![
        TxnOp {
            value: b"1".to_vec(),
            ..op("set", "a")
        },
        TxnOp {
            value: b"2".to_vec(),
            ..op("set", "b")
        },
        op("delete", "old"),
        op("get", "a"),
    ];
    let Ok(Outcome::TxnCommitted(results)) = s.apply(Command::Txn(ops), t0) else {
        panic!("txn failed");
    };
    let idx = s.index();
    assert_eq!(results.len(), 3);
    assert_eq!(results[0].entry.modify_index, idx);
    assert!(results[0].entry.value.is_empty());
    assert_eq!(results[2].entry.value, b"1");
    assert_eq!(s.kv_get("b").unwrap().modify_index, idx);
    assert!(s.kv_get("old").is_none());
}

/// A failing txn applies nothing, lists every failing op, and uses no index.
#[test]
fn txn_failure_rolls_back_and_lists_every_error() {
    let (mut s, t0) = state();
    let a = create(&mut s, spec("a"), t0);
    put(&mut s, "keep", "x", t0);
    let before = s.index();
    let ops = vec![
        TxnOp {
            value: b"1".to_vec(),
            ..op("set", "new")
        },
        op("delete", "keep"),
        TxnOp {
            session: a.clone(),
            ..op("lock", "lockme")
        },
        TxnOp {
            index: 999,
            ..op("check-index", "keep")
        },
        op("get", "absent"),
        TxnOp {
            session: "ghost".into(),
            ..op("lock", "x")
        },
        op("frobnicate", "x"),
    ];
    let Ok(Outcome::TxnFailed(errors)) = s.apply(Command::Txn(ops), t0) else {
        panic!("txn should fail");
    };
    let whats: Vec<(usize, &str)> = errors
        .iter()
        .map(|e| (e.op_index, e.what.as_str()))
        .collect();
    assert_eq!(
        whats,
        vec![
            (3, "failed to check index, key \"keep\" doesn't exist"),
            (4, "key \"absent\" doesn't exist"),
            (5, "invalid session \"ghost\""),
            (6, "unknown KV verb \"frobnicate\""),
        ]
    );
    assert_eq!(s.index(), before);
    assert!(s.kv_get("new").is_none());
    assert_eq!(s.kv_get("keep").unwrap().value, b"x");
    assert!(s.kv_get("lockme").is_none());
    assert_eq!(s.tombstone("keep"), None);
    // The rolled-back lock must not be remembered as held by the session.
    s.apply(Command::SessionDestroy { id: a }, t0).unwrap();
    assert!(s.kv_get("lockme").is_none());
}

/// The claim pattern of the consumer: check-session on the leader key, check-index on the
/// task, lock the task; a stale index fails with Consul's message.
#[test]
fn txn_check_verbs() {
    let (mut s, t0) = state();
    let a = create(&mut s, spec("a"), t0);
    acquire(&mut s, "leader", &a, t0).unwrap();
    put(&mut s, "task", "t", t0);
    let task_index = s.kv_get("task").unwrap().modify_index;
    let claim = |index| {
        vec![
            TxnOp {
                session: "a".into(),
                ..op("check-session", "leader")
            },
            TxnOp {
                index,
                ..op("check-index", "task")
            },
            TxnOp {
                session: "a".into(),
                value: b"taken".to_vec(),
                ..op("lock", "task")
            },
        ]
    };
    let Ok(Outcome::TxnFailed(errors)) = s.apply(Command::Txn(claim(task_index + 100)), t0) else {
        panic!("stale claim must fail");
    };
    assert_eq!(
        errors[0].what,
        format!(
            "failed index check for key \"task\", current modify index {task_index} != {}",
            task_index + 100
        )
    );
    assert!(matches!(
        s.apply(Command::Txn(claim(task_index)), t0),
        Ok(Outcome::TxnCommitted(_))
    ));
    let Ok(Outcome::TxnFailed(errors)) = s.apply(
        Command::Txn(vec![TxnOp {
            session: "b".into(),
            ..op("check-session", "leader")
        }]),
        t0,
    ) else {
        panic!("wrong session must fail");
    };
    assert_eq!(
        errors[0].what,
        "failed session check for key \"leader\", current session \"a\" != \"b\""
    );
    // The holder re-locking its own key in a txn succeeds and keeps LockIndex.
    let Ok(Outcome::TxnCommitted(results)) = s.apply(
        Command::Txn(vec![TxnOp {
            session: a,
            ..op("lock", "leader")
        }]),
        t0,
    ) else {
        panic!("holder re-lock must succeed");
    };
    assert_eq!(results[0].entry.lock_index, 1);
}

/// Changes name exactly what a write touched, so the store persists only that.
#[test]
fn changes_report_touched_items() {
    let (mut s, t0) = state();
    s.take_changes();
    put(&mut s, "k", "v", t0);
    let changes = s.take_changes();
    assert!(changes.kv.contains("k") && changes.meta);
    put(&mut s, "k", "v", t0);
    assert!(s.take_changes().is_empty());
    let a = create(&mut s, spec("a"), t0);
    assert!(s.take_changes().sessions.contains(&a));
    s.apply(Command::SessionRenew { id: a }, t0).unwrap();
    assert!(s.take_changes().is_empty());
}

/// A restored state keeps data and indexes and restarts TTL timers from `now`.
#[test]
fn restore_restarts_timers() {
    let (mut s, t0) = state();
    let a = create(
        &mut s,
        SessionSpec {
            ttl: "10s".into(),
            ..spec("a")
        },
        t0,
    );
    acquire(&mut s, "k", &a, t0).unwrap();
    let snapshot = Snapshot {
        index: s.index(),
        tables: s.tables(),
        kv: s.kv_list("").map(|(k, e)| (k.clone(), e.clone())).collect(),
        tombstones: Vec::new(),
        sessions: s.sessions().cloned().collect(),
        checks: s.checks().cloned().collect(),
        services: s.services().cloned().collect(),
        node: s.node().cloned(),
    };
    let later = t0 + secs(100);
    let mut r = State::restore(s.config().clone(), snapshot, later);
    assert_eq!(r.index(), s.index());
    assert_eq!(r.next_deadline(), Some(later + secs(20)));
    r.expire(later + secs(20));
    assert!(r.session(&a).is_none());
    assert_eq!(r.kv_get("k").unwrap().session, None);
    assert!(r.index() > s.index());
}

/// A clone taken before a batch (the snapshot readers hold) keeps showing the state as it
/// was, whatever the batch then writes, deletes, expires or rolls back; the batch's changes
/// name what it touched.
#[test]
fn a_snapshot_is_not_changed_by_later_writes() {
    let (mut s, t0) = state();
    put(&mut s, "q/a", "1", t0);
    put(&mut s, "q/b", "1", t0);
    let a = create(
        &mut s,
        SessionSpec {
            ttl: "10s".into(),
            ..spec("a")
        },
        t0,
    );
    acquire(&mut s, "lock", &a, t0).unwrap();
    s.take_changes();
    let snapshot = s.clone();
    let before = snapshot.index();

    put(&mut s, "q/a", "2", t0);
    s.apply(Command::KvDelete { key: "q/b".into() }, t0)
        .unwrap();
    let failed = s
        .apply(
            Command::Txn(vec![
                TxnOp {
                    value: b"x".to_vec(),
                    ..op("set", "q/c")
                },
                op("check-not-exists", "q/a"),
            ]),
            t0,
        )
        .unwrap();
    assert!(matches!(failed, Outcome::TxnFailed(_)));
    s.expire(t0 + secs(20));
    let changes = s.take_changes();

    assert_eq!(snapshot.index(), before);
    assert_eq!(snapshot.kv_get("q/a").unwrap().value, b"1");
    assert!(snapshot.kv_get("q/b").is_some());
    assert!(snapshot.tombstone("q/b").is_none());
    assert!(snapshot.session(&a).is_some());
    assert_eq!(
        snapshot.kv_get("lock").unwrap().session.as_deref(),
        Some(a.as_str())
    );
    assert_eq!(snapshot.kv_list("q/").count(), 2);

    assert_eq!(s.kv_get("q/a").unwrap().value, b"2");
    assert!(s.kv_get("q/b").is_none() && s.kv_get("q/c").is_none());
    assert!(s.session(&a).is_none());
    assert_eq!(s.kv_get("lock").unwrap().session, None);
    let kv: Vec<&str> = changes.kv.iter().map(String::as_str).collect();
    assert_eq!(kv, ["lock", "q/a", "q/b", "q/c"]);
    assert!(changes.tombstones.contains("q/b"));
    assert!(changes.sessions.contains(&a));
}

/// A prefix's index, looked for among the newest tombstones first, agrees with a scan of
/// every entry and tombstone under the prefix: through deletes under several prefixes,
/// transactions rolled back after a delete, delete-trees, reaping, and a restore whose
/// tombstones come in key order rather than index order.
#[test]
fn prefix_indexes_agree_with_a_scan_of_every_tombstone() {
    let (mut s, t0) = state();
    fn scanned(s: &State, prefix: &str) -> u64 {
        if prefix.is_empty() {
            return s.kv_table_index().max(1);
        }
        let entries = s.kv_list(prefix).map(|(_, e)| e.modify_index).max();
        let tombstones = s
            .tombstones
            .iter()
            .filter(|(key, _)| key.starts_with(prefix))
            .map(|(_, index)| *index)
            .max();
        match entries.max(tombstones).unwrap_or(0) {
            0 => s.kv_table_index().max(1),
            index => index,
        }
    }
    let prefixes = ["", "q/", "q/a", "q/b/", "r/", "s/", "t/"];
    let check = |s: &State, step: usize| {
        for prefix in prefixes {
            assert_eq!(
                s.kv_prefix_index(prefix),
                scanned(s, prefix),
                "prefix {prefix:?} at step {step}"
            );
        }
    };
    let keys: Vec<String> = (0..60)
        .map(|n| format!("{}{n}", ["q/a", "q/b/", "r/", "s/", "s/", "s/"][n % 6]))
        .collect();
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move |n: usize| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % n as u64) as usize
    };
    for step in 0..3000 {
        let now = t0 + secs(step as u64);
        let key = keys[next(keys.len())].clone();
        match next(20) {
            0..=8 => put(&mut s, &key, "x", now),
            9..=15 => {
                s.apply(Command::KvDelete { key }, now).unwrap();
            }
            16 | 17 => {
                let ops = vec![
                    op("delete", &key),
                    TxnOp {
                        index: 999_999,
                        ..op("check-index", "absent")
                    },
                ];
                let outcome = s.apply(Command::Txn(ops), now);
                assert!(matches!(outcome, Ok(Outcome::TxnFailed(_))), "{outcome:?}");
            }
            18 => {
                s.apply(
                    Command::KvDeleteTree {
                        prefix: "q/b/".into(),
                    },
                    now,
                )
                .unwrap();
            }
            _ => s.expire(now),
        }
        check(&s, step);
        if step == 1500 {
            let snapshot = Snapshot {
                index: s.index(),
                tables: s.tables(),
                kv: s.kv_list("").map(|(k, e)| (k.clone(), e.clone())).collect(),
                tombstones: s.tombstones.iter().map(|(k, i)| (k.clone(), *i)).collect(),
                sessions: s.sessions().cloned().collect(),
                checks: s.checks().cloned().collect(),
                services: s.services().cloned().collect(),
                node: s.node().cloned(),
            };
            s = State::restore(s.config().clone(), snapshot, now);
            check(&s, step);
        }
    }
}
