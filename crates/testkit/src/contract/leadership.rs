//! The contract's checks of leases and leadership: one leader, rising tokens (also past an
//! operator's deletion of the leader record, and up to the floor a win's record asks for),
//! lock-delay, taking up a previous lease, keep-alives of ended leases.

use std::time::Duration;

use tokio::time::Instant;

use super::support::*;
use super::Subject;
use leaderq::coord::{Campaign, HolderRecord, Leadership, Renewal, TaskOp, Version, Written};

/// Of several leases campaigning at once, exactly one wins; the others hear `Held`, and
/// the holder observed is the winner, with its record and token.
pub async fn one_leader_among_concurrent_campaigners(s: Subject) -> Result<(), String> {
    const CAMPAIGNERS: usize = 5;
    let mut leases = Vec::new();
    for n in 0..CAMPAIGNERS {
        leases.push(open(&s, &format!("node-{n}"), Duration::ZERO).await?);
    }
    let _renewers: Vec<Renewer> = leases.iter().map(|l| Renewer::start(&s, l)).collect();
    let mut runs = Vec::new();
    for (n, lease) in leases.iter().enumerate() {
        let coord = s.coord.clone();
        let lease = lease.clone();
        runs.push(tokio::spawn(async move {
            coord.campaign(&lease, &record(&format!("node-{n}"))).await
        }));
    }
    let mut winners = Vec::new();
    for (n, run) in runs.into_iter().enumerate() {
        match run
            .await
            .map_err(|err| format!("campaign panicked: {err}"))?
        {
            Ok(Campaign::Won(leadership)) => winners.push((n, leadership)),
            Ok(Campaign::Held) => {}
            other => return Err(format!("a losing campaign answered {other:?}, not Held")),
        }
    }
    let [(n, leadership)] = winners.as_slice() else {
        return Err(format!("{} campaigns won, not one", winners.len()));
    };
    let (holder, _) = s
        .coord
        .observe(Version(0), Duration::ZERO)
        .await
        .ctx("observe")?;
    ensure(holder.lease.as_ref() == Some(&leadership.lease), || {
        format!("the holder observed is {holder:?}, not the winner {leadership:?}")
    })?;
    ensure(
        holder.record.as_ref().map(|r| r.node.as_str()) == Some(format!("node-{n}").as_str()),
        || {
            format!(
                "the holder's record is {:?}, not the winner's",
                holder.record
            )
        },
    )?;
    ensure(holder.token == leadership.fencing_token, || {
        format!(
            "the holder's token is {}, the winner's {}",
            holder.token, leadership.fencing_token
        )
    })
}

/// Every new leadership gets a token above all before it: after a resignation, a
/// revocation, a re-campaign by the holder, a restart (that took its lease up again, or
/// on a backend without lease reuse opened a new one while the old one still led), and
/// the expiry of a lease not kept alive.
pub async fn fencing_rises_across_leaders(s: Subject) -> Result<(), String> {
    let a = open(&s, "node-a", Duration::ZERO).await?;
    let b = open(&s, "node-b", Duration::ZERO).await?;
    let _renew_a = Renewer::start(&s, &a);
    let _renew_b = Renewer::start(&s, &b);
    let mut tokens = Vec::new();

    let first = lead(&s, &a, "node-a").await?;
    tokens.push(("first", first.fencing_token));
    let again = lead(&s, &a, "node-a").await?;
    tokens.push(("a re-campaign by the holder", again.fencing_token));
    s.coord.resign(&again.lease).await.ctx("resign")?;
    let by_b = lead(&s, &b, "node-b").await?;
    tokens.push(("after a resignation", by_b.fencing_token));
    s.coord.revoke(&b).await.ctx("revoke")?;
    let by_a = lead(&s, &a, "node-a").await?;
    tokens.push(("after a revocation", by_a.fencing_token));

    let grant = s
        .coord
        .open_lease(&spec(&s, "node-a", Duration::ZERO, Some(a.clone())))
        .await
        .ctx("open_lease with the previous lease")?;
    ensure(grant.reused == s.timing.lease_reuse, || {
        format!(
            "a live lease of the same node, with lease_reuse {}: {grant:?}",
            s.timing.lease_reuse
        )
    })?;
    ensure(!grant.reused || grant.lease == a, || {
        format!("a lease taken up is another one: {grant:?}")
    })?;
    let _renew_restarted = Renewer::start(&s, &grant.lease);
    let restarted = lead(&s, &grant.lease, "node-a").await?;
    tokens.push(("after a restart on the same lease", restarted.fencing_token));
    let (holder, _) = s
        .coord
        .observe(Version(0), Duration::ZERO)
        .await
        .ctx("observe")?;
    ensure(holder.token == restarted.fencing_token, || {
        format!(
            "the holder's token is {}, the leader's {}",
            holder.token, restarted.fencing_token
        )
    })?;
    s.coord.revoke(&grant.lease).await.ctx("revoke")?;
    s.coord.revoke(&a).await.ctx("revoke")?;

    let e = open(&s, "node-e", Duration::ZERO).await?;
    let by_e = lead(&s, &e, "node-e").await?;
    tokens.push(("a lease left to expire", by_e.fencing_token));
    wait_until_not_held_by(&s, &e).await?;
    let f = open(&s, "node-f", Duration::ZERO).await?;
    let by_f = lead(&s, &f, "node-f").await?;
    tokens.push(("after an expiry", by_f.fencing_token));

    for pair in tokens.windows(2) {
        let ((_, before), (when, after)) = (pair[0], pair[1]);
        ensure(after > before, || {
            format!("the token {when} is {after}, not above {before}: tokens {tokens:?}")
        })?;
    }
    Ok(())
}

