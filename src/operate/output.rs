//! A task's kept output (`[queue] output_limit`): the records the leader wrote for its runs
//! under `leaderq/output/<queue>/<task name>/<attempt>` (`queue/output.rs`), found by the
//! task's key, name, id, or the dead letter it became, whether or not the task is still in
//! the queue; what `leaderq tasks show KEY --output` prints of them; and their deletion
//! with a dead letter or a task an operator deletes ([`forget`]).

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::OperateError;
use crate::config::QueueSettings;
use crate::coord::{Coordinator, Edit, Edited, StoredTask};
use crate::queue::{attempt_of, output_prefix};
use crate::task::key::{self, Key};
use crate::task::output::OutputRecord;
use crate::util::escape::escape;

/// Records deleted per edit: Consul's 64 operations per transaction.
const FORGET_BATCH: usize = 64;

/// The kept output of one task.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct TaskOutput {
    /// The task's key in the queue.
    pub key: String,
    /// Where its records are (`<prefix><attempt>`).
    pub prefix: String,
    /// Oldest attempt first.
    pub attempts: Vec<OutputRecord>,
}

/// The kept output of the task `key` names: a key under the queue prefix, one under the
/// dead-letter prefix (read for its `originalKey`), a name, or the id `leaderq enqueue
/// --id` was given. A name that breaks the key rule is refused before anything is read;
/// no record at all is an empty list.
pub async fn read(
    coord: &dyn Coordinator,
    queue: &QueueSettings,
    key: &str,
) -> Result<TaskOutput, OperateError> {
    let mut first = None;
    for name in names(coord, queue, key).await? {
        let found = read_name(coord, queue, &name).await?;
        if !found.attempts.is_empty() {
            return Ok(found);
        }
        first.get_or_insert(found);
    }
    Ok(first.unwrap_or_default())
}

/// The task names `key` may stand for, in the order they are tried.
async fn names(
    coord: &dyn Coordinator,
    queue: &QueueSettings,
    key: &str,
) -> Result<Vec<String>, OperateError> {
    let strip = |full: &str, prefix: &str| full.strip_prefix(prefix).map(str::to_string);
    if let Ok(full) = Key::within(key, &[queue.prefix.as_str()]) {
        return Ok(strip(full.as_str(), &queue.prefix).into_iter().collect());
    }
    if Key::within(key, &[queue.dead_prefix.as_str()]).is_ok() {
        let letter = super::tasks::find(coord, queue, key).await?;
        let original = serde_json::from_slice::<serde_json::Value>(&letter.value)
            .ok()
            .and_then(|value| value.get("originalKey")?.as_str().map(str::to_string))
            .unwrap_or_default();
        let valid = Key::within(&original, &[queue.prefix.as_str()]).is_ok();
        return Ok(valid
            .then(|| strip(&original, &queue.prefix))
            .flatten()
            .into_iter()
            .collect());
    }
    Key::under(&queue.prefix, key).map_err(|reason| OperateError::InvalidKey {
        key: key.to_string(),
        prefixes: queue.prefix.clone(),
        reason,
    })?;
    let mut names = vec![key.to_string()];
    if key::check_id(key).is_ok() && !key.starts_with("task_") {
        names.push(format!("task_{key}"));
    }
    Ok(names)
}

/// The records of the task `name`, oldest attempt first.
async fn read_name(
    coord: &dyn Coordinator,
    queue: &QueueSettings,
    name: &str,
) -> Result<TaskOutput, OperateError> {
    let prefix = output_prefix(&queue.prefix, name);
    let wanted = attempt_keys(coord, &prefix).await?;
    let mut attempts: Vec<OutputRecord> = match wanted.is_empty() {
        true => Vec::new(),
        false => coord
            .get(&wanted)
            .await?
            .iter()
            .filter_map(|stored| OutputRecord::decode(&stored.value))
            .collect(),
    };
    attempts.sort_by_key(|record| record.attempt);
    Ok(TaskOutput {
        key: format!("{}{name}", queue.prefix),
        prefix,
        attempts,
    })
}

/// Deletes the kept output of the task or dead letter `stored`, which an operator just
/// deleted (`tasks delete`, `tasks purge-dead`): the records of its runs that finished by
/// the time it died (a dead letter's `deadAt`) or by `now` (a task), at the versions read,
/// so that a task enqueued under its key since keeps its own. Answers how many went; the
/// caller's deletion stands whatever this answers.
pub async fn forget(
    coord: &dyn Coordinator,
    queue: &QueueSettings,
    stored: &StoredTask,
    now: DateTime<Utc>,
) -> Result<usize, OperateError> {
    let value = serde_json::from_slice::<serde_json::Value>(&stored.value).unwrap_or_default();
    let text = |name: &str| value.get(name).and_then(|v| v.as_str()).map(str::to_string);
    let (task_key, by) = match stored.key.starts_with(&queue.dead_prefix) {
        true => {
            let dead_at = text("deadAt").and_then(|at| DateTime::parse_from_rfc3339(&at).ok());
            let by = dead_at.map_or(now, |at| at.with_timezone(&Utc));
            (text("originalKey").unwrap_or_default(), by)
        }
        false => (stored.key.clone(), now),
    };
    let Ok(key) = Key::within(&task_key, &[queue.prefix.as_str()]) else {
        return Ok(0);
    };
    let Some(name) = key.as_str().strip_prefix(&queue.prefix) else {
        return Ok(0);
    };
    let prefix = output_prefix(&queue.prefix, name);
    let wanted = attempt_keys(coord, &prefix).await?;
    let mut forgotten = 0;
    for chunk in wanted.chunks(FORGET_BATCH) {
        let ops: Vec<Edit> = coord
            .get(chunk)
            .await?
            .into_iter()
            .filter(|found| {
                OutputRecord::decode(&found.value)
                    .and_then(|record| DateTime::parse_from_rfc3339(&record.finished_at).ok())
                    .is_some_and(|at| at.with_timezone(&Utc) <= by)
            })
            .map(|found| Edit::Delete {
                key: found.key,
                version: found.version,
            })
            .collect();
        if !ops.is_empty() && coord.edit(&ops).await? == Edited::Done {
            forgotten += ops.len();
        }
    }
    crate::queue::forget_prefixes(coord, &[prefix]).await;
    Ok(forgotten)
}

