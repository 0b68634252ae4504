//! The dead letters as an operator handles them: `leaderq tasks retry` (one dead letter, or
//! all of a type, back to the queue under its original key), `leaderq tasks purge-dead`
//! (with its confirmation on a terminal), and the progress both show on a terminal. Listing
//! and showing dead letters is `tasks.rs`'s, beside the queued tasks; the history of
//! finished tasks is `history.rs`'s.

use std::io::{BufRead as _, IsTerminal as _};

use chrono::Utc;
use serde::Serialize;
use serde_json::Value;

use super::{list_now, Line, OperateError};
use crate::config::QueueSettings;
use crate::coord::{Coordinator, Edit, Edited, StoredTask};
use crate::task::key::Key;
use crate::util::escape::escape;

/// Moves a dead letter back to the queue under its original key, with its attempts reset.
/// The original key must be a valid key under the queue prefix: a record is data, and a
/// crafted one must not make this write anywhere else. Returns the queue key.
pub async fn retry(
    coord: &dyn Coordinator,
    queue: &QueueSettings,
    key: &str,
) -> Result<String, OperateError> {
    let pair = super::tasks::find(coord, queue, key).await?;
    if !pair.key.starts_with(&queue.dead_prefix) {
        return Err(OperateError::NotDead { key: pair.key });
    }
    let Ok(Value::Object(mut fields)) = serde_json::from_slice::<Value>(&pair.value) else {
        return Err(OperateError::NotRetryable { key: pair.key });
    };
    if fields.contains_key("rawValue") || !fields.contains_key("taskType") {
        return Err(OperateError::NotRetryable { key: pair.key });
    }
    let prefix = queue.prefix.as_str();
    let refuse = |original: &str, reason: String| OperateError::BadOriginalKey {
        key: pair.key.clone(),
        original: original.to_string(),
        reason,
    };
    let target = match fields.get("originalKey") {
        Some(Value::String(original)) => Key::within(original, &[prefix])
            .map_err(|reason| refuse(original, reason.to_string()))?,
        Some(other) => {
            return Err(refuse(&other.to_string(), "it is not a string".into()));
        }
        None => {
            let name = &pair.key[queue.dead_prefix.len()..];
            Key::under(prefix, name).map_err(|reason| OperateError::InvalidKey {
                key: name.to_string(),
                prefixes: prefix.to_string(),
                reason,
            })?
        }
    };
    let target = String::from(target);
    for field in [
        "deadReason",
        "deadAt",
        "deadNode",
        "deadFencingToken",
        "originalKey",
        "attempts",
        "lastError",
        "notBefore",
        "takenBy",
        "takenAt",
        // An earlier run's progress; its checkpoint stays for the next run to start from.
        "progress",
        "progressMessage",
    ] {
        fields.shift_remove(field);
    }
    fields.insert("taskTaken".into(), Value::Bool(false));
    let value = serde_json::to_vec(&Value::Object(fields)).expect("task serializes");
    let ops = [
        Edit::Delete {
            key: pair.key.clone(),
            version: pair.version,
        },
        // Create only: a new task under the same key is never overwritten.
        Edit::Create {
            key: target.clone(),
            value,
        },
    ];
    match coord.edit(&ops).await? {
        Edited::Done => Ok(target),
        Edited::Conflict(keys) => Err(OperateError::Conflict {
            reason: keys
                .iter()
                .map(|key| {
                    if *key == target {
                        format!("{key} exists (a new task took the key)")
                    } else {
                        format!("{key} changed or went meanwhile")
                    }
                })
                .collect::<Vec<_>>()
                .join("; "),
            key: target,
        }),
    }
}

/// What [`retry_all`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RetriedAll {
    /// The queue keys the dead letters went back to.
    pub retried: Vec<String>,
    /// Dead letters left where they were, with why.
    pub failed: Vec<(String, String)>,
}

/// `tasks retry --all [--type T]`: every dead letter (of `task_type`) back to the queue,
/// one edit each, as `tasks retry` does; `progress(done, total)` after each. Dead letters
/// that are not tasks (malformed values) are skipped.
pub async fn retry_all(
    coord: &dyn Coordinator,
    queue: &QueueSettings,
    task_type: Option<&str>,
    progress: &mut (dyn FnMut(usize, usize) + Send),
) -> Result<RetriedAll, OperateError> {
    let dead = list_now(coord, &queue.dead_prefix).await?;
    let chosen: Vec<&StoredTask> = dead
        .iter()
        .filter(|stored| {
            let value: Value = serde_json::from_slice(&stored.value).unwrap_or_default();
            let Some(this_type) = value.get("taskType").and_then(|t| t.as_str()) else {
                return false;
            };
            value.get("rawValue").is_none() && task_type.is_none_or(|wanted| wanted == this_type)
        })
        .collect();
    let mut report = RetriedAll::default();
    for (n, stored) in chosen.iter().enumerate() {
        match retry(coord, queue, &stored.key).await {
            Ok(target) => report.retried.push(target),
            Err(OperateError::Coordinator(err)) => return Err(err.into()),
            Err(err) => report.failed.push((stored.key.clone(), err.to_string())),
        }
        progress(n + 1, chosen.len());
    }
    Ok(report)
}

