//! A producer's checked tasks (`produce.rs`) created in the coordinator, create-only, in
//! writes of the size it takes (`Coordinator::limits`, `produce::chunks`): for the front
//! door and `leaderq enqueue --stdin`. A task whose key exists is not written again (a
//! replay writes nothing) and is reported as existing; the others of its write go on. A
//! coordinator that fails mid-way leaves the writes before done and says which tasks were
//! not written. `leaderq enqueue --stdin` ([`enqueue_lines`]) reports on each line.

use std::collections::HashSet;

use super::produce::{self, Produced, Rules};
use super::{Line, OperateError};
use crate::config::QueueSettings;
use crate::coord::{CoordError, Coordinator, Edit, Edited, TaskOp, WriteCost};
use crate::util::escape::escape;

/// What became of each task of a [`create_all`], by index into the tasks given.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Created {
    pub written: Vec<usize>,
    /// Their key existed: nothing was written for them.
    pub existing: Vec<usize>,
    /// Not written because the coordinator failed, with its error.
    pub unwritten: Vec<usize>,
    pub error: Option<String>,
}

/// Each write is tried again at most this often after conflicts, each time without the
/// tasks found existing: a conflict that names none of them means a key was created and
/// deleted meanwhile, which cannot go on for long.
const CONFLICT_ROUNDS: usize = 8;

/// What creating `(key, value)` costs on `coord`: as the leader's create-only op does.
pub fn create_cost(coord: &dyn Coordinator, key: &str, value: &[u8]) -> WriteCost {
    coord.cost(&TaskOp::Create {
        key: key.to_string(),
        value: value.to_vec(),
    })
}

/// Creates `tasks` in `coord`, in order, in writes within its limits.
pub async fn create_all(coord: &dyn Coordinator, tasks: &[Produced]) -> Created {
    let costs: Vec<_> = tasks
        .iter()
        .map(|task| create_cost(coord, &task.key, &task.value))
        .collect();
    let mut created = Created::default();
    let runs = produce::chunks(&costs, coord.limits());
    for (n, run) in runs.iter().enumerate() {
        let left: Vec<usize> = run.clone().collect();
        if let Err(err) = create_run(coord, tasks, left, &mut created).await {
            let settled: HashSet<usize> = created
                .written
                .iter()
                .chain(&created.existing)
                .copied()
                .collect();
            let rest = runs[n..].iter().flat_map(|r| r.clone());
            created
                .unwritten
                .extend(rest.filter(|i| !settled.contains(i)));
            created.error = Some(err.to_string());
            break;
        }
    }
    created
}

/// One write's tasks (`left`, indexes into `tasks`), written all or nothing, again without
/// those found existing after a conflict.
async fn create_run(
    coord: &dyn Coordinator,
    tasks: &[Produced],
    mut left: Vec<usize>,
    created: &mut Created,
) -> Result<(), CoordError> {
    for _ in 0..CONFLICT_ROUNDS {
        if left.is_empty() {
            return Ok(());
        }
        let edits: Vec<Edit> = left
            .iter()
            .map(|&i| Edit::Create {
                key: tasks[i].key.clone(),
                value: tasks[i].value.clone(),
            })
            .collect();
        match coord.edit(&edits).await? {
            Edited::Done => {
                created.written.extend(left);
                return Ok(());
            }
            Edited::Conflict(_) => {
                // Which keys exist is read, not taken from the answer: not every backend
                // names each key that failed.
                let keys: Vec<String> = left.iter().map(|&i| tasks[i].key.clone()).collect();
                let found: HashSet<String> =
                    coord.get(&keys).await?.into_iter().map(|t| t.key).collect();
                let (there, rest): (Vec<usize>, Vec<usize>) = left
                    .into_iter()
                    .partition(|&i| found.contains(&tasks[i].key));
                created.existing.extend(there);
                left = rest;
            }
        }
    }
    Err(CoordError::Unavailable(
        "the tasks' keys kept changing while they were written: try again".into(),
    ))
}

/// A fresh task id: the time in milliseconds and 64 random bits, so that the ids made for
/// one request never meet.
pub fn fresh_id() -> String {
    format!(
        "{}-{:016x}",
        chrono::Utc::now().timestamp_millis(),
        fastrand::u64(..)
    )
}

/// The tasks of `text`, one JSON object a line (blank lines skipped), each checked as the
/// leader would check it; a line refused is reported and nothing is written for it.
fn read_lines(
    coord: &dyn Coordinator,
    queue: &QueueSettings,
    text: &str,
) -> Vec<(usize, Result<Produced, produce::Refusal>)> {
    let cost = |key: &str, value: &[u8]| create_cost(coord, key, value);
    let rules = Rules {
        prefix: &queue.prefix,
        run_at_max_ahead: queue.run_at_max_ahead,
        limits: coord.limits(),
        guard: coord.guard_cost(),
        cost: &cost,
    };
    let now = chrono::Utc::now();
    text.lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
        .map(|(n, line)| {
            let task = produce::task(line.as_bytes(), None, &rules, now, &mut fresh_id);
            (n + 1, task)
        })
        .collect()
}