/// An operator deletes the leader record under its holder (Consul's leader key, etcd's
/// campaign key, ZooKeeper's latch, Redis's leader key): the holder's writes answer
/// `NotLeader` and change nothing, and every later leader's token is above the deleted
/// one's, also after a record deleted while nobody held it. Consul restarts `LockIndex` at
/// 1 on a key created anew, so it cannot be the token alone.
pub async fn the_token_rises_after_an_operator_deletes_the_leader_record(
    s: Subject,
) -> Result<(), String> {
    let a = open(&s, "node-a", Duration::ZERO).await?;
    let b = open(&s, "node-b", Duration::ZERO).await?;
    let _renew_a = Renewer::start(&s, &a);
    let _renew_b = Renewer::start(&s, &b);
    let key = put(&s, "t1", b"{}").await?;
    let task = get_one(&s, &key).await?;
    let mut tokens = Vec::new();

    let first = lead(&s, &a, "node-a").await?;
    tokens.push(("first", first.fencing_token));
    s.producer
        .delete_leader_record()
        .await
        .ctx("delete_leader_record")?;
    let written = s
        .coord
        .write(&first, &[claim(&key, task.version, b"{\"by\":\"a\"}")])
        .await
        .ctx("write")?;
    ensure(written == Written::NotLeader, || {
        format!("the holder wrote {written:?} after its leader record was deleted")
    })?;
    let after = get_one(&s, &key).await?;
    ensure(after == task, || {
        format!("a deposed holder's write changed {task:?} into {after:?}")
    })?;

    let by_b = lead(&s, &b, "node-b")
        .await
        .map_err(|why| format!("after the leader record was deleted: {why}"))?;
    tokens.push(("after the record was deleted", by_b.fencing_token));
    let claim_by_b = claim(&key, task.version, b"{\"by\":\"b\"}");
    holds_and_writes_under(&s, &by_b, claim_by_b, "the new leader").await?;

    s.coord.resign(&b).await.ctx("resign")?;
    s.producer
        .delete_leader_record()
        .await
        .ctx("delete_leader_record")?;
    let by_a = lead(&s, &a, "node-a")
        .await
        .map_err(|why| format!("after a free leader record was deleted: {why}"))?;
    tokens.push(("after a free record was deleted", by_a.fencing_token));

    for pair in tokens.windows(2) {
        let ((_, before), (when, after)) = (pair[0], pair[1]);
        ensure(after > before, || {
            format!("the token {when} is {after}, not above {before}: tokens {tokens:?}")
        })?;
    }
    Ok(())
}

