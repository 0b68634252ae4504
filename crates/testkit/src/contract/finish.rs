//! The contract's check of a finish: a task's completion and its history record in one
//! write, where a task an operator deleted under the claim may be finished all the same.

use std::time::Duration;

use super::support::*;
use super::Subject;
use leaderq::coord::{Edit, Edited, TaskOp, Written};

/// A finish deletes the claimed task and writes its record in one write; at a version that
/// moved it conflicts and writes nothing; a task an operator deleted under the claim is
/// either finished all the same (the record written) or conflicts with nothing written.
pub async fn finish_deletes_the_task_and_writes_its_record(s: Subject) -> Result<(), String> {
    let a = open(&s, "node-a", Duration::ZERO).await?;
    let _renew = Renewer::start(&s, &a);
    let leader = lead(&s, &a, "node-a").await?;
    let finish = |key: &str, version, name: &str| TaskOp::Finish {
        key: key.to_string(),
        version,
        to: format!("{}{name}", s.dead_prefix),
        value: format!("{{\"record\":\"{name}\"}}").into_bytes(),
    };
    let mut claimed = Vec::new();
    for name in ["t1", "t2"] {
        let key = put(&s, name, b"{\"n\":1}").await?;
        let pending = get_one(&s, &key).await?;
        let written = s
            .coord
            .write(&leader, &[claim(&key, pending.version, b"{\"n\":2}")])
            .await
            .ctx("claim")?;
        ensure(matches!(written, Written::Done { .. }), || {
            format!("a claim of {key} answered {written:?}")
        })?;
        claimed.push((
            key.clone(),
            pending.version,
            get_one(&s, &key).await?.version,
        ));
    }
    let (k1, before, held) = claimed[0].clone();
    let record = format!("{}r1", s.dead_prefix);
    let written = s
        .coord
        .write(&leader, &[finish(&k1, before, "r1")])
        .await
        .ctx("write")?;
    ensure(written == Written::Conflict(vec![k1.clone()]), || {
        format!("a finish at the version before the claim answered {written:?}")
    })?;
    ensure(
        get(&s, std::slice::from_ref(&record)).await?.is_empty(),
        || "a finish that conflicted wrote its record".into(),
    )?;
    let written = s
        .coord
        .write(&leader, &[finish(&k1, held, "r1")])
        .await
        .ctx("write")?;
    ensure(matches!(written, Written::Done { .. }), || {
        format!("a finish at the claim's version answered {written:?}")
    })?;
    let left = get(&s, &[k1.clone(), record.clone()]).await?;
    ensure(
        left.len() == 1 && left[0].key == record && left[0].value == b"{\"record\":\"r1\"}",
        || format!("after a finish the task and its record are {left:?}"),
    )?;
    // An operator deletes the second task under its claim.
    let (k2, _, held) = claimed[1].clone();
    let deleted = s
        .coord
        .edit(&[Edit::Delete {
            key: k2.clone(),
            version: held,
        }])
        .await
        .ctx("edit")?;
    ensure(deleted == Edited::Done, || {
        format!("the operator's delete answered {deleted:?}")
    })?;
    let record = format!("{}r2", s.dead_prefix);
    let written = s
        .coord
        .write(&leader, &[finish(&k2, held, "r2")])
        .await
        .ctx("write")?;
    let left = get(&s, &[k2.clone(), record.clone()]).await?;
    match written {
        Written::Done { .. } => ensure(left.len() == 1 && left[0].key == record, || {
            format!("a finish of a deleted task answered Done and left {left:?}")
        }),
        Written::Conflict(keys) if keys == vec![k2.clone()] => ensure(left.is_empty(), || {
            format!("a finish of a deleted task conflicted and left {left:?}")
        }),
        other => Err(format!("a finish of a deleted task answered {other:?}")),
    }
}
