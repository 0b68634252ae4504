//! A replica of a split queue (`election.shards` = S > 1): S elections, one per shard, each
//! with its own lease, leader key (`ElectionSettings::shard_key_of`), data dir
//! (`shards/<i>-of-<S>/`, for its lease and its highest fencing token) and queue that claims
//! only that shard's tasks (`queue::Sharding`); one life per shard (`leader/lifecycle.rs`),
//! all of them polled by the replica's one thread. The [`Board`] keeps each to its share
//! (`leader/shares.rs`): it gates campaigns, and asks a term to hand its shard over when the
//! replica leads more than its share and another would take it. Schedules tick on shard
//! 0's leader, history is pruned by it; per-type caps and rates apply per shard
//! (docs/shards.md).
//!
//! [`Moves`] keeps every replica, split or not, to the shard count the deployment records
//! (`leader/shares.rs` says why two counts never lead at once).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::config::Settings;
use crate::coord::{
    CoordError, Coordinator, Edit, FencingToken, Leadership, LeaseId, Role, Version,
};
use crate::leader::lifecycle::{TermEnd, Work};
use crate::leader::replicas::{LedShard, ReplicaView, Standing};
use crate::leader::shares::{self, Move, ShardsRecord};
use crate::observe::Metrics;
use crate::queue::Queue;

/// How often a replica standing by for a move, or at its share, looks again.
const LOOK_AGAIN: Duration = Duration::from_millis(250);

/// The settings of shard `index`: its leader key in the election section.
pub fn shard_settings(settings: &Settings, index: u32) -> Settings {
    let mut shard = settings.clone();
    shard.election = settings.election.for_shard(index);
    shard
}