/// Observers see `leadership` hold leadership under its token, and `op` written under it
/// commits under that same token (`who` names the leader in a failure).
async fn holds_and_writes_under(
    s: &Subject,
    leadership: &Leadership,
    op: TaskOp,
    who: &str,
) -> Result<(), String> {
    let (holder, _) = s
        .coord
        .observe(Version(0), Duration::ZERO)
        .await
        .ctx("observe")?;
    ensure(
        holder.lease.as_ref() == Some(&leadership.lease)
            && holder.token == leadership.fencing_token,
        || format!("the holder observed is {holder:?}, the leader {leadership:?}"),
    )?;
    let written = s.coord.write(leadership, &[op]).await.ctx("write")?;
    ensure(
        matches!(&written, Written::Done { fencing_token, .. } if *fencing_token == leadership.fencing_token),
        || format!("{who}'s claim answered {written:?}, under {leadership:?}"),
    )
}

/// A win whose record asks for a floor (a replica remembers a token above any the
/// coordinator shows, as after the coordinator lost its data) is handed a token at or above
/// it; observers read that same token, the leader's writes pass the guard under it (the
/// guard checks what the coordinator holds, not the token), and the next win, whose record
/// asks for no floor, is above it all the same: the coordinator keeps it with the record.
pub async fn a_win_is_handed_at_least_the_floor_its_record_asks(s: Subject) -> Result<(), String> {
    /// Far above any token the coordinator hands out by itself during the check.
    const AHEAD: u64 = 1_000_000;
    let a = open(&s, "node-a", Duration::ZERO).await?;
    let b = open(&s, "node-b", Duration::ZERO).await?;
    let _renew_a = Renewer::start(&s, &a);
    let _renew_b = Renewer::start(&s, &b);
    let first = lead(&s, &a, "node-a").await?;
    s.coord.resign(&a).await.ctx("resign")?;
    let floor = first.fencing_token.0 + AHEAD;
    let asked = HolderRecord {
        floor: Some(floor),
        ..record("node-a")
    };
    let floored = match s.coord.campaign(&a, &asked).await.ctx("campaign")? {
        Campaign::Won(leadership) => leadership,
        other => return Err(format!("a campaign with a floor heard {other:?}")),
    };
    ensure(floored.fencing_token.0 >= floor, || {
        format!(
            "a win asked for a floor of {floor} and was handed {}",
            floored.fencing_token
        )
    })?;
    let key = put(&s, "t1", b"{}").await?;
    let task = get_one(&s, &key).await?;
    let claim_by_a = claim(&key, task.version, b"{\"by\":\"a\"}");
    holds_and_writes_under(&s, &floored, claim_by_a, "a leader with a floored token").await?;
    s.coord.resign(&a).await.ctx("resign")?;

    let next = lead(&s, &b, "node-b").await?;
    ensure(next.fencing_token > floored.fencing_token, || {
        format!(
            "the win after a floored one was handed {}, not above {}",
            next.fencing_token, floored.fencing_token
        )
    })?;
    let key = put(&s, "t2", b"{}").await?;
    let task = get_one(&s, &key).await?;
    let written = s
        .coord
        .write(&next, &[claim(&key, task.version, b"{\"by\":\"b\"}")])
        .await
        .ctx("write")?;
    ensure(matches!(written, Written::Done { .. }), || {
        format!("a claim under the next leadership answered {written:?}, under {next:?}")
    })
}

/// A lease that dies holding leadership keeps it from being taken for its lock-delay
/// (`Delayed`, then `Won`); a resignation frees it at once.
pub async fn takeover_delay_follows_a_death_not_a_resignation(s: Subject) -> Result<(), String> {
    let delay = s.timing.ttl;
    let a = open(&s, "node-a", delay).await?;
    let b = open(&s, "node-b", delay).await?;
    let _renew_a = Renewer::start(&s, &a);
    let _renew_b = Renewer::start(&s, &b);
    let by_a = lead(&s, &a, "node-a").await?;
    s.coord.resign(&by_a.lease).await.ctx("resign")?;
    lead(&s, &b, "node-b")
        .await
        .map_err(|why| format!("after a resignation: {why}"))?;

    s.coord.revoke(&b).await.ctx("revoke")?;
    let revoked = Instant::now();
    if !s.timing.takeover_delay {
        return lead(&s, &a, "node-a")
            .await
            .map(drop)
            .map_err(|why| format!("after the holder's lease was revoked: {why}"));
    }
    match s
        .coord
        .campaign(&a, &record("node-a"))
        .await
        .ctx("campaign")?
    {
        Campaign::Delayed => {}
        other => {
            return Err(format!(
            "a campaign right after the holder's lease was revoked answered {other:?}, not Delayed"
        ))
        }
    }
    loop {
        match s.coord.campaign(&a, &record("node-a")).await.ctx("campaign")? {
            Campaign::Won(_) => break,
            Campaign::Delayed if revoked.elapsed() < delay + s.timing.expiry => {
                tokio::time::sleep(delay / 4).await;
            }
            other => {
                return Err(format!(
                    "{:?} after the revocation a campaign answered {other:?}, with a lock-delay of {delay:?}",
                    revoked.elapsed()
                ))
            }
        }
    }
    ensure(revoked.elapsed() >= delay / 2, || {
        format!(
            "the lock-delay of {delay:?} ended after {:?}",
            revoked.elapsed()
        )
    })
}

