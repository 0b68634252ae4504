//! [`Elections`] on Redis: leadership is `SET leader <lease> NX PX <the lease's time left>`
//! in the campaign script, which first checks the lease exists and hands out the token
//! (`scripts.rs`, CAMPAIGN, says how it rises); the holder record keeps `{lease, token,
//! record, version}`; `observe` waits on the changes channel, the leader key's PTTL and a
//! poll (`wait.rs`). Every token seen raises the floor of the next campaign's.

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::layout::{holder_row, number, HolderRow, TOKEN_MAX};
use super::wait::ReadHolder;
use super::{bad_answer, scripts, RedisCoordinator};
use crate::coord::{
    Campaign, CoordError, Elections, FencingToken, Holder, HolderRecord, Leadership, LeaseId,
    Version,
};

impl RedisCoordinator {
    /// Raises the floor of the next token to `token`. A number past [`TOKEN_MAX`] was
    /// never handed out by leaderq (another program's write): it raises nothing.
    pub(super) fn saw_token(&self, token: u64) {
        if token <= TOKEN_MAX {
            self.highest_token.fetch_max(token, Ordering::Relaxed);
        }
    }

    pub(super) async fn read_holder(&self) -> Result<HolderRow, CoordError> {
        let row = holder_row(self.fields(&self.scripts.observe, &[]).await?).map_err(bad_answer)?;
        self.saw_token(row.holder.token.0);
        Ok(row)
    }
}

impl Elections for RedisCoordinator {
    async fn observe(
        &self,
        after: Version,
        wait: Duration,
    ) -> Result<(Holder, Version), CoordError> {
        self.wait_for(after, wait, ReadHolder).await
    }

    async fn campaign(
        &self,
        lease: &LeaseId,
        record: &HolderRecord,
    ) -> Result<Campaign, CoordError> {
        let floor = scripts::campaign_floor(self.highest_token.load(Ordering::Relaxed), record);
        let floor = floor.to_string();
        let record = record.encode();
        let max = TOKEN_MAX.to_string();
        let reply = self
            .write_fields(
                &self.scripts.campaign,
                &[
                    lease.0.as_bytes(),
                    &record,
                    floor.as_bytes(),
                    max.as_bytes(),
                ],
            )
            .await?;
        match reply.as_slice() {
            [won, token] if won.as_slice() == b"won" => {
                let token = number(token).map_err(bad_answer)?;
                self.saw_token(token);
                Ok(Campaign::Won(Leadership {
                    lease: lease.clone(),
                    fencing_token: FencingToken(token),
                }))
            }
            [held] if held.as_slice() == b"held" => Ok(Campaign::Held),
            [gone] if gone.as_slice() == b"gone" => Ok(Campaign::LeaseGone),
            [exhausted, token] if exhausted.as_slice() == b"exhausted" => {
                Err(CoordError::Refused(format!(
                    "the next fencing token would be {}, past {TOKEN_MAX} (2^53 - 1, the largest leaderq hands out): {}fencing/{} holds a number leaderq never wrote; delete that key and restart the replicas",
                    String::from_utf8_lossy(token),
                    self.settings.layout.prefix,
                    self.settings.layout.leader
                )))
            }
            _ => Err(bad_answer("campaign answered out of turn")),
        }
    }

    async fn resign(&self, lease: &LeaseId) -> Result<(), CoordError> {
        self.write::<String>(&self.scripts.resign, &[lease.0.as_bytes()])
            .await
            .map(drop)
    }
}
