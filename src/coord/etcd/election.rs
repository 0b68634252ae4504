//! [`Elections`] as etcd's `concurrency.Election` keeps it: each campaigner creates
//! `<leader_key>/<lease-hex>` under its lease, and the key created first (the lowest
//! `create_revision` under the prefix) leads.
//!
//! The seam's campaign is one attempt, not etcd's blocking wait: a campaigner that is not
//! first withdraws its key at once (`Held`) and watches the prefix until it is free, so
//! no key of a standby can become the lowest while its replica is not leading. A holder
//! campaigning again (a restart that took up its lease) deletes its key and creates it
//! anew, for a higher token. Observing reads the lowest key, and waits with a watch on the
//! prefix from the revision last seen.
//!
//! The fencing token is the higher of the campaign key's `create_revision` and the `floor`
//! in the record it holds ([`token_of`]). Revisions only rise while etcd keeps its data, so
//! a later leader's key has a higher one; the floor is what keeps tokens rising when they
//! start over, in a cluster restored from nothing. A campaign creates its key with the
//! campaigning replica's record (its floor: the highest token it has seen, plus one); once
//! the key is first, one transaction writes the key's record again with the floor of the
//! win ([`floor_over`]: also above the last leader's token) and the last leader's record
//! (`<leader_key>`) with this win's token, conditioned on the key (its `create_revision`)
//! and on the last leader's record (its `mod_revision` as read with the line). So each
//! token is above every one before it: of two wins, the later one's transaction would fail
//! had the earlier one's written the last leader's record after the later one read it, so
//! the later one read that record (or a later one) and its floor is above the earlier
//! token. Each per-candidate key is deleted on resign, but the last leader's record stays
//! for the next win; where it is lost with all the rest, the replica's own floor carries
//! the token. While the key is held, nothing but its win writes it, so observers read the
//! same token from it (a campaign not yet won may show its replica's floor alone); the
//! guard of the queue's writes checks the key's `create_revision` as the win created it,
//! remembered by lease (`won`), not the token.

use std::time::Duration;

use crate::coord::etcd::client::{Compare, Kv, Op, Range, Txn};
use crate::coord::etcd::layout::{lease_id, lease_number, position, revision_of, LastLeader};
use crate::coord::{
    Campaign, CoordError, Elections, FencingToken, Holder, HolderRecord, Leadership, LeaseId,
    Version,
};

use super::{not_a_lease, EtcdCoordinator, Won};

/// How many times a campaign re-creates its own key that a previous attempt (or run)
/// left: once is enough unless etcd is being changed by hand meanwhile.
const CREATE_ATTEMPTS: usize = 3;

/// The token a campaign key stands for: the higher of its `create_revision` and the floor
/// of the record it holds.
pub fn token_of(kv: &Kv) -> FencingToken {
    let floor = HolderRecord::decode(&kv.value).and_then(|record| record.floor);
    FencingToken((kv.create_revision.max(0) as u64).max(floor.unwrap_or(0)))
}

/// The floor a win must write: above the last leader's token (`last`, its record as read
/// once the campaign key was first) and at least the `asked` floor (the campaigning
/// replica's).
pub fn floor_over(last: Option<&LastLeader>, asked: Option<u64>) -> u64 {
    let last = last.map_or(0, |last| last.token);
    last.saturating_add(1).max(asked.unwrap_or(0))
}

/// The leadership as etcd shows it: the first campaign key (if any) holds it; otherwise
/// the last leader's record and token.
pub fn holder_of(first: Option<&Kv>, last: Option<&Kv>) -> Holder {
    match first {
        Some(kv) => Holder {
            lease: Some(if kv.lease != 0 {
                lease_id(kv.lease)
            } else {
                // A key without a lease (someone's `etcdctl put`): named by its last segment.
                let key = String::from_utf8_lossy(&kv.key);
                LeaseId(key.rsplit('/').next().unwrap_or_default().to_string())
            }),
            record: HolderRecord::decode(&kv.value),
            token: token_of(kv),
        },
        None => {
            let last = last.and_then(|kv| LastLeader::decode(&kv.value));
            Holder {
                lease: None,
                token: FencingToken(last.as_ref().map_or(0, |l| l.token)),
                record: last.map(|l| l.record),
            }
        }
    }
}

