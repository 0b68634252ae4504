//! [`Elections`] on Consul's leader key: observe it with blocking GETs, campaign with
//! `?acquire=<session>` (or, when a restart took up the session that still holds it, an
//! unlock and lock in one transaction, a new write), resign with `?release=<session>`.
//! The fencing token is the key's `ModifyIndex` as the winning acquire wrote it: the raft
//! index of that write, from the one global index that only rises, so a later win (a key
//! deleted and created anew included) has a higher one. Not `LockIndex`: Consul starts it
//! again at 1 on a key created anew, and a plain PUT sets it to 0. The key's value is the
//! [`HolderRecord`].
//!
//! One call is one attempt: waiting between attempts (lock-delay, deferring to the
//! previous leader) is the caller's business.

use std::time::Duration;

use tokio::time::Instant;

use crate::coord::consul::client::{
    self as consul, KvPair, PutMode, QueryOptions, TxnOp, TxnOutcome, MIN_REQUERY,
};
use crate::coord::{
    Campaign, CoordError, Elections, FencingToken, Holder, HolderRecord, Leadership, LeaseId,
    Version,
};

use super::ConsulCoordinator;

/// The version to hand back after a blocking read at `after` returned index `returned`,
/// following Consul's advice: an index that went backwards (a snapshot restore, tombstones
/// reaped) starts over with a plain read (0), and a blocking read never waits on 0.
pub fn next_version(after: Version, returned: u64) -> Version {
    if returned < after.0 {
        Version(0)
    } else {
        Version(returned.max(1))
    }
}

/// Waits out the rest of `consul::MIN_REQUERY` (but never more than the `wait` asked for)
/// after a blocking read sent at `sent` came back unchanged, so a server that answers early
/// cannot make the caller spin. A plain read (`after` 0) or a moved index returns at once.
pub async fn settle(sent: Instant, wait: Duration, after: Version, next: Version) {
    if after.0 != 0 && next == after {
        tokio::time::sleep_until(sent + wait.min(MIN_REQUERY)).await;
    }
}

/// The leadership as the leader key shows it. While the key is held, its `ModifyIndex` is
/// the holder's token: nothing writes a held key but its holder's acquire, unless an
/// operator rewrites it, which also ends that leadership (the guard checks the index). A
/// free key's `ModifyIndex` is its release's (or its session's end), no token at all, so
/// a free leadership reports 0: Consul keeps no record of the last token.
pub fn holder_of(entry: Option<KvPair>) -> Holder {
    match entry {
        None => Holder::default(),
        Some(entry) => Holder {
            record: HolderRecord::decode(&entry.value),
            token: if entry.session.is_some() {
                FencingToken(entry.modify_index)
            } else {
                FencingToken(0)
            },
            lease: entry.session.map(LeaseId),
        },
    }
}

/// What one acquire attempt came to, given whether Consul said it took the key and the key
/// as read right after.
fn after_acquire(lease: &LeaseId, entry: Option<&KvPair>) -> Campaign {
    match entry.and_then(|entry| entry.session.as_deref().map(|s| (s, entry.modify_index))) {
        Some((session, modify_index)) if session == lease.0 => Campaign::Won(Leadership {
            lease: lease.clone(),
            fencing_token: FencingToken(modify_index),
        }),
        Some(_) => Campaign::Held,
        // Free: refused under lock-delay, or won and lost again at once (the session was
        // invalidated meanwhile; the next attempt finds that out).
        None => Campaign::Delayed,
    }
}

impl Elections for ConsulCoordinator {
    /// A blocking GET on the leader key at `after`, paced by [`settle`].
    async fn observe(
        &self,
        after: Version,
        wait: Duration,
    ) -> Result<(Holder, Version), CoordError> {
        let options = QueryOptions {
            index: after.0,
            wait: Some(wait),
        };
        let sent = Instant::now();
        let (entry, returned) = self
            .client
            .kv_get(&self.settings.leader_key, options)
            .await?;
        let next = next_version(after, returned);
        settle(sent, wait, after, next).await;
        Ok((holder_of(entry), next))
    }

