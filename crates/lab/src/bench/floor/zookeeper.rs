//! The floor client on ZooKeeper: a session, an ephemeral leader znode it owns (gone with
//! the session, so a check of its version is the leadership guard), one listing (the
//! queue znode's children, then each child's data and version, pipelined), then `multi`s
//! of that check, a `setData` at the version read per task marked and a `delete` at the
//! version after it per task done.

use anyhow::bail;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use zookeeper_client as zk;

use super::{marked, timed, Counters, Floor, Listed, BATCH, LEADER_KEY, LEASE_TTL_SECS, PREFIX};

/// Reads of the listing in flight at once.
const LIST_PIPELINE: usize = 1_000;

pub(super) async fn drain(connect: &str) -> anyhow::Result<Floor> {
    let client = zk::Client::connector()
        .with_session_timeout(std::time::Duration::from_secs(LEASE_TTL_SECS))
        .connect(connect)
        .await?;
    let persistent = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
    let ephemeral = zk::CreateMode::Ephemeral.with_acls(zk::Acls::anyone_all());
    let dir = format!("/{LEADER_KEY}");
    match client.create(&dir, b"", &persistent).await {
        Ok(_) | Err(zk::Error::NodeExists) => {}
        Err(err) => return Err(err.into()),
    }
    let leader = format!("{dir}/leader");
    client.create(&leader, b"floor", &ephemeral).await?;
    let drained = timed(run(&client, &leader)).await;
    let _ = client.delete(&leader, None).await;
    drained
}

async fn run(client: &zk::Client, leader: &str) -> anyhow::Result<usize> {
    let dir = format!("/{}", PREFIX.trim_end_matches('/'));
    let (names, _) = client.get_children(&dir).await?;
    let mut tasks = Vec::with_capacity(names.len());
    for chunk in names.chunks(LIST_PIPELINE) {
        let reads: Vec<_> = chunk
            .iter()
            .map(|name| client.get_data(&format!("{dir}/{name}")))
            .collect();
        for (name, read) in chunk.iter().zip(reads) {
            let (value, stat) = read.await?;
            tasks.push(Listed {
                key: format!("{dir}/{name}"),
                version: stat.version,
                marked: marked(&value),
            });
        }
    }
    let mut done: Vec<(String, i32)> = Vec::new();
    let mut drained = 0;
    let mut batches = tasks.chunks(BATCH);
    loop {
        let batch = batches.next().unwrap_or_default();
        if batch.is_empty() && done.is_empty() {
            break;
        }
        let mut multi = client.new_multi_writer();
        // The leader znode is written once, at creation.
        multi.add_check_version(leader, 0)?;
        for task in batch {
            multi.add_set_data(&task.key, &task.marked, Some(task.version))?;
        }
        for (path, version) in &done {
            multi.add_delete(path, Some(*version))?;
        }
        let results = match multi.commit().await {
            Ok(results) => results,
            Err(err) => bail!("the floor client's multi failed: {err}"),
        };
        drained += done.len();
        done = batch
            .iter()
            .zip(results.into_iter().skip(1))
            .map(|(task, result)| match result {
                zk::MultiWriteResult::SetData { stat } => Ok((task.key.clone(), stat.version)),
                other => bail!("the multi answered {other:?} for a setData"),
            })
            .collect::<anyhow::Result<_>>()?;
    }
    Ok(drained)
}

/// Each member's `mntr` (a four-letter word, which the harness's members allow): read
/// and update requests as the members count them, summed.
pub(super) async fn counters(connect: &str) -> Option<Counters> {
    let hosts = connect.split('/').next()?;
    let mut counters = Counters::default();
    for host in hosts.split(',') {
        let mut stream = tokio::net::TcpStream::connect(host).await.ok()?;
        stream.write_all(b"mntr").await.ok()?;
        let mut text = String::new();
        stream.read_to_string(&mut text).await.ok()?;
        for line in text.lines() {
            let mut fields = line.split_whitespace();
            let (Some(name), Some(value)) = (fields.next(), fields.next()) else {
                continue;
            };
            let Ok(value) = value.parse::<f64>() else {
                continue;
            };
            match name {
                "zk_cnt_readlatency" => counters.reads += value,
                "zk_cnt_updatelatency" => counters.writes += value,
                _ => {}
            }
        }
    }
    Some(counters)
}