/// `leaderq enqueue --stdin`: one task a line, a line said about each (`[line N] enqueued
/// KEY`, or why not); the valid lines are written in the coordinator's write-sized chunks,
/// nothing for a line refused or whose key exists. Ends in
/// [`OperateError::NotAllEnqueued`] when any line was not enqueued.
pub async fn enqueue_lines<E: From<OperateError>>(
    coord: &dyn Coordinator,
    queue: &QueueSettings,
    text: &str,
    mut say: impl FnMut(Line) -> Result<(), E>,
) -> Result<(), E> {
    let lines = read_lines(coord, queue, text);
    let total = lines.len();
    if total == 0 {
        return Err(OperateError::NothingToEnqueue.into());
    }
    let mut valid = Vec::new();
    let mut numbers = Vec::new();
    let mut keys = HashSet::new();
    let mut failed = 0;
    for (n, task) in lines {
        match task {
            Ok(task) if !keys.insert(task.key.clone()) => {
                failed += 1;
                say(Line::Err(format!(
                    "[line {n}] refused: an earlier line has the key {}: give each task its own taskId",
                    task.key
                )))?;
            }
            Ok(task) => {
                valid.push(task);
                numbers.push(n);
            }
            Err(refusal) => {
                failed += 1;
                let field = refusal.field.as_deref().unwrap_or("the task");
                say(Line::Err(format!(
                    "[line {n}] refused ({field}): {}",
                    escape(&refusal.message)
                )))?;
            }
        }
    }
    let created = create_all(coord, &valid).await;
    let written: HashSet<usize> = created.written.iter().copied().collect();
    let existing: HashSet<usize> = created.existing.iter().copied().collect();
    for (i, task) in valid.iter().enumerate() {
        let n = numbers[i];
        if written.contains(&i) {
            say(Line::Out(format!("[line {n}] enqueued {}", task.key)))?;
        } else if existing.contains(&i) {
            failed += 1;
            say(Line::Err(format!(
                "[line {n}] not enqueued: {} already exists; nothing written",
                task.key
            )))?;
        } else {
            failed += 1;
            let error = created.error.as_deref().unwrap_or("not written");
            say(Line::Err(format!(
                "[line {n}] not enqueued: {}",
                escape(error)
            )))?;
        }
    }
    say(Line::Out(format!(
        "enqueued {} of {total} line(s)",
        total - failed
    )))?;
    if failed > 0 {
        return Err(OperateError::NotAllEnqueued { failed, total }.into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coord::memory::MemoryCoordinator;

    fn task(n: usize) -> Produced {
        Produced {
            key: format!("oracleTask/task_{n}"),
            value: format!(r#"{{"taskType": "T", "taskTime": {n}}}"#).into_bytes(),
        }
    }

    /// Tasks over several writes all land but one whose key exists, which is reported as
    /// existing and left as it was; sent again, nothing is written.
    #[tokio::test]
    async fn a_batch_lands_but_for_existing_keys_and_a_replay_writes_nothing() {
        let coord = MemoryCoordinator::default();
        let before = br#"{"taskType": "T", "taskTime": 0, "first": true}"#.to_vec();
        let create = [Edit::Create {
            key: "oracleTask/task_200".into(),
            value: before.clone(),
        }];
        assert_eq!(coord.edit(&create).await.unwrap(), Edited::Done);
        let tasks: Vec<Produced> = (0..300).map(task).collect();
        let created = create_all(&coord, &tasks).await;
        assert_eq!(created.existing, [200]);
        assert_eq!(created.written.len(), 299);
        assert!(created.unwritten.is_empty() && created.error.is_none());
        let stored = coord.get(&["oracleTask/task_200".to_string()]).await;
        assert_eq!(stored.unwrap()[0].value, before);
        let again = create_all(&coord, &tasks).await;
        assert!(again.written.is_empty());
        assert_eq!(again.existing.len(), 300);
    }

    /// `enqueue --stdin`: a bad line and a repeated key are reported and not written; the
    /// others are; the run ends in `NotAllEnqueued`.
    #[tokio::test]
    async fn stdin_lines_are_reported_one_by_one() {
        let coord = MemoryCoordinator::default();
        let queue = crate::config::Settings::load(None, crate::config::Env::new())
            .unwrap()
            .queue;
        let text = concat!(
            r#"{"taskType": "T", "taskTime": 1, "taskId": "a"}"#,
            "\n",
            r#"{"taskType": "T", "taskTime": "soon", "taskId": "b"}"#,
            "\n\n",
            r#"{"taskType": "T", "taskTime": 3, "taskId": "a"}"#,
            "\n",
            r#"{"taskType": "T", "taskTime": 4, "taskId": "c"}"#,
        );
        let mut said = Vec::new();
        let ended = enqueue_lines(&coord, &queue, text, |line| {
            said.push(match line {
                Line::Out(text) | Line::Err(text) => text,
            });
            Ok::<(), OperateError>(())
        })
        .await;
        assert!(matches!(
            ended,
            Err(OperateError::NotAllEnqueued {
                failed: 2,
                total: 4
            })
        ));
        let said = said.join("\n");
        assert!(said.contains("[line 2] refused (taskTime)"), "{said}");
        assert!(said.contains("[line 4] refused: an earlier line"), "{said}");
        assert!(
            said.contains("[line 1] enqueued oracleTask/task_a"),
            "{said}"
        );
        assert!(
            said.contains("[line 5] enqueued oracleTask/task_c"),
            "{said}"
        );
        let (keys, _) = coord.keys("oracleTask/").await.unwrap();
        assert_eq!(keys.len(), 2);
    }
}