impl Elections for EtcdCoordinator {
    /// Past `after`, a watch on the campaign prefix first; then the first campaign key and
    /// the last leader's record, read at one revision.
    async fn observe(
        &self,
        after: Version,
        wait: Duration,
    ) -> Result<(Holder, Version), CoordError> {
        let candidates = Range::prefix(self.layout.candidates().as_bytes());
        if after.0 != 0 {
            self.client
                .watch(&candidates, revision_of(after) + 1, wait)
                .await?;
        }
        let first = Range {
            first_created: true,
            ..candidates
        };
        let read = Txn {
            success: vec![
                Op::Get(first),
                Op::Get(Range::key(self.layout.last().as_bytes())),
            ],
            ..Txn::default()
        };
        let response = self.client.txn(&read).await?;
        let ranges = response.ranges();
        let found = |i: usize| ranges.get(i).and_then(|kvs| kvs.first());
        Ok((
            holder_of(found(0), found(1)),
            position(response.header.revision),
        ))
    }

    /// One attempt, as the module header says.
    async fn campaign(
        &self,
        lease: &LeaseId,
        record: &HolderRecord,
    ) -> Result<Campaign, CoordError> {
        let id = lease_number(lease).ok_or_else(|| not_a_lease(lease))?;
        let key = self.layout.candidate(id).into_bytes();
        let value = record.encode();
        let mut created = None;
        for _ in 0..CREATE_ATTEMPTS {
            let create = Txn {
                compare: vec![Compare::Created(key.clone(), 0)],
                success: vec![Op::Put {
                    key: key.clone(),
                    value: value.clone(),
                    lease: id,
                }],
                failure: vec![Op::Get(Range::key(&key))],
            };
            let response = match self.client.txn(&create).await {
                Ok(response) => response,
                Err(err) if err.is_not_found() => return Ok(Campaign::LeaseGone),
                Err(err) => return Err(err.into()),
            };
            if response.succeeded {
                created = Some(response.header.revision);
                break;
            }
            // This lease's key from an earlier campaign (a restart that took the lease
            // up, an answer lost on the way): create it anew, for a higher token.
            let existing = response
                .ranges()
                .first()
                .and_then(|kvs| kvs.first())
                .map_or(0, |kv| kv.create_revision);
            self.delete_if_created(&key, existing).await?;
        }
        let Some(created) = created else {
            return Err(CoordError::Unavailable(
                "the campaign key kept coming back; is another program writing it?".into(),
            ));
        };
        let first = Range {
            first_created: true,
            ..Range::prefix(self.layout.candidates().as_bytes())
        };
        let last_key = self.layout.last().as_bytes().to_vec();
        let line = Txn {
            success: vec![Op::Get(first), Op::Get(Range::key(&last_key))],
            ..Txn::default()
        };
        let response = self.client.txn(&line).await?;
        let ranges = response.ranges();
        let found = |i: usize| ranges.get(i).and_then(|kvs| kvs.first());
        let leads = found(0).is_some_and(|kv| kv.key == key && kv.create_revision == created);
        if !leads {
            self.delete_if_created(&key, created).await?;
            return Ok(Campaign::Held);
        }
        // Leading: the win's record with its floor, on the key and as the last leader's
        // record (kept for the next win, standbys and `leaderq status` after this lease
        // lets go), written only while the key and the last record are as read.
        let last_read = found(1);
        let floor = floor_over(
            last_read
                .and_then(|kv| LastLeader::decode(&kv.value))
                .as_ref(),
            record.floor,
        );
        let token = FencingToken((created.max(0) as u64).max(floor));
        let won = HolderRecord {
            floor: Some(floor),
            ..record.clone()
        };
        let last = LastLeader {
            record: won.clone(),
            token: token.0,
        };
        let win = Txn {
            compare: vec![
                Compare::Created(key.clone(), created),
                Compare::Modified(last_key.clone(), last_read.map_or(0, |kv| kv.mod_revision)),
            ],
            success: vec![
                Op::Put {
                    key: key.clone(),
                    value: won.encode(),
                    lease: id,
                },
                Op::Put {
                    key: last_key,
                    value: last.encode(),
                    lease: 0,
                },
            ],
            ..Txn::default()
        };
        let written = match self.client.txn(&win).await {
            Ok(response) => response.succeeded,
            Err(err) if err.is_not_found() => return Ok(Campaign::LeaseGone),
            Err(err) => return Err(err.into()),
        };
        if !written {
            // The key went with its lease, or the last record was written since it was read
            // (an operator, a replica of an older version): look again.
            self.delete_if_created(&key, created).await?;
            return Ok(Campaign::Held);
        }
        self.won().insert(lease.clone(), Won { token, created });
        Ok(Campaign::Won(Leadership {
            lease: lease.clone(),
            fencing_token: token,
        }))
    }

