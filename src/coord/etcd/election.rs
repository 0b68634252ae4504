//! [`Elections`] as etcd's `concurrency.Election` keeps it: each campaigner creates
//! `<leader_key>/<lease-hex>` under its lease, and the key created first (the lowest
//! `create_revision` under the prefix) leads; its `create_revision` is the fencing token.
//! Revisions only rise, so a later leader's key always has a higher one.
//!
//! The seam's campaign is one attempt, not etcd's blocking wait: a campaigner that is not
//! first withdraws its key at once (`Held`) and watches the prefix until it is free, so
//! no key of a standby can become the lowest while its replica is not leading. A holder
//! campaigning again (a restart that took up its lease) deletes its key and creates it
//! anew, for a higher token. Observing reads the lowest key, and waits with a watch on the
//! prefix from the revision last seen.

use std::time::Duration;

use crate::coord::etcd::client::{Compare, Kv, Op, Range, Txn};
use crate::coord::etcd::layout::{lease_id, lease_number, position, revision_of, LastLeader};
use crate::coord::{
    Campaign, CoordError, Elections, FencingToken, Holder, HolderRecord, Leadership, LeaseId,
    Version,
};

use super::{not_a_lease, EtcdCoordinator};

/// How many times a campaign re-creates its own key that a previous attempt (or run)
/// left: once is enough unless etcd is being changed by hand meanwhile.
const CREATE_ATTEMPTS: usize = 3;

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
            token: FencingToken(kv.create_revision.max(0) as u64),
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
        let response = self.client.range(&first).await?;
        let leads = response
            .kvs
            .first()
            .is_some_and(|kv| kv.key == key && kv.create_revision == created);
        if !leads {
            self.delete_if_created(&key, created).await?;
            return Ok(Campaign::Held);
        }
        // Leading: keep the record for standbys and `leaderq status` after this lease
        // lets go, written only while the campaign key is still there.
        let last = LastLeader {
            record: record.clone(),
            token: created as u64,
        };
        let keep = Txn {
            compare: vec![Compare::Created(key.clone(), created)],
            success: vec![Op::Put {
                key: self.layout.last().as_bytes().to_vec(),
                value: last.encode(),
                lease: 0,
            }],
            ..Txn::default()
        };
        if let Err(err) = self.client.txn(&keep).await {
            tracing::warn!(error = %err, "cannot keep the leader's record for standbys");
        }
        Ok(Campaign::Won(Leadership {
            lease: lease.clone(),
            fencing_token: FencingToken(created as u64),
        }))
    }

    /// Deletes this lease's campaign key, if it has one.
    async fn resign(&self, lease: &LeaseId) -> Result<(), CoordError> {
        let Some(id) = lease_number(lease) else {
            return Ok(());
        };
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
}
