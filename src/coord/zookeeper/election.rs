//! [`Elections`] on ZooKeeper, as Curator's LeaderLatch: each campaigning lease has one
//! ephemeral-sequential latch znode under the election znode, the lowest leads, and a
//! replica in line waits on its predecessor alone (no herd when the leader goes).
//!
//! A lease joins the line at its first campaign and stays in it (a later campaign finds its
//! znode) until it resigns or its session ends. The latch's name carries its session, as
//! Curator's protected mode does: a create whose answer was lost is found again, not made
//! twice. The lowest latch wins by rewriting the marker znode in a `multi` that checks its
//! own latch still exists: nothing lower can appear (sequences only grow), so while that
//! latch exists no one else can win.
//!
//! The fencing token is the higher of the marker's `mzxid` as the win's write left it and
//! the `floor` in the record that write put in the marker ([`token_of`]). zxids only grow,
//! across sessions, leaders and restarts of the ensemble, and a re-campaign by the holder
//! writes the marker anew; the floor is what keeps tokens rising when zxids start over, in
//! an ensemble whose data was lost (epoch 1 again). The win's write carries `floor` = the
//! higher of the campaigning replica's (the highest token it has seen, plus one) and the
//! marker's token as read plus one ([`floor_over`]), and it is conditioned on the marker's
//! version as read, so no win slips in between: each token is above the one before it,
//! whatever the zxids did. Only wins write the marker, so observers read the same token
//! from it; the guard of the queue's writes checks the marker's version, not the token.

use std::time::Duration;

use zookeeper_client as zk;

use super::client::{children_synced, commit, timed, unavailable};
use super::plan::ZkOp;
use super::{layout, ZkCoordinator};
use crate::coord::{
    Campaign, CoordError, Elections, FencingToken, Holder, HolderRecord, Leadership, LeaseId,
    Version,
};

/// How often a campaign retries when another campaign of the same lease rewrote the marker
/// between its read and its write.
const MARKER_RETRIES: usize = 3;

/// The election as read: the line, lowest first, and what the marker says.
struct Snapshot {
    line: Vec<layout::Latch>,
    holder: Holder,
    version: Version,
}

/// The token the marker stands for, from its data and its `mzxid`: the higher of that zxid
/// (the last win's write) and the floor of the record the win wrote.
pub(super) fn token_of(data: &[u8], mzxid: i64) -> FencingToken {
    let floor = HolderRecord::decode(data).and_then(|record| record.floor);
    FencingToken((mzxid.max(0) as u64).max(floor.unwrap_or(0)))
}

/// The floor a win over the marker as read (its data and `mzxid`) must write: above the
/// token it stands for and at least the `asked` floor (the campaigning replica's).
pub(super) fn floor_over(data: &[u8], mzxid: i64, asked: Option<u64>) -> u64 {
    let last = token_of(data, mzxid).0;
    last.saturating_add(1).max(asked.unwrap_or(0))
}

/// The guard of every leader's write: its latch znode still exists (so it still leads)
/// and the marker is still at the version its win left (so no later win of the same lease
/// raised the token meanwhile).
pub(super) fn guard(
    leader_key: &str,
    latch: &str,
    latch_version: i32,
    marker_version: i32,
) -> Vec<ZkOp> {
    let dir = layout::path_of(leader_key);
    vec![
        ZkOp::Check {
            path: format!("{dir}/{latch}"),
            version: latch_version,
        },
        ZkOp::Check {
            path: format!("{dir}/{}", layout::MARKER),
            version: marker_version,
        },
    ]
}

impl Elections for ZkCoordinator {
    /// The holder once the election moved past `after`, or after `wait`. A replica in line
    /// waits on its predecessor's latch alone; one not in line on the leader's; with no one
    /// in line, on the election znode's children.
    async fn observe(
        &self,
        after: Version,
        wait: Duration,
    ) -> Result<(Holder, Version), CoordError> {
        let main = self.main().await?;
        self.make_election(&main).await?;
        let first = self.snapshot(&main).await?;
        if after == Version(0) || first.version > after || wait.is_zero() {
            return Ok((first.holder, first.version));
        }
        let own = self.own_sessions();
        let dir = self.election_dir();
        let changed: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> =
            match layout::watched(&first.line, &own) {
                Some(latch) => {
                    match timed(main.check_and_watch_stat(&format!("{dir}/{}", latch.name))).await {
                        Ok((Some(_), watcher)) => Box::pin(async move {
                            watcher.changed().await;
                        }),
                        Ok((None, _)) => Box::pin(async {}),
                        Err(err) => return Err(unavailable(err)),
                    }
                }
                None => match timed(main.get_and_watch_children(&dir)).await {
                    Ok((_, _, watcher)) => Box::pin(async move {
                        watcher.changed().await;
                    }),
                    Err(err) => return Err(unavailable(err)),
                },
            };
        // What changed between the first read and the watch is in this read.
        let second = self.snapshot(&main).await?;
        if second.version > after {
            return Ok((second.holder, second.version));
        }
        let _ = tokio::time::timeout(wait, changed).await;
        let last = self.snapshot(&main).await?;
        Ok((last.holder, last.version))
    }