/// What `leaderq tasks show KEY --output` prints after the task: each attempt's header,
/// then its stdout and stderr, line by line, each line escaped for the terminal.
pub fn render(output: &TaskOutput) -> String {
    if output.attempts.is_empty() {
        return format!(
            "no output kept for {} (a run that prints nothing keeps none; queue.output_limit = 0 keeps none)",
            escape(&output.key)
        );
    }
    let mut text = format!(
        "output of {} (under {}):",
        escape(&output.key),
        escape(&output.prefix)
    );
    for record in &output.attempts {
        let token = record
            .fencing_token
            .map_or(String::new(), |t| format!(", fencing token {t}"));
        text.push_str(&format!(
            "\n\nattempt {}: {}, {} to {}, node {}{token}",
            record.attempt,
            escape(&record.outcome),
            escape(&record.started_at),
            escape(&record.finished_at),
            escape(&record.node),
        ));
        if let Some(note) = &record.note {
            text.push_str(&format!("\n({})", escape(note)));
        }
        for (name, stream, dropped) in [
            ("stdout", &record.stdout, record.stdout_dropped),
            ("stderr", &record.stderr, record.stderr_dropped),
        ] {
            text.push_str(&stream_text(name, stream, dropped));
        }
    }
    text
}

/// One stream under its header.
fn stream_text(name: &str, stream: &str, dropped: u64) -> String {
    let mut text = match dropped {
        0 => format!("\n--- {name} ---"),
        _ => format!("\n--- {name} ({dropped} bytes before this were not kept) ---"),
    };
    if stream.is_empty() {
        text.push_str("\n(nothing)");
    }
    // Tabs stay tabs (tables line up); anything else a terminal acts on is escaped.
    for line in stream.lines() {
        text.push('\n');
        let parts: Vec<_> = line.split('\t').map(escape).collect();
        text.push_str(&parts.join("\t"));
    }
    text
}

/// The keys of the kept output of each attempt under `prefix` (one task's).
async fn attempt_keys(coord: &dyn Coordinator, prefix: &str) -> Result<Vec<String>, OperateError> {
    let (keys, _) = coord.keys(prefix).await?;
    Ok(keys
        .iter()
        .filter(|key| attempt_of(prefix, key).is_some())
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coord::memory::MemoryCoordinator;

    /// A purged dead letter takes the output of its runs with it, not that of a run of the
    /// task enqueued again under its key since.
    #[tokio::test]
    async fn a_deleted_dead_letter_forgets_its_runs_output_only() {
        let coord = MemoryCoordinator::default();
        let queue = crate::config::Settings::load(None, crate::config::Env::new())
            .unwrap()
            .queue;
        let record = |attempt: u32, finished_at: &str| OutputRecord {
            attempt,
            finished_at: finished_at.into(),
            stdout: "x".into(),
            ..OutputRecord::default()
        };
        let prefix = output_prefix(&queue.prefix, "t");
        coord
            .put(
                &format!("{prefix}1"),
                &record(1, "2026-01-01T00:00:00Z").encode(),
            )
            .unwrap();
        coord
            .put(
                &format!("{prefix}2"),
                &record(2, "2026-01-03T00:00:00Z").encode(),
            )
            .unwrap();
        coord.put("leaderq/output/oracleTask/t/x/1", b"{}").unwrap();
        let letter = StoredTask {
            key: format!("{}t", queue.dead_prefix),
            value:
                serde_json::json!({"originalKey": "oracleTask/t", "deadAt": "2026-01-02T00:00:00Z"})
                    .to_string()
                    .into_bytes(),
            ..StoredTask::default()
        };
        let forgotten = forget(&coord, &queue, &letter, Utc::now()).await.unwrap();
        assert_eq!(forgotten, 1);
        let (left, _) = coord.keys("leaderq/output/").await.unwrap();
        let left: Vec<String> = left.iter().collect();
        assert_eq!(
            left,
            [
                format!("{prefix}2").as_str(),
                "leaderq/output/oracleTask/t/x/1"
            ]
        );
    }

    /// Each attempt shows its header, its streams line by line, what was not kept, and
    /// nothing a terminal would act on.
    #[test]
    fn render_shows_each_attempt_and_escapes_the_streams() {
        let output = TaskOutput {
            key: "oracleTask/t".into(),
            prefix: "leaderq/output/oracleTask/t/".into(),
            attempts: vec![OutputRecord {
                attempt: 1,
                outcome: "failed".into(),
                stdout: "one\ntwo\u{1b}[2J\n".into(),
                stderr_dropped: 7,
                stderr: "boom".into(),
                ..OutputRecord::default()
            }],
        };
        let text = render(&output);
        assert!(text.contains("attempt 1: failed"), "{text}");
        assert!(
            text.contains("--- stdout ---\none\ntwo\\u{1b}[2J\n"),
            "{text}"
        );
        assert!(text.contains("--- stderr (7 bytes before this were not kept) ---\nboom"));
        assert!(!text.contains('\u{1b}'));
        let none = render(&TaskOutput {
            key: "oracleTask/t".into(),
            ..TaskOutput::default()
        });
        assert!(
            none.starts_with("no output kept for oracleTask/t"),
            "{none}"
        );
    }
}