    /// Deletes this lease's campaign key, if it has one.
    async fn resign(&self, lease: &LeaseId) -> Result<(), CoordError> {
        let Some(id) = lease_number(lease) else {
            return Ok(());
        };
        self.won().remove(lease);
        let key = self.layout.candidate(id).into_bytes();
        let delete = Txn {
            compare: vec![Compare::Exists(key.clone())],
            success: vec![Op::Delete(key)],
            ..Txn::default()
        };
        self.client.txn(&delete).await?;
        Ok(())
    }
}

impl EtcdCoordinator {
    /// Deletes `key` if it is still the one created at `created`.
    async fn delete_if_created(&self, key: &[u8], created: i64) -> Result<(), CoordError> {
        let delete = Txn {
            compare: vec![Compare::Created(key.to_vec(), created)],
            success: vec![Op::Delete(key.to_vec())],
            ..Txn::default()
        };
        self.client.txn(&delete).await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(key: &str, create: i64, lease: i64, value: &[u8]) -> Kv {
        Kv {
            key: key.as_bytes().to_vec(),
            create_revision: create,
            mod_revision: create,
            version: 1,
            value: value.to_vec(),
            lease,
        }
    }

    /// The first campaign key holds leadership with its lease, record and revision; with
    /// none, the last leader's record and token remain.
    #[test]
    fn the_holder_is_the_first_campaign_key_or_the_last_record() {
        let record = HolderRecord {
            node: "n1".into(),
            ..HolderRecord::default()
        };
        let first = kv("L/1f", 12, 0x1f, &record.encode());
        let held = holder_of(Some(&first), None);
        assert_eq!(held.lease, Some(LeaseId("1f".into())));
        assert_eq!(held.record.as_ref(), Some(&record));
        assert_eq!(held.token, FencingToken(12));
        let last = LastLeader {
            record: record.clone(),
            token: 12,
        };
        let free = holder_of(None, Some(&kv("L", 13, 0, &last.encode())));
        assert_eq!(free.lease, None);
        assert_eq!(free.record, Some(record));
        assert_eq!(free.token, FencingToken(12));
        assert_eq!(holder_of(None, None), Holder::default());
        let foreign = holder_of(Some(&kv("L/694d", 3, 0, b"x")), None);
        assert_eq!(foreign.lease, Some(LeaseId("694d".into())));
        assert_eq!(foreign.record, None);
    }

    /// A campaign key stands for the higher of its `create_revision` and its record's floor:
    /// a key created in a cluster whose revisions started over still stands for the floor
    /// its win wrote, and once revisions pass it, for its revision.
    #[test]
    fn a_campaign_key_stands_for_its_revision_or_its_floor_if_higher() {
        let record = |floor: Option<u64>| {
            HolderRecord {
                node: "n1".into(),
                floor,
                ..HolderRecord::default()
            }
            .encode()
        };
        assert_eq!(
            token_of(&kv("L/1f", 12, 0x1f, &record(None))),
            FencingToken(12)
        );
        let restored = kv("L/1f", 3, 0x1f, &record(Some(157)));
        assert_eq!(token_of(&restored), FencingToken(157));
        assert_eq!(holder_of(Some(&restored), None).token, FencingToken(157));
        let caught_up = kv("L/1f", 400, 0x1f, &record(Some(157)));
        assert_eq!(token_of(&caught_up), FencingToken(400));
        assert_eq!(token_of(&kv("L/694d", 3, 0, b"x")), FencingToken(3));
    }

    /// A win's floor is above the last leader's token and never below the floor the replica
    /// asked for; with no last record (deleted, or lost with the cluster's data) the
    /// replica's floor alone carries the token.
    #[test]
    fn a_win_writes_a_floor_above_the_last_leaders_token() {
        let last = |token: u64| LastLeader {
            record: HolderRecord::default(),
            token,
        };
        assert_eq!(floor_over(None, None), 1);
        assert_eq!(floor_over(None, Some(157)), 157);
        assert_eq!(floor_over(Some(&last(40)), None), 41);
        assert_eq!(floor_over(Some(&last(40)), Some(90)), 90);
        assert_eq!(floor_over(Some(&last(157)), Some(100)), 158);
    }
}
