//! A run's reports on the way: the [`Reporter`] a handler finds in its `TaskContext`
//! (progress and checkpoints, kept latest-first for the leader to record), and the report
//! file an exec handler appends to (`LEADERQ_PROGRESS`), created per run in a private temp
//! dir and tailed while the run goes on. What a line means is `task/progress.rs`; writing
//! the reports into the task is the queue's (`queue/progress.rs`).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use tokio::io::AsyncReadExt as _;
use tokio::sync::Notify;

use crate::task::progress::{parse_line, Report, MAX_LINE};

/// How often an exec handler's report file is read while it runs.
pub const TAIL_EVERY: Duration = Duration::from_millis(200);
/// The most read from a report file at one look: a handler that floods it is read on
/// at the next look, never all at once.
const READ_AT_ONCE: usize = 4 * MAX_LINE;

/// The reports of a run not yet recorded: the latest of each.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Pending {
    pub progress: Option<(f64, Option<String>)>,
    pub checkpoint: Option<Value>,
}

impl Pending {
    pub fn is_empty(&self) -> bool {
        self.progress.is_none() && self.checkpoint.is_none()
    }
}

/// Where a handler reports how far its run got. Clones share the reports; a report is
/// never an error for the handler, even when it cannot be recorded.
#[derive(Clone, Debug, Default)]
pub struct Reporter {
    inner: Arc<Shared>,
}

#[derive(Debug, Default)]
struct Shared {
    pending: Mutex<Pending>,
    changed: Notify,
    /// Report lines refused: how many, and why the last was.
    refused: Mutex<Option<(u32, String)>>,
}

impl Reporter {
    /// How far the run got, from 0 to 1 (clamped), and what it is doing.
    pub fn progress(&self, fraction: f64, message: Option<&str>) {
        self.report(Report {
            progress: Some(fraction.clamp(0.0, 1.0)),
            message: message.map(str::to_string),
            checkpoint: None,
        });
    }

    /// Where a rerun of this task may start from: it gets the last one recorded
    /// ([`crate::handler::TaskContext::checkpoint`]). Keep it small.
    pub fn checkpoint(&self, checkpoint: Value) {
        self.report(Report {
            checkpoint: Some(checkpoint),
            ..Report::default()
        });
    }

    /// One report as read from a line.
    pub fn report(&self, report: Report) {
        if let Ok(mut pending) = self.inner.pending.lock() {
            if let Some(progress) = report.progress {
                pending.progress = Some((progress, report.message));
            } else if let (Some(message), Some((_, kept))) = (report.message, &mut pending.progress)
            {
                *kept = Some(message);
            }
            if report.checkpoint.is_some() {
                pending.checkpoint = report.checkpoint;
            }
        }
        self.inner.changed.notify_one();
    }

    /// A report line was refused, for `why`.
    pub fn refuse(&self, why: &str) {
        if let Ok(mut refused) = self.inner.refused.lock() {
            let count = refused.as_ref().map_or(0, |(count, _)| *count);
            *refused = Some((count.saturating_add(1), why.to_string()));
        }
    }

    /// What the run's attempt record says of the report lines refused, if any was.
    pub fn refusals(&self) -> Option<String> {
        let refused = self.inner.refused.lock().ok()?;
        let (count, why) = refused.as_ref()?;
        Some(format!("{count} report line(s) refused; the last: {why}"))
    }

    /// The reports not yet taken, taken.
    pub fn take(&self) -> Pending {
        self.inner
            .pending
            .lock()
            .map(|mut pending| std::mem::take(&mut *pending))
            .unwrap_or_default()
    }

    /// Waits for a report after the last wait.
    pub async fn changed(&self) {
        self.inner.changed.notified().await
    }
}

/// An exec run's report file, in a temp dir of its own (mode 0700) removed with it.
pub struct ReportFile {
    dir: PathBuf,
    path: PathBuf,
}