    /// One attempt at the leader key with `lease`.
    async fn campaign(
        &self,
        lease: &LeaseId,
        record: &HolderRecord,
    ) -> Result<Campaign, CoordError> {
        let key = &self.settings.leader_key;
        let value = record.encode();
        let (entry, _) = self.client.kv_get(key, QueryOptions::default()).await?;
        match entry {
            Some(entry) if entry.session.as_deref() == Some(lease.0.as_str()) => {
                // Held by this very lease: a restart took it up, or an earlier attempt won
                // and could not read the key back. An earlier run may have handed out this
                // ModifyIndex, so take the key again for a higher one.
                match self.reacquire(lease, &value).await? {
                    Some(token) if token > entry.modify_index => {
                        return Ok(self.won(lease, value, FencingToken(token)));
                    }
                    // A server whose transaction did not write the key anew: release it and
                    // acquire it like any free key (a release sets no lock-delay).
                    Some(_) => {
                        self.client
                            .kv_put(key, &value, PutMode::Release(lease.0.clone()))
                            .await?;
                    }
                    None => {}
                }
            }
            Some(entry) if entry.session.is_some() => return Ok(Campaign::Held),
            _ => {}
        }
        let acquired = match self
            .client
            .kv_put(key, &value, PutMode::Acquire(lease.0.clone()))
            .await
        {
            Ok(acquired) => acquired,
            Err(consul::Error::Status { code: 500, body }) if body.contains("invalid session") => {
                return Ok(Campaign::LeaseGone);
            }
            Err(err) => return Err(err.into()),
        };
        // Won or refused, the key as it is now says which: held by this lease (its
        // ModifyIndex, the acquire's write, is the token), by another (it won the race), or
        // free (lock-delay). Should an operator rewrite the key in between, its index is
        // still one no other leadership had, and above every earlier one.
        let (entry, _) = self.client.kv_get(key, QueryOptions::default()).await?;
        let campaign = after_acquire(lease, entry.as_ref());
        if let Campaign::Won(leadership) = &campaign {
            if !acquired {
                tracing::debug!(session = %lease, "the acquire was refused, yet the key is held by this lease");
            }
            return Ok(self.won(lease, value, leadership.fencing_token));
        }
        Ok(campaign)
    }

    /// Releases the key if the leadership's lease holds it (no lock-delay).
    async fn resign(&self, lease: &LeaseId) -> Result<(), CoordError> {
        self.release_leader_key(lease).await?;
        self.tied().records.remove(lease);
        Ok(())
    }
}

impl ConsulCoordinator {
    fn won(&self, lease: &LeaseId, value: Vec<u8>, fencing_token: FencingToken) -> Campaign {
        self.tied().records.insert(lease.clone(), value);
        Campaign::Won(Leadership {
            lease: lease.clone(),
            fencing_token,
        })
    }