/// What `leaderq tasks retry --all` says: each dead letter left behind with why, then how
/// many went back.
pub fn render_retried_all(report: &RetriedAll) -> Vec<Line> {
    let mut lines: Vec<Line> = report
        .failed
        .iter()
        .map(|(key, why)| Line::Err(format!("not retried: {}: {}", escape(key), escape(why))))
        .collect();
    lines.push(Line::Out(format!(
        "requeued {} dead letter(s){}",
        report.retried.len(),
        if report.failed.is_empty() {
            String::new()
        } else {
            format!(", {} left (see above)", report.failed.len())
        }
    )));
    lines
}

/// Deletes dead letters, all of them or those dead for longer than `older_than`. Returns
/// how many were deleted.
pub async fn purge_dead(
    coord: &dyn Coordinator,
    queue: &QueueSettings,
    older_than: Option<std::time::Duration>,
) -> Result<usize, OperateError> {
    purge_dead_with_progress(coord, queue, older_than, &mut |_, _| {}).await
}

/// [`purge_dead`], calling `progress(looked at, total)` after each dead letter.
pub async fn purge_dead_with_progress(
    coord: &dyn Coordinator,
    queue: &QueueSettings,
    older_than: Option<std::time::Duration>,
    progress: &mut (dyn FnMut(usize, usize) + Send),
) -> Result<usize, OperateError> {
    let now = Utc::now();
    let dead = list_now(coord, &queue.dead_prefix).await?;
    let total = dead.len();
    let mut purged = 0;
    for (n, pair) in dead.into_iter().enumerate() {
        progress(n, total);
        // A listing is by byte prefix, so this always holds; checked so that not even a
        // misbehaving server can make purge delete anything else.
        if !pair.key.starts_with(&queue.dead_prefix) {
            continue;
        }
        if let Some(limit) = older_than {
            let dead_at = serde_json::from_slice::<Value>(&pair.value)
                .ok()
                .and_then(|v| v.get("deadAt")?.as_str().map(str::to_string))
                .and_then(|t| chrono::DateTime::parse_from_rfc3339(&t).ok());
            let old_enough = dead_at.is_some_and(|t| {
                (now - t.with_timezone(&Utc)).to_std().unwrap_or_default() > limit
            });
            if !old_enough {
                continue;
            }
        }
        let ops = [Edit::Delete {
            key: pair.key.clone(),
            version: pair.version,
        }];
        if coord.edit(&ops).await? == Edited::Done {
            purged += 1;
            // Its runs' kept output goes with it; the purge stands whatever this answers.
            if let Err(err) = super::output::forget(coord, queue, &pair, now).await {
                tracing::warn!(dead_key = %pair.key, error = %err, "cannot delete the dead letter's kept output");
            }
        }
    }
    progress(total, total);
    Ok(purged)
}

/// Asks the terminal to confirm a purge of the dead letters (how many, under which
/// prefix); refuses when stdin is not a terminal to ask on, or the answer is not yes.
pub async fn confirm_purge(
    coord: &dyn Coordinator,
    queue: &QueueSettings,
    older_than: Option<std::time::Duration>,
) -> Result<(), OperateError> {
    if !std::io::stdin().is_terminal() {
        return Err(OperateError::Unconfirmed(
            "tasks purge-dead deletes dead letters for good: pass --yes to confirm (stdin is not a terminal to ask on)".into(),
        ));
    }
    let (dead, _) =
        coord
            .keys(&queue.dead_prefix)
            .await
            .map_err(|source| OperateError::ReadDead {
                from: coord.describe(),
                source,
            })?;
    let which = match older_than {
        Some(age) => format!(
            "the dead letters older than {} (of {})",
            crate::util::duration::format(age),
            dead.len()
        ),
        None => format!("all {} dead letters", dead.len()),
    };
    eprint!(
        "delete {which} under {}? [y/N] ",
        escape(&queue.dead_prefix)
    );
    let mut answer = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut answer)
        .map_err(OperateError::Ask)?;
    if !matches!(answer.trim(), "y" | "Y" | "yes") {
        return Err(OperateError::NothingDeleted);
    }
    Ok(())
}

/// `done/total` on stderr while it is a terminal, rewritten in place; nothing in a pipe.
pub struct Progress {
    what: &'static str,
    shown: bool,
    terminal: bool,
}

impl Progress {
    /// Progress of `what` ("retrying", "purging").
    pub fn new(what: &'static str) -> Progress {
        Progress {
            what,
            shown: false,
            terminal: std::io::stderr().is_terminal(),
        }
    }

    pub fn show(&mut self, done: usize, total: usize) {
        if self.terminal {
            eprint!("\r{} {done}/{total}", self.what);
            self.shown = true;
        }
    }

    /// Ends the progress line, if one was shown.
    pub fn finish(&mut self) {
        if self.shown {
            eprintln!();
            self.shown = false;
        }
    }
}
