//! The queue's writes as the arguments of Redis's scripts ([`WRITE`](super::scripts) and
//! `EDIT`, `scripts.rs`), and their answers in the seam's words. Each op travels as the
//! kind of write the script does (`claim`, `release`, `rewrite`, `create`, `complete`,
//! `move`), told from what the op requires and does ([`TaskOp::requires`],
//! [`TaskOp::effect`]), with its key, its version split into counter and flag, its value
//! and its record's key; the script checks them all before it writes anything.
//!
//! Pure: no I/O, no clock read, no spawn; checked by `tidy.rs`.

use crate::coord::{
    Edit, Edited, Effect, Expected, FencingToken, Holding, TaskOp, TaskVersion, WriteCost, Written,
};

use super::layout::{decode, encode, number, text};

/// The script's kind of write for `op`, the value it writes and where its record goes
/// (`""`: none).
fn kind_of(op: &TaskOp) -> (&'static str, &[u8], &str) {
    match (op.requires().task, op.effect()) {
        (Expected::Absent, Effect::Put { value, .. }) => ("create", value, ""),
        (_, Effect::Put { value, holding }) => match holding {
            Holding::Writer => ("claim", value, ""),
            Holding::Nobody => ("release", value, ""),
            Holding::Unchanged => ("rewrite", value, ""),
        },
        (_, Effect::Delete { record: None }) => ("complete", b"", ""),
        (
            _,
            Effect::Delete {
                record: Some(record),
            },
        ) => ("move", record.value, record.key),
    }
}

/// A version as the scripts compare it: the counter as text and the `gone` flag. A
/// number no read handed out gets a counter no task has, so it conflicts.
fn version_args(version: TaskVersion) -> [Vec<u8>; 2] {
    let (counter, gone) = decode(version.0).unwrap_or((u64::MAX, false));
    [
        counter.to_string().into_bytes(),
        if gone { b"1".to_vec() } else { b"0".to_vec() },
    ]
}

/// The six arguments of each op of [`WRITE`].
pub fn op_args(ops: &[TaskOp]) -> Vec<Vec<u8>> {
    let mut args = Vec::with_capacity(ops.len() * 6);
    for op in ops {
        let (kind, value, to) = kind_of(op);
        let [counter, gone] = version_args(op.version());
        args.extend([
            kind.as_bytes().to_vec(),
            op.key().as_bytes().to_vec(),
            counter,
            gone,
            value.to_vec(),
            to.as_bytes().to_vec(),
        ]);
    }
    args
}

/// The five arguments of each op of [`EDIT`].
pub fn edit_args(ops: &[Edit]) -> Vec<Vec<u8>> {
    let mut args = Vec::with_capacity(ops.len() * 5);
    for op in ops {
        let (kind, version, value): (&str, TaskVersion, &[u8]) = match op {
            Edit::Create { value, .. } => ("create", TaskVersion(0), value),
            Edit::Delete { version, .. } => ("delete", *version, b""),
            Edit::Put { value, .. } => ("put", TaskVersion(0), value),
            Edit::Replace { version, value, .. } => ("replace", *version, value),
        };
        let [counter, gone] = version_args(version);
        args.extend([
            kind.as_bytes().to_vec(),
            op.key().as_bytes().to_vec(),
            counter,
            gone,
            value.to_vec(),
        ]);
    }
    args
}

/// What `op` costs: one operation of the script, and the bytes of its keys and value.
pub fn cost(op: &TaskOp) -> WriteCost {
    let bytes = op.key().len() + op.record_key().map_or(0, str::len) + op.value_len();
    WriteCost { ops: 1, bytes }
}

/// The answer of [`WRITE`](super::scripts): `notleader`, `conflict` and the failing keys, or
/// `done`, the token the guard saw, the counter the write set and the keys whose versions
/// it answers. `Err` says what was out of turn.
pub fn written(reply: &[Vec<u8>]) -> Result<Written, String> {
    let Some((kind, rest)) = reply.split_first() else {
        return Err("a write answered nothing".into());
    };
    match kind.as_slice() {
        b"notleader" => Ok(Written::NotLeader),
        b"conflict" => Ok(Written::Conflict(keys(rest)?)),
        b"done" => {
            let [token, counter, keys @ ..] = rest else {
                return Err("a write answered done without its token".into());
            };
            let version = TaskVersion(encode(number(counter)?, false));
            let token = number(token)?;
            Ok(Written::Done {
                versions: keys
                    .iter()
                    .map(|key| text(key).map(|key| (key, version)))
                    .collect::<Result<_, _>>()?,
                fencing_token: FencingToken(token),
            })
        }
        _ => Err("a write answered out of turn".into()),
    }
}

/// The answer of `EDIT`: `done`, or `conflict` and the failing keys.
pub fn edited(reply: &[Vec<u8>]) -> Result<Edited, String> {
    match reply.split_first() {
        Some((kind, _)) if kind.as_slice() == b"done" => Ok(Edited::Done),
        Some((kind, rest)) if kind.as_slice() == b"conflict" => Ok(Edited::Conflict(keys(rest)?)),
        _ => Err("an edit answered out of turn".into()),
    }
}

fn keys(fields: &[Vec<u8>]) -> Result<Vec<String>, String> {
    fields.iter().map(|key| text(key)).collect::<Result<_, _>>()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each op travels as six arguments with its version split into counter and flag; a
    /// version no read handed out can match no task.
    #[test]
    fn ops_travel_as_six_arguments_each() {
        let ops = [
            TaskOp::Claim {
                key: "q/a".into(),
                version: TaskVersion(encode(7, true)),
                value: b"{}".to_vec(),
            },
            TaskOp::Move {
                key: "q/b".into(),
                version: TaskVersion(1),
                to: "dead/b".into(),
                value: b"x".to_vec(),
            },
        ];
        let args: Vec<String> = op_args(&ops)
            .into_iter()
            .map(|a| String::from_utf8(a).unwrap())
            .collect();
        assert_eq!(
            args,
            [
                "claim",
                "q/a",
                "7",
                "1",
                "{}",
                "",
                "move",
                "q/b",
                &u64::MAX.to_string(),
                "0",
                "x",
                "dead/b"
            ]
        );
        let edits = edit_args(&[Edit::Delete {
            key: "q/c".into(),
            version: TaskVersion(encode(3, false)),
        }]);
        assert_eq!(edits.len(), 5);
        assert_eq!(edits[2], b"3");
    }

    /// The script's answers: not leader, a conflict naming its keys, or done with the token
    /// the guard saw and the written keys' versions; anything else is out of turn.
    #[test]
    fn answers_become_written() {
        let fields =
            |all: &[&str]| -> Vec<Vec<u8>> { all.iter().map(|f| f.as_bytes().to_vec()).collect() };
        assert_eq!(written(&fields(&["notleader"])), Ok(Written::NotLeader));
        assert_eq!(
            written(&fields(&["conflict", "q/a"])),
            Ok(Written::Conflict(vec!["q/a".into()]))
        );
        assert_eq!(
            written(&fields(&["done", "12", "7", "q/a"])),
            Ok(Written::Done {
                versions: vec![("q/a".into(), TaskVersion(encode(7, false)))],
                fencing_token: FencingToken(12),
            })
        );
        assert!(written(&[]).is_err());
        assert!(written(&fields(&["done"])).is_err());
        assert_eq!(edited(&fields(&["done"])), Ok(Edited::Done));
        assert!(edited(&fields(&["what"])).is_err());
    }
}
