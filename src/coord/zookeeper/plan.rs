//! A batch of queue writes as one ZooKeeper `multi`, decided from what a read just before
//! it saw of each task and from what each op requires and does ([`TaskOp::requires`],
//! [`TaskOp::effect`]), and the `multi`'s answer in the seam's words ([`committed`],
//! [`failed`]). Pure: the tasks seen in, the znode operations (or the answer without
//! sending any) out.
//!
//! Every operation is conditioned on the task's data version (`Stat.version`) as read, and
//! on its claim marker as read: a marker that went meanwhile fails its delete, and a marker
//! that came meanwhile came with a claim's data write, which fails the version check. So the
//! `multi` applies only to the very state the read saw, whose domain version the caller
//! compared with the one each op is conditioned on.
//!
//! Pure: no I/O, no clock read, no spawn; checked by `tidy.rs`.

use std::collections::HashMap;

use zookeeper_client as zk;

use crate::coord::{
    Effect, Expected, FencingToken, Holding, TaskOp, TaskVersion, WriteCost, Written,
};

use super::layout;

/// A task as the read before a write saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seen {
    /// ZooKeeper's `Stat.version` of the task znode (data writes only).
    pub data_version: i32,
    /// The domain version ([`layout::task_version`]).
    pub version: TaskVersion,
    /// The claim marker, if there is one.
    pub claim: Option<Claim>,
}

/// A claim marker as read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Claim {
    /// The session that created it (its `ephemeralOwner`).
    pub owner: i64,
    pub data_version: i32,
}

/// One operation of a `multi`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ZkOp {
    Check {
        path: String,
        version: i32,
    },
    Create {
        path: String,
        data: Vec<u8>,
        ephemeral: bool,
    },
    SetData {
        path: String,
        data: Vec<u8>,
        version: Option<i32>,
    },
    Delete {
        path: String,
        version: i32,
    },
}

impl ZkOp {
    fn path(&self) -> &str {
        match self {
            ZkOp::Check { path, .. }
            | ZkOp::Create { path, .. }
            | ZkOp::SetData { path, .. }
            | ZkOp::Delete { path, .. } => path,
        }
    }

    fn data_len(&self) -> usize {
        match self {
            ZkOp::Create { data, .. } | ZkOp::SetData { data, .. } => data.len(),
            ZkOp::Check { .. } | ZkOp::Delete { .. } => 0,
        }
    }

    /// What it takes in the request, a little over: a header, the path (with the chroot's
    /// `root_len` in front), the data, a version and, for a create, the open ACL and flags.
    pub fn encoded_len(&self, root_len: usize) -> usize {
        OP_OVERHEAD + root_len + self.path().len() + self.data_len()
    }
}

/// Per operation, beyond its path and data: the multi header (9 bytes), the path's and
/// data's length prefixes (8), a version (4), a create's world:anyone ACL and flags (31),
/// rounded up.
const OP_OVERHEAD: usize = 64;

/// Why a batch was not sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Unsent {
    /// These tasks moved since their op's version, went, or are claimed by another lease.
    Conflict(Vec<String>),
    /// A write without leadership touches a task this lease does not hold (or claims one).
    NotOwn,
}

/// A planned `multi`: its operations and, for each, the task key a failure of it names
/// (`None` for the leadership guard).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Planned {
    pub ops: Vec<ZkOp>,
    pub keys: Vec<Option<String>>,
}

impl Planned {
    fn push(&mut self, op: ZkOp, key: Option<&str>) {
        self.ops.push(op);
        self.keys.push(key.map(str::to_string));
    }
}

/// Who writes: the leader (guarded by its leadership, any task) or a lease without
/// leadership (only tasks its session holds).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Writer {
    Leader { session: i64 },
    Own { session: i64 },
}