    async fn campaign(
        &self,
        lease: &LeaseId,
        record: &HolderRecord,
    ) -> Result<Campaign, CoordError> {
        let (Some(client), Some(session)) = (self.lease_client(lease), layout::session_of(lease))
        else {
            return Ok(Campaign::LeaseGone);
        };
        if client.state().is_terminated() {
            return Ok(Campaign::LeaseGone);
        }
        let main = self.main().await?;
        self.make_election(&main).await?;
        let dir = self.election_dir();
        let value = HolderRecord {
            session: lease.0.clone(),
            ..record.clone()
        }
        .encode();
        let gone = |err: zk::Error| match err {
            zk::Error::SessionExpired | zk::Error::ClientClosed => Ok(Campaign::LeaseGone),
            other => Err(unavailable(other)),
        };
        let mine = match self.own_latch(&client, session).await {
            Ok(Some(name)) => name,
            Ok(None) => {
                let options = zk::CreateMode::EphemeralSequential.with_acls(self.acls());
                let prefix = format!("{dir}/{}", layout::latch_prefix(session));
                match timed(client.create(&prefix, &value, &options)).await {
                    Ok((_, sequence)) => format!("{}{sequence}", layout::latch_prefix(session)),
                    Err(zk::Error::NoNode) => {
                        // The election znode was deleted under us: made again next time.
                        self.made().clear();
                        return Err(CoordError::Unavailable(format!(
                            "the election znode {dir} is gone; it is made again on the next campaign"
                        )));
                    }
                    Err(err) => return gone(err),
                }
            }
            Err(err) => return gone(err),
        };
        for _ in 0..MARKER_RETRIES {
            let children = match children_synced(&client, &dir).await {
                Ok(children) => children,
                Err(err) => return gone(err),
            };
            let line = layout::latches(&children);
            match line.iter().position(|latch| latch.name == mine) {
                Some(0) => {}
                Some(_) => return Ok(Campaign::Held),
                // Deleted under it: by a restart of this node, or with its session.
                None if client.state().is_terminated() => return Ok(Campaign::LeaseGone),
                None => return Ok(Campaign::Held),
            }
            let (latch_stat, (marker_data, marker_stat)) = {
                let latch = client.check_stat(&format!("{dir}/{mine}"));
                let marker = client.get_data(&self.marker_path());
                match (timed(latch).await, timed(marker).await) {
                    (Ok(Some(latch)), Ok(marker)) => (latch, marker),
                    (Ok(None), _) => continue,
                    (Ok(_), Err(zk::Error::NoNode)) => {
                        self.made().remove(&self.marker_path());
                        self.make_election(&main).await?;
                        continue;
                    }
                    (Err(err), _) | (_, Err(err)) => return gone(err),
                }
            };
            let floor = floor_over(&marker_data, marker_stat.mzxid, record.floor);
            let won = HolderRecord {
                session: lease.0.clone(),
                floor: Some(floor),
                ..record.clone()
            }
            .encode();
            let mut multi = client.new_multi_writer();
            multi
                .add_check_version(&format!("{dir}/{mine}"), latch_stat.version)
                .and_then(|()| {
                    multi.add_set_data(&self.marker_path(), &won, Some(marker_stat.version))
                })
                .map_err(unavailable)?;
            match commit(&mut multi).await {
                Ok(results) => {
                    let Some(marker) = results.into_iter().find_map(|result| match result {
                        zk::MultiWriteResult::SetData { stat } => Some(stat),
                        _ => None,
                    }) else {
                        return Err(CoordError::Unavailable(
                            "ZooKeeper answered the campaign's multi without the marker's stat"
                                .into(),
                        ));
                    };
                    let leadership = Leadership {
                        lease: lease.clone(),
                        fencing_token: FencingToken((marker.mzxid.max(0) as u64).max(floor)),
                    };
                    // The guard of this leadership's writes, known now: they need not
                    // read it again (`queue.rs`).
                    self.remember_guard(&leadership, &mine, latch_stat.version, marker.version);
                    return Ok(Campaign::Won(leadership));
                }
                Err(zk::MultiWriteError::OperationFailed { index: 0, .. }) => {
                    return Ok(if client.state().is_terminated() {
                        Campaign::LeaseGone
                    } else {
                        Campaign::Held
                    });
                }
                Err(zk::MultiWriteError::OperationFailed { .. }) => continue,
                Err(zk::MultiWriteError::RequestFailed { source }) => return gone(source),
            }
        }
        Err(CoordError::Unavailable(
            "the leader marker kept changing under the campaign; try again".into(),
        ))
    }

