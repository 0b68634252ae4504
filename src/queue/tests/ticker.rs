//! The schedules' ticker beside a busy queue, on the in-memory coordinator, whose listings
//! carry one version for all its keys (as Redis's do, and Consul's for a prefix without
//! keys): the queue's writes wake its wait, but it reads the schedules again only when
//! their records changed.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::counting::Counting;
use super::lone_leader;
use crate::coord::memory::MemoryCoordinator;
use crate::coord::{Coordinator, Edit};
use crate::observe::Metrics;
use crate::schedule::store::definitions_prefix;
use crate::schedule::ticker::tick_while_leading;

/// Fifty writes to the queue while the ticker waits cost a listing each, not the three of
/// a full read (definitions, tick records, then the wait again); a schedule written then
/// is read at once.
#[tokio::test]
async fn the_queues_writes_do_not_make_the_ticker_read_the_schedules_again() {
    let counting = Arc::new(Counting::new(Arc::new(MemoryCoordinator::default())));
    let coord: Arc<dyn Coordinator> = counting.clone();
    let metrics = Arc::new(Metrics::new(["Work"]));
    let (leadership, lease, stop) = lone_leader(&coord, &metrics).await;
    let ticker = {
        let coord = coord.clone();
        let leadership = leadership.clone();
        let lease = lease.clone();
        tokio::spawn(async move {
            tick_while_leading(
                coord.as_ref(),
                &leadership,
                &lease,
                "q/",
                "n1",
                Duration::from_secs(30),
            )
            .await;
        })
    };
    let settle = || tokio::time::sleep(Duration::from_millis(20));
    settle().await;
    let before = counting.lists.load(Ordering::SeqCst);
    for n in 0..50 {
        let task = Edit::Create {
            key: format!("q/t{n}"),
            value: b"{}".to_vec(),
        };
        coord.edit(&[task]).await.unwrap();
        settle().await;
    }
    let lists = counting.lists.load(Ordering::SeqCst) - before;
    assert!(
        (50..=55).contains(&lists),
        "the ticker listed {lists} times for 50 writes to the queue"
    );
    // A schedule's record written is read at once: a full read, and the wait again.
    let before = counting.lists.load(Ordering::SeqCst);
    let schedule = Edit::Create {
        key: format!("{}beat", definitions_prefix("q/")),
        value: b"not a schedule yet".to_vec(),
    };
    coord.edit(&[schedule]).await.unwrap();
    settle().await;
    let lists = counting.lists.load(Ordering::SeqCst) - before;
    assert_eq!(lists, 3, "a new schedule's record cost {lists} listings");
    ticker.abort();
    stop.cancel();
}