    /// Releases and acquires again the leader key this lease holds, in one transaction: a
    /// new write of the key (its ModifyIndex rises to the transaction's index), a release
    /// sets no lock-delay, and no other replica can take the key in between. The new
    /// ModifyIndex, or `None` if the lease no longer holds the key.
    async fn reacquire(&self, lease: &LeaseId, value: &[u8]) -> Result<Option<u64>, CoordError> {
        let key = self.settings.leader_key.clone();
        let ops = [
            TxnOp::Unlock {
                key: key.clone(),
                value: value.to_vec(),
                session: lease.0.clone(),
            },
            TxnOp::Lock {
                key: key.clone(),
                value: value.to_vec(),
                session: lease.0.clone(),
            },
        ];
        match self.client.txn(&ops).await? {
            TxnOutcome::Committed(entries) => Ok(entries
                .iter()
                .rev()
                .find(|entry| entry.key == key)
                .map(|entry| entry.modify_index)),
            TxnOutcome::RolledBack(errors) => {
                tracing::info!(
                    ?errors,
                    "the reused session lost the leader key before taking it again"
                );
                Ok(None)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The leader key written at `modify_index`; its LockIndex is 1, as on a key created
    /// anew, whatever that index.
    fn entry(session: Option<&str>, modify_index: u64, value: &[u8]) -> KvPair {
        KvPair {
            key: "consumerLeader".into(),
            value: value.to_vec(),
            flags: 0,
            session: session.map(str::to_string),
            lock_index: 1,
            create_index: 1,
            modify_index,
        }
    }

    /// Versions move forward with the server's index, start over when it goes backwards,
    /// and never hand back 0 for an index that merely was 0.
    #[test]
    fn versions_follow_the_index_and_start_over_when_it_goes_backwards() {
        assert_eq!(next_version(Version(0), 17), Version(17));
        assert_eq!(next_version(Version(17), 17), Version(17));
        assert_eq!(next_version(Version(17), 20), Version(20));
        assert_eq!(next_version(Version(17), 3), Version(0));
        assert_eq!(next_version(Version(0), 0), Version(1));
    }

    /// An unchanged blocking read waits out MIN_REQUERY, or the shorter wait asked for; a
    /// moved one or a plain read does not wait.
    #[tokio::test(start_paused = true)]
    async fn unchanged_reads_are_paced_but_never_past_their_wait() {
        let long = Duration::from_secs(5);
        let sent = Instant::now();
        settle(sent, long, Version(7), Version(8)).await;
        settle(sent, long, Version(0), Version(8)).await;
        settle(sent, long, Version(7), Version(0)).await;
        assert_eq!(sent.elapsed(), Duration::ZERO);
        settle(sent, Duration::from_millis(10), Version(7), Version(7)).await;
        assert_eq!(sent.elapsed(), Duration::from_millis(10));
        settle(sent, long, Version(7), Version(7)).await;
        assert_eq!(sent.elapsed(), MIN_REQUERY);
    }

    /// The holder is the lock's session, the record the value if it is one, the token the
    /// ModifyIndex (not the LockIndex); a free key keeps the last record but no token; no
    /// key is nobody.
    #[test]
    fn the_holder_is_read_from_the_leader_key() {
        let record = HolderRecord {
            node: "web-1".into(),
            session: "s1".into(),
            ..HolderRecord::default()
        };
        let held = holder_of(Some(entry(Some("s1"), 4, &record.encode())));
        assert_eq!(held.lease, Some(LeaseId("s1".into())));
        assert_eq!(held.record, Some(record.clone()));
        assert_eq!(held.token, FencingToken(4));
        let free = holder_of(Some(entry(None, 4, &record.encode())));
        assert_eq!(free.lease, None);
        assert_eq!(free.record, Some(record));
        assert_eq!(free.token, FencingToken(0));
        let foreign = holder_of(Some(entry(Some("s2"), 2, b"not json")));
        assert_eq!(foreign.record, None);
        assert_eq!(holder_of(None), Holder::default());
    }

    /// After an acquire, the key says the outcome: ours (with its ModifyIndex as the
    /// token), another's, or free under lock-delay.
    #[test]
    fn an_acquire_is_judged_by_the_key_read_after_it() {
        let lease = LeaseId("s1".into());
        assert_eq!(
            after_acquire(&lease, Some(&entry(Some("s1"), 7, b""))),
            Campaign::Won(Leadership {
                lease: lease.clone(),
                fencing_token: FencingToken(7)
            })
        );
        assert_eq!(
            after_acquire(&lease, Some(&entry(Some("s2"), 7, b""))),
            Campaign::Held
        );
        assert_eq!(
            after_acquire(&lease, Some(&entry(None, 7, b""))),
            Campaign::Delayed
        );
        assert_eq!(after_acquire(&lease, None), Campaign::Delayed);
    }
}
