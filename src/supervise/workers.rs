//! Threads the supervisor keeps between runs for each run's blocking chores: reaping the
//! run's processes, feeding the handler its task on stdin, reading the ends of its stderr
//! and stdout.
//! A chore goes to an idle thread, or to one started for it when none is idle, instead of
//! to a thread started (and ended) for each chore of each run: three of those cost a run
//! of `/bin/true` about a fifth of a millisecond, much of it before the run's report.
//!
//! No chore waits for another: the threads are as many as the chores that ever ran at
//! once (up to four for one run, more only while a chore of an earlier run is still stuck,
//! a pipe an escaped process kept open). They end with the supervisor.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};

type Chore = Box<dyn FnOnce() + Send>;

/// The supervisor's kept threads.
pub struct Workers {
    chores: Sender<Chore>,
    shared: Arc<Shared>,
}

struct Shared {
    /// Every idle thread waits here, one at a time.
    waiting: Mutex<Receiver<Chore>>,
    /// Threads that finished their chore and have not been handed another: each of them
    /// takes one more from `waiting`.
    idle: AtomicUsize,
}

impl Default for Workers {
    fn default() -> Workers {
        let (chores, waiting) = mpsc::channel();
        Workers {
            chores,
            shared: Arc::new(Shared {
                waiting: Mutex::new(waiting),
                idle: AtomicUsize::new(0),
            }),
        }
    }
}

impl Workers {
    /// Runs `chore` on an idle thread, or on a new one if none is idle.
    pub fn run(&self, chore: impl FnOnce() + Send + 'static) {
        let spare = self
            .shared
            .idle
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |idle| {
                idle.checked_sub(1)
            })
            .is_ok();
        if !spare {
            let shared = self.shared.clone();
            std::thread::spawn(move || shared.serve());
        }
        // The receiver lives as long as `shared`, which this holds: the send cannot fail.
        let _ = self.chores.send(Box::new(chore));
    }
}

impl Shared {
    /// Takes chores and runs them, one at a time, until the supervisor ends.
    fn serve(&self) {
        loop {
            let chore = match self.waiting.lock() {
                Ok(waiting) => waiting.recv(),
                Err(_) => return,
            };
            let Ok(chore) = chore else { return };
            chore();
            self.idle.fetch_add(1, Ordering::AcqRel);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::sync::mpsc;
    use std::time::Duration;

    use super::*;

    /// Chores run at once, each on its own thread while the others are busy; once they
    /// are done, the next chores run on the same threads.
    #[test]
    fn busy_threads_get_company_and_idle_ones_are_reused() {
        let workers = Workers::default();
        let (release, hold) = mpsc::channel::<()>();
        let hold = Arc::new(Mutex::new(hold));
        let (done, finished) = mpsc::channel();
        let chore = |done: mpsc::Sender<std::thread::ThreadId>, hold: Option<Arc<Mutex<_>>>| {
            move || {
                if let Some(hold) = hold {
                    let hold: &Mutex<mpsc::Receiver<()>> = &hold;
                    let _ = hold.lock().unwrap().recv();
                }
                done.send(std::thread::current().id()).unwrap();
            }
        };
        // The first blocks until released; the second runs meanwhile, on another thread.
        workers.run(chore(done.clone(), Some(hold.clone())));
        workers.run(chore(done.clone(), None));
        let second = finished.recv_timeout(Duration::from_secs(5)).unwrap();
        release.send(()).unwrap();
        let first = finished.recv_timeout(Duration::from_secs(5)).unwrap();
        assert_ne!(first, second);
        // Both threads idle again: the count rises only after a chore's send, so it is
        // waited for before each chore (else a chore handed out between a thread's send and
        // its count would find none idle, and rightly start a third thread).
        let both_idle = || {
            while workers.shared.idle.load(Ordering::Acquire) < 2 {
                std::thread::yield_now();
            }
        };
        let mut later = HashSet::new();
        for _ in 0..6 {
            both_idle();
            workers.run(chore(done.clone(), None));
            later.insert(finished.recv_timeout(Duration::from_secs(5)).unwrap());
        }
        assert!(
            later.is_subset(&HashSet::from([first, second])),
            "a new thread was started while two were idle"
        );
    }
}