/// The `multi` for `ops` after `guard` (the leadership checks, empty for [`Writer::Own`]),
/// given what was `seen` of every task and every dead-letter key they name (absent: no
/// such znode).
pub fn plan(
    guard: Vec<ZkOp>,
    ops: &[TaskOp],
    seen: &HashMap<String, Seen>,
    writer: Writer,
) -> Result<Planned, Unsent> {
    let mut planned = Planned::default();
    for op in guard {
        planned.push(op, None);
    }
    let session = match writer {
        Writer::Leader { session } | Writer::Own { session } => session,
    };
    let mut conflicts = Vec::new();
    for op in ops {
        let key = op.key();
        let effect = op.effect();
        if op.requires().task == Expected::Absent {
            // Only a leadership creates, and only a key that does not exist.
            if seen.contains_key(key) || matches!(writer, Writer::Own { .. }) {
                conflicts.push(key.to_string());
                continue;
            }
            if let Effect::Put { value, .. } = effect {
                let create = ZkOp::Create {
                    path: layout::path_of(key),
                    data: value.to_vec(),
                    ephemeral: false,
                };
                planned.push(create, Some(key));
            }
            continue;
        }
        let Some(task) = seen.get(key).filter(|task| task.version == op.version()) else {
            conflicts.push(key.to_string());
            continue;
        };
        let own = task.claim.is_some_and(|claim| claim.owner == session);
        if let Writer::Own { .. } = writer {
            if !own || op.needs_leadership() {
                return Err(Unsent::NotOwn);
            }
        }
        let path = layout::path_of(key);
        let claim_path = layout::claim_path(key);
        let drop_claim = |planned: &mut Planned| {
            if let Some(claim) = task.claim {
                planned.push(
                    ZkOp::Delete {
                        path: claim_path.clone(),
                        version: claim.data_version,
                    },
                    Some(key),
                );
            }
        };
        match effect {
            Effect::Put { value, holding } => {
                if holding == Holding::Writer && task.claim.is_some() && !own {
                    conflicts.push(key.to_string());
                    continue;
                }
                planned.push(set(&path, value, task.data_version), Some(key));
                match holding {
                    // A claim's marker: ephemeral, so it ends with the session.
                    Holding::Writer if task.claim.is_none() => planned.push(
                        ZkOp::Create {
                            path: claim_path.clone(),
                            data: Vec::new(),
                            ephemeral: true,
                        },
                        Some(key),
                    ),
                    Holding::Writer | Holding::Unchanged => {}
                    Holding::Nobody => drop_claim(&mut planned),
                }
            }
            Effect::Delete { record } => {
                drop_claim(&mut planned);
                planned.push(delete(&path, task.data_version), Some(key));
                if let Some(record) = record {
                    let to_path = layout::path_of(record.key);
                    let data = record.value.to_vec();
                    let write = if seen.contains_key(record.key) {
                        ZkOp::SetData {
                            path: to_path,
                            data,
                            version: None,
                        }
                    } else {
                        ZkOp::Create {
                            path: to_path,
                            data,
                            ephemeral: false,
                        }
                    };
                    planned.push(write, Some(key));
                }
            }
        }
    }
    if conflicts.is_empty() {
        Ok(planned)
    } else {
        Err(Unsent::Conflict(conflicts))
    }
}

fn set(path: &str, value: &[u8], version: i32) -> ZkOp {
    ZkOp::SetData {
        path: path.to_string(),
        data: value.to_vec(),
        version: Some(version),
    }
}

fn delete(path: &str, version: i32) -> ZkOp {
    ZkOp::Delete {
        path: path.to_string(),
        version,
    }
}

/// The answer to a committed `multi` planned as `planned`: each task's new stat, from its
/// own data write (a dead letter's or history record's write is unconditioned, so left
/// out), and `Done` with each written task's new version under `token`.
pub fn committed(
    planned: &Planned,
    stats: Vec<Option<zk::Stat>>,
    token: FencingToken,
) -> (HashMap<&String, zk::Stat>, Written) {
    let written: HashMap<&String, zk::Stat> = planned
        .ops
        .iter()
        .zip(&planned.keys)
        .zip(stats)
        .filter_map(|((op, key), stat)| match (op, key, stat) {
            (
                ZkOp::SetData {
                    version: Some(_), ..
                },
                Some(key),
                Some(stat),
            ) => Some((key, stat)),
            _ => None,
        })
        .collect();
    let versions = written
        .iter()
        .map(|(key, stat)| ((*key).clone(), layout::task_version(stat.mzxid, stat.pzxid)))
        .collect();
    let done = Written::Done {
        versions,
        fencing_token: token,
    };
    (written, done)
}