    /// Deletes this lease's latch znode: leadership (or its place in line) is given up, and
    /// the next in line leads.
    async fn resign(&self, lease: &LeaseId) -> Result<(), CoordError> {
        let Some(session) = layout::session_of(lease) else {
            return Ok(());
        };
        let main = self.main().await?;
        let dir = self.election_dir();
        match self.own_latch(&main, session).await {
            Ok(Some(name)) => match timed(main.delete(&format!("{dir}/{name}"), None)).await {
                Ok(()) | Err(zk::Error::NoNode) => Ok(()),
                Err(err) => Err(unavailable(err)),
            },
            Ok(None) | Err(zk::Error::NoNode) => Ok(()),
            Err(err) => Err(unavailable(err)),
        }
    }
}

impl ZkCoordinator {
    fn election_dir(&self) -> String {
        layout::path_of(&self.settings.leader_key)
    }

    fn marker_path(&self) -> String {
        format!("{}/{}", self.election_dir(), layout::MARKER)
    }

    /// Makes the election znode and its marker exist.
    async fn make_election(&self, client: &zk::Client) -> Result<(), CoordError> {
        let dir = self.election_dir();
        if self.made().contains(&self.marker_path()) {
            return Ok(());
        }
        self.make_dir(client, &dir).await?;
        let options = zk::CreateMode::Persistent.with_acls(self.acls());
        match timed(client.create(&self.marker_path(), b"", &options)).await {
            Ok(_) | Err(zk::Error::NodeExists) => {
                self.made().insert(self.marker_path());
                Ok(())
            }
            Err(err) => Err(unavailable(err)),
        }
    }

    /// This lease's latch znode's name, if it is in line.
    async fn own_latch(
        &self,
        client: &zk::Client,
        session: i64,
    ) -> Result<Option<String>, zk::Error> {
        let children = children_synced(client, &self.election_dir()).await?;
        Ok(layout::latches(&children)
            .into_iter()
            .find(|latch| latch.session == session)
            .map(|latch| latch.name))
    }

    /// The line and the marker, read now.
    async fn snapshot(&self, client: &zk::Client) -> Result<Snapshot, CoordError> {
        let dir = self.election_dir();
        let synced = timed(client.sync("/"));
        let children = timed(client.get_children(&dir));
        let marker = timed(client.get_data(&self.marker_path()));
        synced.await.map_err(unavailable)?;
        let (children, dir_pzxid) = match children.await {
            Ok((children, stat)) => (children, stat.pzxid),
            Err(zk::Error::NoNode) => (Vec::new(), 0),
            Err(err) => return Err(unavailable(err)),
        };
        let (marker, token, marker_zxid) = match marker.await {
            Ok((data, stat)) => (
                HolderRecord::decode(&data),
                token_of(&data, stat.mzxid),
                stat.mzxid.max(0) as u64,
            ),
            Err(zk::Error::NoNode) => (None, FencingToken(0), 0),
            Err(err) => return Err(unavailable(err)),
        };
        let line = layout::latches(&children);
        let (lease, record) = match line.first() {
            Some(first) => {
                let record = match timed(client.get_data(&format!("{dir}/{}", first.name))).await {
                    Ok((data, _)) => HolderRecord::decode(&data),
                    Err(zk::Error::NoNode) => None,
                    Err(err) => return Err(unavailable(err)),
                };
                (Some(layout::lease_of(first.session)), record.or(marker))
            }
            None => (None, marker),
        };
        Ok(Snapshot {
            line,
            holder: Holder {
                lease,
                record,
                token,
            },
            version: Version((dir_pzxid.max(0) as u64).max(marker_zxid)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(floor: Option<u64>) -> Vec<u8> {
        HolderRecord {
            node: "n1".into(),
            floor,
            ..HolderRecord::default()
        }
        .encode()
    }

    /// The marker stands for the higher of its `mzxid` and its record's floor: written in an
    /// ensemble whose zxids started over, it still stands for the floor its win wrote; a
    /// marker made empty, or by another program, for its zxid alone.
    #[test]
    fn the_marker_stands_for_its_zxid_or_its_floor_if_higher() {
        let epoch = 1_i64 << 32;
        assert_eq!(
            token_of(&record(None), epoch + 80),
            FencingToken((1 << 32) + 80)
        );
        let restored = token_of(&record(Some((1 << 32) + 81)), epoch + 5);
        assert_eq!(restored, FencingToken((1 << 32) + 81));
        assert_eq!(token_of(b"", epoch + 3), FencingToken((1 << 32) + 3));
        assert_eq!(token_of(b"", -1), FencingToken(0));
    }

    /// A win's floor is above the token the marker stood for and never below the floor the
    /// replica asked for; over a marker lost with the ensemble's data (made again empty),
    /// the replica's floor alone carries the token.
    #[test]
    fn a_win_writes_a_floor_above_the_markers_token() {
        assert_eq!(floor_over(&record(None), 40, None), 41);
        assert_eq!(floor_over(&record(None), 40, Some(90)), 90);
        assert_eq!(floor_over(&record(Some(157)), 7, Some(100)), 158);
        assert_eq!(floor_over(b"", 3, Some(157)), 157);
    }
}