impl ReportFile {
    /// Creates the dir and the empty file.
    pub fn create() -> std::io::Result<ReportFile> {
        use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
        let dir = std::env::temp_dir().join(format!("leaderq-run-{:016x}", fastrand::u64(..)));
        std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
        let path = dir.join("progress");
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)?;
        Ok(ReportFile { dir, path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for ReportFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// An exec run's report file and its reader.
pub struct Reports {
    file: ReportFile,
    tail: Tail,
}

impl Reports {
    /// The report file of the run of `key`, created and opened; `None` (with a warning)
    /// when it cannot be: the run then goes on without one.
    pub async fn open(key: &str) -> Option<Reports> {
        let opened = match ReportFile::create() {
            Ok(file) => Tail::open(file.path(), key).await.map(|tail| (file, tail)),
            Err(err) => Err(err),
        };
        match opened {
            Ok((file, tail)) => Some(Reports { file, tail }),
            Err(err) => {
                tracing::warn!(task_key = %key, error = %err, "cannot create the run's report file in the temp dir: the run reports no progress (check TMPDIR)");
                None
            }
        }
    }

    pub fn path(&self) -> &Path {
        self.file.path()
    }

    /// Reads what the run appended since the last look ([`Tail::look`]).
    pub async fn look(&mut self, reporter: &Reporter) {
        self.tail.look(reporter).await
    }
}

/// Reads a report file's new lines into a reporter, a bounded amount at each look.
pub struct Tail {
    file: tokio::fs::File,
    partial: Vec<u8>,
    /// Within a line over the limit: dropped up to its newline.
    skipping: bool,
    key: String,
}

impl Tail {
    pub async fn open(path: &Path, key: &str) -> std::io::Result<Tail> {
        Ok(Tail {
            file: tokio::fs::File::open(path).await?,
            partial: Vec::new(),
            skipping: false,
            key: key.to_string(),
        })
    }

    /// Reads what was appended since the last look (at most `READ_AT_ONCE`) and reports
    /// its whole lines; a bad line is logged and skipped.
    pub async fn look(&mut self, reporter: &Reporter) {
        let mut chunk = vec![0; READ_AT_ONCE];
        let read = match self.file.read(&mut chunk).await {
            Ok(read) => read,
            Err(err) => {
                tracing::warn!(task_key = %self.key, error = %err, "cannot read the run's report file");
                return;
            }
        };
        for line in self.lines(&chunk[..read]) {
            match line.and_then(|line| parse_line(&line)) {
                Ok(report) => reporter.report(report),
                Err(why) => {
                    tracing::warn!(task_key = %self.key, error = %why, "a report line of the run is refused");
                    reporter.refuse(&why);
                }
            }
        }
    }

    /// Whole lines in `read` after what came before; a line over the limit is refused
    /// (once: an `Err`) and its bytes dropped.
    fn lines(&mut self, read: &[u8]) -> Vec<Result<Vec<u8>, String>> {
        let mut lines = Vec::new();
        for piece in read.split_inclusive(|b| *b == b'\n') {
            let ends = piece.ends_with(b"\n");
            let piece = piece.strip_suffix(b"\n").unwrap_or(piece);
            if !self.skipping {
                self.partial.extend_from_slice(piece);
                if self.partial.len() > MAX_LINE {
                    lines.push(Err(format!(
                        "a report line is over the {MAX_LINE}-byte limit: keep checkpoints small"
                    )));
                    self.partial.clear();
                    self.skipping = true;
                }
            }
            if ends {
                if !self.skipping && !self.partial.iter().all(u8::is_ascii_whitespace) {
                    lines.push(Ok(std::mem::take(&mut self.partial)));
                }
                self.partial.clear();
                self.skipping = false;
            }
        }
        lines
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lines split across reads are joined; an over-long line is dropped to its newline
    /// and the next line read.
    #[test]
    fn tail_joins_split_lines_and_drops_oversized_ones() {
        let mut tail = Tail {
            file: tokio::fs::File::from_std(tempfile::tempfile().unwrap()),
            partial: Vec::new(),
            skipping: false,
            key: "k".into(),
        };
        assert!(tail.lines(br#"{"progress":"#).is_empty());
        assert_eq!(
            tail.lines(b" 0.5}\n\n"),
            vec![Ok(br#"{"progress": 0.5}"#.to_vec())]
        );
        let big = vec![b'x'; MAX_LINE + 1];
        let refused = tail.lines(&big);
        assert!(
            matches!(&refused[..], [Err(why)] if why.contains("limit")),
            "{refused:?}"
        );
        assert!(tail.lines(b"more\n").is_empty());
        assert_eq!(tail.lines(b"{}\n"), vec![Ok(b"{}".to_vec())]);
    }

    /// The latest progress and checkpoint are kept; taking empties them.
    #[test]
    fn reporter_keeps_the_latest_of_each() {
        let reporter = Reporter::default();
        reporter.progress(0.2, Some("a"));
        reporter.checkpoint(serde_json::json!(1));
        reporter.clone().progress(1.5, None);
        let pending = reporter.take();
        assert_eq!(pending.progress, Some((1.0, None)));
        assert_eq!(pending.checkpoint, Some(serde_json::json!(1)));
        assert!(reporter.take().is_empty());
        assert_eq!(reporter.refusals(), None);
        reporter.refuse("not JSON");
        reporter.refuse("too long");
        let said = reporter.refusals().unwrap();
        assert!(said.starts_with("2 report line(s) refused") && said.ends_with("too long"));
    }
}
