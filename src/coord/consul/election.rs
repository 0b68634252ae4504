//! [`Elections`] on Consul's leader key: observe it with blocking GETs, campaign with a
//! transaction that locks it for `<session>` at the index it was read (or, when a restart
//! took up the session that still holds it, an unlock and lock in one transaction, a new
//! write), resign with `?release=<session>`. The key's value is the [`HolderRecord`].
//!
//! The fencing token is the higher of the key's `ModifyIndex` as the winning write left it
//! (the raft index of that write, from the one global index that only rises, so a later
//! win, a key deleted and created anew included, has a higher one) and the record's
//! `floor`. Not `LockIndex`: Consul starts it again at 1 on a key created anew, and a plain
//! PUT sets it to 0. The floor is what keeps tokens rising when Consul's index does not: a
//! cluster (or a `leaderq server` data dir) that lost its data counts its index from 1
//! again. The win's write carries `floor` = the higher of the campaigning replica's (the
//! highest token it has seen, plus one) and the last record's token plus one, and it is
//! conditioned on the key's index as read, so that no win slips in between the read and the
//! write: each token is above the one before it, whatever the index did. While the key is
//! held nothing but its holder's win writes it, so everyone reads the same token from it.
//!
//! One call is one attempt: waiting between attempts (lock-delay, deferring to the
//! previous leader) is the caller's business.

use std::time::Duration;

use tokio::time::Instant;

use crate::coord::consul::client::{QueryOptions, TxnError, TxnOp, TxnOutcome, MIN_REQUERY};
use crate::coord::{
    Campaign, CoordError, Elections, FencingToken, Holder, HolderRecord, Leadership, LeaseId,
    Version,
};

use super::layout::{floor_over, holder_of};
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

/// What a rolled back campaign transaction means: the session is gone (`LeaseGone`), the
/// key is under lock-delay (`Delayed`), or someone else wrote it first (`Held`: the caller
/// watches it from a fresh look).
fn after_refusal(errors: &[TxnError]) -> Campaign {
    if errors.iter().any(|e| e.what.contains("invalid session")) {
        Campaign::LeaseGone
    } else if errors.iter().any(|e| e.what.contains("lock delay")) {
        Campaign::Delayed
    } else {
        Campaign::Held
    }
}

impl Elections for ConsulCoordinator {
    /// A blocking GET on the leader key at `after`, paced by `settle` (above).
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
        // A key this replica won, written since by someone else (an operator's PUT keeps the
        // lock's session): its token may read the same, but the win is no more.
        let rewritten = entry.as_ref().is_some_and(|entry| {
            entry.session.as_ref().is_some_and(|session| {
                let at = self.won_at(&LeaseId(session.clone()), None);
                at != 0 && at != entry.modify_index
            })
        });
        let mut holder = holder_of(entry);
        if rewritten {
            holder.token = FencingToken(0);
        }
        Ok((holder, next))
    }

    /// One attempt at the leader key with `lease`: one transaction that locks the key as
    /// read (its index checked, or its absence) with the record and its floor.
    async fn campaign(
        &self,
        lease: &LeaseId,
        record: &HolderRecord,
    ) -> Result<Campaign, CoordError> {
        let key = &self.settings.leader_key;
        let (entry, _) = self.client.kv_get(key, QueryOptions::default()).await?;
        let floor = floor_over(entry.as_ref(), record.floor);
        let value = HolderRecord {
            floor: Some(floor),
            ..record.clone()
        }
        .encode();
        let lock = TxnOp::Lock {
            key: key.clone(),
            value: value.clone(),
            session: lease.0.clone(),
        };
        let ops = match &entry {
            Some(entry) if entry.session.as_deref() == Some(lease.0.as_str()) => {
                // Held by this very lease: a restart took it up, or an earlier attempt won
                // and its answer was lost. An earlier run may have handed out its token, so
                // take the key again, a new write with a higher floor.
                vec![
                    TxnOp::CheckIndex {
                        key: key.clone(),
                        index: entry.modify_index,
                    },
                    TxnOp::Unlock {
                        key: key.clone(),
                        value: value.clone(),
                        session: lease.0.clone(),
                    },
                    lock,
                ]
            }
            Some(entry) if entry.session.is_some() => return Ok(Campaign::Held),
            Some(entry) => vec![
                TxnOp::CheckIndex {
                    key: key.clone(),
                    index: entry.modify_index,
                },
                lock,
            ],
            None => vec![TxnOp::CheckNotExists { key: key.clone() }, lock],
        };
        match self.client.txn(&ops).await? {
            TxnOutcome::Committed(entries) => {
                let won = entries.iter().rev().find(|entry| entry.key == *key);
                match won {
                    Some(won) if won.session.as_deref() == Some(lease.0.as_str()) => {
                        let at = won.modify_index;
                        let token = FencingToken(at.max(floor));
                        Ok(self.won(lease, value, at, token))
                    }
                    // A server whose transaction answered without the key: look again.
                    _ => Ok(Campaign::Held),
                }
            }
            TxnOutcome::RolledBack(errors) => {
                tracing::debug!(?errors, "campaign refused");
                Ok(after_refusal(&errors))
            }
        }
    }

    /// Releases the key if the leadership's lease holds it (no lock-delay).
    async fn resign(&self, lease: &LeaseId) -> Result<(), CoordError> {
        self.release_leader_key(lease).await?;
        let mut tied = self.tied();
        tied.records.remove(lease);
        tied.won_at.remove(lease);
        Ok(())
    }
}

impl ConsulCoordinator {
    /// Records a win by `lease` that wrote `value` at index `at`, handing out `token`.
    fn won(&self, lease: &LeaseId, value: Vec<u8>, at: u64, token: FencingToken) -> Campaign {
        let mut tied = self.tied();
        tied.records.insert(lease.clone(), value);
        tied.won_at.insert(lease.clone(), (at, token));
        Campaign::Won(Leadership {
            lease: lease.clone(),
            fencing_token: token,
        })
    }

    /// The leader key's index as `lease`'s latest win wrote it, if that win handed out
    /// `token` (any token for `None`): what its guarded writes check. 0, which no key has,
    /// if it never won, or if `token` is an earlier win's: a leadership this lease won
    /// again since is over, and its guard fails.
    pub(super) fn won_at(&self, lease: &LeaseId, token: Option<FencingToken>) -> u64 {
        match self.tied().won_at.get(lease) {
            Some((at, won)) if token.is_none_or(|token| token == *won) => *at,
            _ => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    /// A refused campaign: a session gone is `LeaseGone`, lock-delay `Delayed`, anything
    /// else (the key written since it was read, or held) `Held`, to be looked at again.
    #[test]
    fn a_refused_campaign_is_judged_by_its_errors() {
        let error = |what: &str| TxnError {
            op_index: 1,
            what: what.into(),
        };
        assert_eq!(
            after_refusal(&[error(r#"invalid session "s1""#)]),
            Campaign::LeaseGone
        );
        assert_eq!(
            after_refusal(&[error(r#"failed to lock key "k" due to lock delay"#)]),
            Campaign::Delayed
        );
        assert_eq!(
            after_refusal(&[error(r#"failed to lock key "k", lock is already held"#)]),
            Campaign::Held
        );
        assert_eq!(
            after_refusal(&[error(r#"failed to check index: key "k" has index 9"#)]),
            Campaign::Held
        );
    }
}