/// The answer to a `multi` planned as `planned` whose op `index` failed: a conflict on the
/// task that op was planned for, or `NotLeader` for a guard check.
pub fn failed(planned: &Planned, index: usize) -> Written {
    match planned.keys.get(index) {
        Some(Some(key)) => Written::Conflict(vec![key.clone()]),
        _ => Written::NotLeader,
    }
}

/// What `op` costs at most: its operations with a claim marker present (one more delete)
/// and a dead letter created, as [`plan`] would send them.
pub fn cost(op: &TaskOp, root_len: usize) -> WriteCost {
    let worst = Seen {
        data_version: 0,
        version: op.version(),
        claim: Some(Claim {
            owner: 0,
            data_version: 0,
        }),
    };
    let unclaimed = Seen {
        claim: None,
        ..worst.clone()
    };
    // A claim creates its marker (no claim yet); every other op deletes one.
    let claims = matches!(
        op.effect(),
        Effect::Put {
            holding: Holding::Writer,
            ..
        }
    );
    let task = if claims { unclaimed } else { worst };
    // A create is planned only for a key that does not exist.
    let seen = if op.requires().task == Expected::Absent {
        HashMap::new()
    } else {
        HashMap::from([(op.key().to_string(), task)])
    };
    let writer = Writer::Leader { session: 1 };
    match plan(Vec::new(), std::slice::from_ref(op), &seen, writer) {
        Ok(planned) => WriteCost {
            ops: planned.ops.len(),
            bytes: planned.ops.iter().map(|op| op.encoded_len(root_len)).sum(),
        },
        Err(_) => WriteCost::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ME: i64 = 7;
    const OTHER: i64 = 9;

    fn seen(version: u64, claim: Option<i64>) -> Seen {
        Seen {
            data_version: 3,
            version: TaskVersion(version),
            claim: claim.map(|owner| Claim {
                owner,
                data_version: 0,
            }),
        }
    }

    fn claim_op(key: &str, version: u64) -> TaskOp {
        TaskOp::Claim {
            key: key.into(),
            version: TaskVersion(version),
            value: b"taken".to_vec(),
        }
    }

    /// A claim writes the value at the data version read and creates the ephemeral marker.
    #[test]
    fn a_claim_writes_and_marks() {
        let seen = HashMap::from([("q/a".to_string(), seen(10, None))]);
        let planned = plan(
            Vec::new(),
            &[claim_op("q/a", 10)],
            &seen,
            Writer::Leader { session: ME },
        )
        .unwrap();
        assert_eq!(
            planned.ops,
            [
                ZkOp::SetData {
                    path: "/q/a".into(),
                    data: b"taken".to_vec(),
                    version: Some(3)
                },
                ZkOp::Create {
                    path: "/q/a/leaderq-claim".into(),
                    data: Vec::new(),
                    ephemeral: true
                },
            ]
        );
        assert_eq!(planned.keys, [Some("q/a".into()), Some("q/a".into())]);
    }

    /// Stale versions, gone tasks and tasks another lease holds conflict, all named, and
    /// nothing is planned.
    #[test]
    fn conflicts_name_every_key_that_moved() {
        let seen = HashMap::from([
            ("q/a".to_string(), seen(10, None)),
            ("q/b".to_string(), seen(11, None)),
            ("q/c".to_string(), seen(12, Some(OTHER))),
        ]);
        let ops = [
            claim_op("q/a", 10),
            claim_op("q/b", 5),
            claim_op("q/c", 12),
            TaskOp::Complete {
                key: "q/gone".into(),
                version: TaskVersion(1),
            },
        ];
        assert_eq!(
            plan(Vec::new(), &ops, &seen, Writer::Leader { session: ME }),
            Err(Unsent::Conflict(vec![
                "q/b".into(),
                "q/c".into(),
                "q/gone".into()
            ]))
        );
    }

    /// A move deletes the marker and the task and creates the dead letter, or overwrites
    /// one that is there.
    #[test]
    fn a_move_deletes_and_writes_the_dead_letter() {
        let mut seen_tasks = HashMap::from([("q/a".to_string(), seen(10, Some(ME)))]);
        let op = TaskOp::Move {
            key: "q/a".into(),
            version: TaskVersion(10),
            to: "dead/a".into(),
            value: b"d".to_vec(),
        };
        let planned = plan(
            Vec::new(),
            std::slice::from_ref(&op),
            &seen_tasks,
            Writer::Leader { session: ME },
        )
        .unwrap();
        assert_eq!(
            planned.ops,
            [
                ZkOp::Delete {
                    path: "/q/a/leaderq-claim".into(),
                    version: 0
                },
                ZkOp::Delete {
                    path: "/q/a".into(),
                    version: 3
                },
                ZkOp::Create {
                    path: "/dead/a".into(),
                    data: b"d".to_vec(),
                    ephemeral: false
                },
            ]
        );
        seen_tasks.insert("dead/a".into(), seen(2, None));
        let planned = plan(
            Vec::new(),
            &[op],
            &seen_tasks,
            Writer::Leader { session: ME },
        )
        .unwrap();
        assert!(matches!(
            planned.ops[2],
            ZkOp::SetData { version: None, .. }
        ));
    }

    /// Without leadership a lease writes only tasks its own session holds, and never claims.
    #[test]
    fn own_writes_need_own_claims() {
        let seen = HashMap::from([
            ("q/mine".to_string(), seen(10, Some(ME))),
            ("q/theirs".to_string(), seen(11, Some(OTHER))),
            ("q/free".to_string(), seen(12, None)),
        ]);
        let release = |key: &str, version| TaskOp::Release {
            key: key.into(),
            version,
            value: b"back".to_vec(),
        };
        let own = Writer::Own { session: ME };
        let planned = plan(
            Vec::new(),
            &[release("q/mine", TaskVersion(10))],
            &seen,
            own,
        )
        .unwrap();
        assert_eq!(planned.ops.len(), 2);
        for ops in [
            vec![
                release("q/mine", TaskVersion(10)),
                release("q/theirs", TaskVersion(11)),
            ],
            vec![release("q/free", TaskVersion(12))],
            vec![claim_op("q/free", 12)],
        ] {
            assert_eq!(plan(Vec::new(), &ops, &seen, own), Err(Unsent::NotOwn));
        }
    }

    /// The cost counts the operations plan sends in the worst case and their bytes.
    #[test]
    fn costs_count_the_worst_case() {
        let claim = cost(&claim_op("q/a", 1), 0);
        assert_eq!(claim.ops, 2);
        assert!(claim.bytes >= b"taken".len() + 2 * "/q/a".len());
        let moved = cost(
            &TaskOp::Move {
                key: "q/a".into(),
                version: TaskVersion(1),
                to: "d/a".into(),
                value: vec![0; 100],
            },
            5,
        );
        assert_eq!(moved.ops, 3);
        assert!(moved.bytes >= 100 + 3 * 5);
    }

    /// A failed guard check is NotLeader, a task's failed op a conflict on that task; a
    /// commit answers the new version of each task whose own data it wrote, not a record's.
    #[test]
    fn answers_name_the_task_or_the_leadership() {
        let seen = HashMap::from([("q/a".to_string(), seen(10, None))]);
        let guard = vec![ZkOp::Check {
            path: "/L/latch".into(),
            version: 0,
        }];
        let writer = Writer::Leader { session: ME };
        let planned = plan(guard, &[claim_op("q/a", 10)], &seen, writer).unwrap();
        assert_eq!(failed(&planned, 0), Written::NotLeader);
        assert_eq!(failed(&planned, 2), Written::Conflict(vec!["q/a".into()]));
        assert_eq!(failed(&planned, 9), Written::NotLeader);
        let stat = zk::Stat {
            czxid: 1,
            mzxid: 40,
            pzxid: 41,
            ctime: 0,
            mtime: 0,
            version: 4,
            cversion: 0,
            aversion: 0,
            ephemeral_owner: 0,
            data_length: 5,
            num_children: 1,
        };
        let (written, answer) = committed(
            &planned,
            vec![None, Some(stat), Some(stat)],
            FencingToken(3),
        );
        assert_eq!(written.len(), 1);
        assert_eq!(
            answer,
            Written::Done {
                versions: vec![("q/a".into(), layout::task_version(40, 41))],
                fencing_token: FencingToken(3),
            }
        );
    }
}
