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

use crate::coord::consul::client::{
    KvPair, QueryOptions, TxnError, TxnOp, TxnOutcome, MIN_REQUERY,
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

/// The token a held leader key stands for: the higher of its `ModifyIndex` (what the
/// win's write left) and its record's floor.
pub fn token_of(entry: &KvPair) -> FencingToken {
    let floor = HolderRecord::decode(&entry.value).and_then(|record| record.floor);
    FencingToken(entry.modify_index.max(floor.unwrap_or(0)))
}

/// The leadership as the leader key shows it. While the key is held, its token is
/// [`token_of`] it: nothing writes a held key but its holder's win, unless an operator
/// rewrites it, which also ends that leadership (the guard checks the index). A free key's
/// `ModifyIndex` is its release's (or its session's end), no token at all, so a free
/// leadership reports 0 (the next win reads the last record's floor all the same).
pub fn holder_of(entry: Option<KvPair>) -> Holder {
    match entry {
        None => Holder::default(),
        Some(entry) => Holder {
            record: HolderRecord::decode(&entry.value),
            token: if entry.session.is_some() {
                token_of(&entry)
            } else {
                FencingToken(0)
            },
            lease: entry.session.map(LeaseId),
        },
    }
}

/// The floor a win over `entry` (the leader key as read, if any) must write: above the
/// `asked` floor (the campaigning replica's) and above every token the key stood for. A
/// free key's index is its release's, above its holder's win's, so it counts too.
pub fn floor_over(entry: Option<&KvPair>, asked: Option<u64>) -> u64 {
    let last = entry.map_or(0, |entry| token_of(entry).0);
    last.saturating_add(1).max(asked.unwrap_or(0))
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

    /// A win's floor is above the token the key stood for (its index, or its record's
    /// floor if higher, held or free) and never below the floor the replica asked for: a
    /// key whose index started over (a coordinator that lost its data) still yields a
    /// higher token than the record it holds.
    #[test]
    fn a_win_writes_a_floor_above_every_token_the_key_stood_for() {
        let record = |floor: Option<u64>| {
            HolderRecord {
                node: "web-1".into(),
                floor,
                ..HolderRecord::default()
            }
            .encode()
        };
        assert_eq!(floor_over(None, None), 1);
        assert_eq!(floor_over(None, Some(157)), 157);
        let old = entry(None, 40, &record(None));
        assert_eq!(floor_over(Some(&old), None), 41);
        assert_eq!(floor_over(Some(&old), Some(90)), 90);
        let wiped = entry(Some("s2"), 7, &record(Some(157)));
        assert_eq!(token_of(&wiped), FencingToken(157));
        assert_eq!(holder_of(Some(wiped.clone())).token, FencingToken(157));
        assert_eq!(floor_over(Some(&wiped), Some(100)), 158);
        let caught_up = entry(Some("s2"), 400, &record(Some(157)));
        assert_eq!(token_of(&caught_up), FencingToken(400));
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