/// The data dir of shard `index` of `count`, under the replica's, made if missing.
pub fn shard_dir(data_dir: &Path, index: u32, count: u32) -> std::io::Result<PathBuf> {
    let dir = data_dir.join("shards").join(format!("{index}-of-{count}"));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// The shard count the deployment records, and the move from one count to another.
pub struct Moves {
    settings: Settings,
    base: Arc<dyn Coordinator>,
    node: String,
    /// The record version after which this replica saw the previous count's keys free.
    cleared: Option<Version>,
    said: Option<String>,
}

impl Moves {
    pub fn new(settings: &Settings, base: Arc<dyn Coordinator>, node: &str) -> Moves {
        Moves {
            settings: settings.clone(),
            base,
            node: node.to_string(),
            cleared: None,
            said: None,
        }
    }

    fn mine(&self) -> u32 {
        self.settings.election.shards
    }

    /// The recorded count (`None`: not a record) and its version (0: absent).
    async fn recorded(&self) -> Result<(Option<ShardsRecordRead>, Version), CoordError> {
        let key = shares::record_key(&self.settings.election.leader_key);
        let read = self.base.get(std::slice::from_ref(&key)).await?;
        Ok(match read.into_iter().next() {
            None => (
                Some(ShardsRecordRead {
                    shards: 1,
                    previous: None,
                }),
                Version(0),
            ),
            Some(stored) => (
                ShardsRecordRead::read(&stored.value),
                Version(stored.version.0),
            ),
        })
    }

    /// Whether every leader key of a `count` is free now.
    async fn keys_free(&self, count: u32) -> Result<bool, CoordError> {
        for index in 0..count.max(1) {
            let mut settings = self.settings.clone();
            settings.election.leader_key = self.settings.election.shard_key_of(index, count);
            let coord = crate::service::connect::connect(&settings)?;
            let (holder, _) = coord.observe(Version::default(), Duration::ZERO).await?;
            if holder.lease.is_some() {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// How many live replicas other than this one run with `count`.
    async fn others_on(&self, count: u32) -> Result<usize, CoordError> {
        let views = live_replicas(self.base.as_ref(), &self.settings.election.leader_key).await?;
        Ok(views
            .iter()
            .filter(|view| view.record.node != self.node && view.record.shards == count)
            .count())
    }

    /// Waits until this replica may contend under the recorded count, recording its own
    /// when the move to it may be made: `Ok(false)` on shutdown, `Err` with the reason when
    /// the coordinator refuses this replica (its settings can never work).
    pub async fn wait_for_count(&mut self, shutdown: &CancellationToken) -> Result<bool, String> {
        let mut pause = LOOK_AGAIN;
        loop {
            if shutdown.is_cancelled() {
                return Ok(false);
            }
            match self.step().await {
                Ok(true) => return Ok(true),
                Ok(false) => pause = LOOK_AGAIN,
                Err(CoordError::Refused(reason)) => return Err(reason),
                Err(err) => {
                    // Said once, and asked again less and less often while it lasts.
                    self.say(format!(
                        "cannot read the recorded shard count ({err}); trying again"
                    ));
                    pause = (pause * 2).min(LOOK_AGAIN * 20);
                }
            }
            tokio::select! {
                _ = shutdown.cancelled() => return Ok(false),
                _ = tokio::time::sleep(pause) => {}
            }
        }
    }

    /// One look at the record: `true` when this replica may contend.
    async fn step(&mut self) -> Result<bool, CoordError> {
        let mine = self.mine();
        let (record, version) = self.recorded().await?;
        let recorded = record.as_ref().map(|record| record.shards);
        if recorded == Some(mine) {
            // Contend only once the previous count's keys were seen free after this
            // record was read (any of its leaders winning later reads the record first).
            if self.cleared == Some(version) {
                return Ok(true);
            }
            let previous = record.and_then(|record| record.previous);
            if let Some(previous) = previous.filter(|previous| *previous != mine) {
                if !self.keys_free(previous).await? {
                    self.say(format!("moving from election.shards = {previous} to {mine}: waiting for the leaders of the {previous} shards to step down"));
                    return Ok(false);
                }
            }
            self.cleared = Some(version);
            self.said = None;
            return Ok(true);
        }
        let old_free = match recorded {
            Some(recorded) => self.keys_free(recorded).await?,
            None => false,
        };
        let others = match recorded {
            Some(recorded) => self.others_on(recorded).await?,
            None => 0,
        };
        match shares::next_move(mine, recorded, old_free, others) {
            Move::Contend => Ok(true),
            Move::StandBy(why) => {
                self.say(why);
                Ok(false)
            }
            Move::Record => {
                let key = shares::record_key(&self.settings.election.leader_key);
                let value = serde_json::to_vec(&ShardsRecordRead {
                    shards: mine,
                    previous: recorded,
                })
                .expect("a record serializes");
                let edit = if version == Version(0) {
                    Edit::Create { key, value }
                } else {
                    Edit::Replace {
                        key,
                        version: crate::coord::TaskVersion(version.0),
                        value,
                    }
                };
                let edited = self.base.edit(&[edit]).await?;
                if edited == crate::coord::Edited::Done {
                    tracing::warn!(from = ?recorded, to = mine, "recorded the move to election.shards = {mine}");
                }
                // Looked at again from the record, which makes this replica look once more
                // that the old keys are free before it contends.
                Ok(false)
            }
        }
    }

    /// Whether the record still names this replica's count: read after each win, before
    /// anything is claimed.
    pub async fn still_recorded(&self) -> bool {
        match self.recorded().await {
            Ok((record, _)) => record.is_some_and(|record| record.shards == self.mine()),
            Err(err) => {
                tracing::warn!(error = %err, "cannot read the recorded shard count; giving this win up");
                false
            }
        }
    }

    fn say(&mut self, why: String) {
        if self.said.as_ref() != Some(&why) {
            tracing::warn!("not contending: {why}");
            self.said = Some(why);
        }
    }
}

/// The record as written: the count, and the one it moved from.
#[derive(Clone, Copy, Debug, serde::Serialize, serde::Deserialize)]
struct ShardsRecordRead {
    shards: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    previous: Option<u32>,
}

impl ShardsRecordRead {
    fn read(value: &[u8]) -> Option<ShardsRecordRead> {
        let shards = ShardsRecord::read(Some(value))?;
        let previous = serde_json::from_slice::<ShardsRecordRead>(value)
            .ok()
            .and_then(|record| record.previous);
        Some(ShardsRecordRead { shards, previous })
    }
}

/// The replicas whose records are fresh.
async fn live_replicas(
    coord: &dyn Coordinator,
    leader_key: &str,
) -> Result<Vec<ReplicaView>, CoordError> {
    let prefix = crate::leader::replicas::prefix(leader_key);
    let (stored, _) = coord.list(&prefix, Version(0), Duration::ZERO).await?;
    Ok(crate::leader::replicas::view(&stored, chrono::Utc::now())
        .into_iter()
        .filter(|view| view.status != "gone")
        .collect())
}

/// What the shard lives of one replica share: what it leads, who else is there, and the
/// campaigns waiting.
pub struct Board {
    shards: u32,
    node: String,
    leader_key: String,
    base: Arc<dyn Coordinator>,
    led: watch::Sender<BTreeMap<u32, FencingToken>>,
    /// The live replicas running with this count, as last read (at least this one).
    live: watch::Sender<usize>,
    /// Whether this replica hands a shard over now (`shares::hands_over`).
    donor: watch::Sender<bool>,
    handovers: Vec<watch::Sender<bool>>,
    /// Each shard's share of `queue.concurrency`, while this replica leads it.
    slots: Vec<Arc<std::sync::atomic::AtomicUsize>>,
    concurrency: usize,
    /// Campaigns that end when this replica reaches its share, and those that end at a
    /// deadline (a shard contended for at the share, once free for a while).
    campaigns: Mutex<Vec<(CancellationToken, Option<tokio::time::Instant>)>>,
    standing: watch::Sender<Standing>,
    role: watch::Sender<Role>,
    metrics: Arc<Metrics>,
}

impl Board {
    pub fn new(
        settings: &Settings,
        node: &str,
        base: Arc<dyn Coordinator>,
        standing: watch::Sender<Standing>,
        role: watch::Sender<Role>,
        metrics: Arc<Metrics>,
    ) -> Board {
        let shards = settings.election.shards;
        Board {
            shards,
            node: node.to_string(),
            leader_key: settings.election.leader_key.clone(),
            base,
            led: watch::Sender::new(BTreeMap::new()),
            live: watch::Sender::new(1),
            donor: watch::Sender::new(false),
            handovers: (0..shards).map(|_| watch::Sender::new(false)).collect(),
            slots: (0..shards)
                .map(|_| {
                    Arc::new(std::sync::atomic::AtomicUsize::new(
                        settings.queue.concurrency,
                    ))
                })
                .collect(),
            concurrency: settings.queue.concurrency,
            campaigns: Mutex::new(Vec::new()),
            standing,
            role,
            metrics,
        }
    }

    /// The receiver a shard's queue watches for a handover.
    pub fn handover(&self, index: u32) -> watch::Receiver<bool> {
        self.handovers[index as usize].subscribe()
    }

    /// A shard's share of the replica's slots, which its queue reads at each listing.
    pub fn slots(&self, index: u32) -> Arc<std::sync::atomic::AtomicUsize> {
        self.slots[index as usize].clone()
    }

    fn share(&self) -> usize {
        shares::share(self.shards, *self.live.borrow())
    }

    fn led_count(&self) -> usize {
        self.led.borrow().len()
    }

    /// Keeps the share current until `stop`: reads the replicas' records, asks terms to
    /// hand over, ends campaigns no longer worth it.
    pub async fn balance(&self, every: Duration, stop: &CancellationToken) {
        let mut led = self.led.subscribe();
        loop {
            match live_replicas(self.base.as_ref(), &self.leader_key).await {
                Ok(views) => {
                    // The others as their records say, this one as it is now.
                    let mine = self.led_count();
                    let mut counts: Vec<(&str, usize)> = views
                        .iter()
                        .filter(|view| view.record.shards == self.shards)
                        .filter(|view| view.record.node != self.node)
                        .map(|view| (view.record.node.as_str(), view.record.led_shards.len()))
                        .collect();
                    counts.push((self.node.as_str(), mine));
                    let live = counts.len();
                    let donor =
                        shares::hands_over(&self.node, &counts, shares::share(self.shards, live));
                    self.live
                        .send_if_modified(|now| std::mem::replace(now, live) != live);
                    self.donor
                        .send_if_modified(|now| std::mem::replace(now, donor) != donor);
                }
                Err(err) => tracing::debug!(error = %err, "cannot read the replicas' records"),
            }
            self.rebalance();
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = led.changed() => {}
                _ = tokio::time::sleep(every) => {}
            }
        }
    }

    /// Asks the terms over the share to hand over, and ends the campaigns to be ended.
    fn rebalance(&self) {
        let led: std::collections::BTreeSet<u32> = self.led.borrow().keys().copied().collect();
        let share = self.share();
        let give = shares::to_give(&led).filter(|_| *self.donor.borrow());
        for (index, asked) in self.handovers.iter().enumerate() {
            let give = give == Some(index as u32);
            asked.send_if_modified(|now| std::mem::replace(now, give) != give);
        }
        let at_share = led.len() >= share;
        let now = tokio::time::Instant::now();
        let mut campaigns = self.campaigns.lock().unwrap_or_else(|e| e.into_inner());
        campaigns.retain(|(token, deadline)| {
            let end = match deadline {
                None => at_share,
                Some(deadline) => now >= *deadline,
            };
            if end {
                token.cancel();
            }
            !end && !token.is_cancelled()
        });
    }

    /// Waits until this replica may contend for shard `index`, whose election `coord`
    /// observes: at once under its share; at its share, once the shard has been free for
    /// the grace. Answers the token that ends the campaign (`None`: shutdown).
    async fn may_contend(
        &self,
        coord: &dyn Coordinator,
        shutdown: &CancellationToken,
    ) -> Option<CancellationToken> {
        let mut after = Version::default();
        let (mut led, mut live) = (self.led.subscribe(), self.live.subscribe());
        loop {
            if shutdown.is_cancelled() {
                return None;
            }
            if shares::contends_at_once(self.led_count(), self.share()) {
                return Some(self.campaign(shutdown, None));
            }
            let observed = tokio::select! {
                _ = shutdown.cancelled() => return None,
                _ = led.changed() => continue,
                _ = live.changed() => continue,
                observed = coord.observe(after, LOOK_AGAIN * 8) => observed,
            };
            match observed {
                Ok((holder, version)) if holder.lease.is_none() => {
                    tokio::select! {
                        _ = shutdown.cancelled() => return None,
                        _ = tokio::time::sleep(shares::VACANT_GRACE) => {}
                    }
                    if let Ok((holder, _)) = coord.observe(Version::default(), Duration::ZERO).await
                    {
                        if holder.lease.is_none() {
                            let deadline = tokio::time::Instant::now() + shares::VACANT_GRACE * 2;
                            return Some(self.campaign(shutdown, Some(deadline)));
                        }
                    }
                    after = version;
                }
                Ok((_, version)) => after = version,
                Err(_) => {
                    after = Version::default();
                    tokio::select! {
                        _ = shutdown.cancelled() => return None,
                        _ = tokio::time::sleep(LOOK_AGAIN) => {}
                    }
                }
            }
        }
    }

    fn campaign(
        &self,
        shutdown: &CancellationToken,
        deadline: Option<tokio::time::Instant>,
    ) -> CancellationToken {
        let token = shutdown.child_token();
        self.campaigns
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((token.clone(), deadline));
        token
    }

    /// Records what this replica leads now, for its record, the catalog and the metrics.
    fn set(&self, index: u32, token: Option<FencingToken>) {
        if token.is_none() {
            // One handover at a time: the next reading of the records says whether another
            // is due.
            self.donor.send_replace(false);
        }
        self.led.send_modify(|led| {
            match token {
                Some(token) => led.insert(index, token),
                None => led.remove(&index),
            };
        });
        let led = self.led.borrow().clone();
        for (rank, shard) in led.keys().enumerate() {
            let slots = shares::slots(self.concurrency, rank, led.len());
            self.slots[*shard as usize].store(slots, std::sync::atomic::Ordering::Relaxed);
        }
        let first = led.values().next().copied();
        self.metrics.leading(first);
        self.metrics.shard_leading(index, token);
        self.role.send_replace(if first.is_some() {
            Role::Leader
        } else {
            Role::Standby
        });
        self.standing.send_replace(Standing {
            leading: first,
            shards: led
                .iter()
                .map(|(shard, fencing_token)| LedShard {
                    shard: *shard,
                    fencing_token: *fencing_token,
                })
                .collect(),
        });
        self.rebalance();
    }
}

/// One shard's part of the replica's life.
pub struct ShardWork<'a> {
    pub index: u32,
    pub queue: Queue,
    pub lease: Arc<crate::leader::Lease>,
    pub board: &'a Board,
    pub moves: Moves,
    pub shutdown: &'a CancellationToken,
}

impl Work for ShardWork<'_> {
    async fn taken_up(&mut self, lease: &LeaseId) {
        self.queue.release_previous(lease).await;
    }

    async fn may_contend(
        &mut self,
        shutdown: &CancellationToken,
    ) -> Result<Option<CancellationToken>, String> {
        if !self.moves.wait_for_count(shutdown).await? {
            return Ok(None);
        }
        Ok(self
            .board
            .may_contend(self.queue.coord.as_ref(), shutdown)
            .await)
    }

    async fn before_term(&mut self, leadership: &Leadership) -> Option<TermEnd> {
        if !self.moves.still_recorded().await {
            return Some(TermEnd::Done { stand_back: true });
        }
        self.board.set(self.index, Some(leadership.fencing_token));
        None
    }

    async fn lead(&mut self, leadership: &Leadership) -> (TermEnd, String) {
        tracing::info!(
            shard = self.index,
            shards = self.board.shards,
            fencing_token = leadership.fencing_token.0,
            "leading shard"
        );
        let end = super::term::lead_watched(
            &self.queue,
            self.queue.coord.as_ref(),
            leadership,
            &self.lease,
            self.queue.wait,
            self.shutdown,
        )
        .await;
        self.board.set(self.index, None);
        super::term::term_end(end)
    }
}

/// Lives every shard's life (`lives`: a replica and a queue per shard, in order) with
/// `board` keeping each to its share, until shutdown or a life that ends the replica; the
/// highest exit code, or the first refusal.
pub async fn live_all(
    lives: Vec<(crate::leader::lifecycle::Replica, Queue)>,
    board: &Board,
    settings: &Settings,
    shutdown: &CancellationToken,
) -> Result<i32, String> {
    let stop_balance = CancellationToken::new();
    let every = (settings.election.lease_ttl / 3).min(Duration::from_secs(1));
    let balance = board.balance(every, &stop_balance);
    let shard_lives = lives
        .into_iter()
        .zip(0u32..)
        .map(|((mut replica, mut queue), index)| {
            queue.sharding.handover = Some(board.handover(index));
            queue.sharding.slots = Some(board.slots(index));
            let moves = Moves::new(settings, board.base.clone(), &board.node);
            async move {
                let lease = replica.election.lease();
                let mut work = ShardWork {
                    index,
                    queue,
                    lease,
                    board,
                    moves,
                    shutdown,
                };
                replica.live(&mut work, shutdown).await
            }
        });
    let all = async {
        let ended = futures_util::future::join_all(shard_lives).await;
        stop_balance.cancel();
        ended
    };
    let (ended, ()) = tokio::join!(all, balance);
    ended
        .into_iter()
        .try_fold(0, |code, ended| ended.map(|ended| code.max(ended)))
}