/// `open_lease` takes up the previous lease only if it is alive and this node's own (on a
/// backend with lease reuse; without, never); a campaign with an ended lease answers
/// `LeaseGone`.
pub async fn previous_lease_is_taken_up_only_if_alive_and_own(s: Subject) -> Result<(), String> {
    let a = open(&s, "node-a", Duration::ZERO).await?;
    let _renew_a = Renewer::start(&s, &a);
    let other = s
        .coord
        .open_lease(&spec(&s, "node-b", Duration::ZERO, Some(a.clone())))
        .await
        .ctx("open_lease")?;
    ensure(!other.reused && other.lease != a, || {
        format!("another node took up node-a's lease: {other:?}")
    })?;
    let own = s
        .coord
        .open_lease(&spec(&s, "node-a", Duration::ZERO, Some(a.clone())))
        .await
        .ctx("open_lease")?;
    if s.timing.lease_reuse {
        ensure(own.reused && own.lease == a, || {
            format!("node-a did not take up its own live lease: {own:?}")
        })?;
    } else {
        ensure(!own.reused && own.lease != a, || {
            format!("a backend without lease reuse took a lease up: {own:?}")
        })?;
    }
    s.coord.revoke(&a).await.ctx("revoke")?;
    let after = s
        .coord
        .open_lease(&spec(&s, "node-a", Duration::ZERO, Some(a.clone())))
        .await
        .ctx("open_lease")?;
    ensure(!after.reused && after.lease != a, || {
        format!("a revoked lease was taken up: {after:?}")
    })?;
    match s
        .coord
        .campaign(&a, &record("node-a"))
        .await
        .ctx("campaign")?
    {
        Campaign::LeaseGone => Ok(()),
        other => Err(format!(
            "a campaign with a revoked lease answered {other:?}, not LeaseGone"
        )),
    }
}

/// A keep-alive of a revoked lease, or of one left to expire, answers `Gone`; a lease
/// kept alive lives on well past its TTL.
pub async fn keep_alive_of_an_ended_lease_is_gone(s: Subject) -> Result<(), String> {
    let a = open(&s, "node-a", Duration::ZERO).await?;
    let kept = open(&s, "node-k", Duration::ZERO).await?;
    let renewer = Renewer::start(&s, &kept);
    s.coord.revoke(&a).await.ctx("revoke")?;
    let renewal = s.coord.keep_alive(&a).await.ctx("keep_alive")?;
    ensure(renewal == Renewal::Gone, || {
        format!("a keep-alive of a revoked lease answered {renewal:?}")
    })?;

    let e = open(&s, "node-e", Duration::ZERO).await?;
    let started = Instant::now();
    lead(&s, &e, "node-e").await?;
    tokio::time::sleep(s.timing.ttl / 2).await;
    let (holder, _) = s
        .coord
        .observe(Version(0), Duration::ZERO)
        .await
        .ctx("observe")?;
    ensure(
        holder.lease.as_ref() == Some(&e) || started.elapsed() >= s.timing.ttl,
        || {
            format!(
                "a lease lost leadership {:?} after its last keep-alive, within its TTL {:?}",
                started.elapsed(),
                s.timing.ttl
            )
        },
    )?;
    wait_until_not_held_by(&s, &e).await?;
    let renewal = s.coord.keep_alive(&e).await.ctx("keep_alive")?;
    ensure(renewal == Renewal::Gone, || {
        format!("a keep-alive of an expired lease answered {renewal:?}")
    })?;
    drop(renewer);
    let renewal = s.coord.keep_alive(&kept).await.ctx("keep_alive")?;
    ensure(renewal == Renewal::Alive, || {
        format!(
            "a lease kept alive through {:?} answered {renewal:?}",
            started.elapsed()
        )
    })
}
