//! The floor client on Redis, over the Redis backend's layout (tasks are its hashes, so
//! the bench's enqueue through the seam is what it drains): a lease key and a leader key
//! with a TTL, one listing (the task index's lex range, then each task's value and
//! version, pipelined), then one script per batch that checks the leader key names the
//! live lease and every task's version, then marks and deletes.

use anyhow::{bail, Context};

use super::{marked, timed, Counters, Floor, Listed, BATCH, LEASE_TTL_SECS, PREFIX};

/// ARGV: key prefix, lease id, number of marks, (key, version, marked value) per mark,
/// then (key, version) per delete. Answers the new versions of the marked tasks, or a
/// negative number for a failed check (nothing written).
const BATCH_SCRIPT: &str = r"
local P, id = ARGV[1], ARGV[2]
if redis.call('GET', P .. 'floor/leader') ~= id or redis.call('EXISTS', P .. 'floor/lease') == 0 then
  return -1
end
local marks = tonumber(ARGV[3])
local first_delete = 4 + 3 * marks
for i = 4, first_delete - 1, 3 do
  if redis.call('HGET', P .. 'task/' .. ARGV[i], 'version') ~= ARGV[i + 1] then return -2 end
end
for i = first_delete, #ARGV, 2 do
  if redis.call('HGET', P .. 'task/' .. ARGV[i], 'version') ~= ARGV[i + 1] then return -3 end
end
local out = {}
for i = 4, first_delete - 1, 3 do
  local v = redis.call('INCR', P .. 'version')
  redis.call('HSET', P .. 'task/' .. ARGV[i], 'value', ARGV[i + 2], 'version', v, 'holder', id)
  out[#out + 1] = v
end
for i = first_delete, #ARGV, 2 do
  redis.call('DEL', P .. 'task/' .. ARGV[i])
  redis.call('ZREM', P .. 'tasks', ARGV[i])
end
return out
";

/// Tasks read per pipelined round of the listing.
const LIST_PIPELINE: usize = 1_000;

/// How long one answer may take: the listing's keys, every one in a single answer.
const LIST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

pub(super) async fn drain(url: &str, prefix: &str) -> anyhow::Result<Floor> {
    let client = redis::Client::open(url)?;
    // The listing of a 1M backlog is one answer that takes Redis over a second: past the
    // client's default response timeout (500 ms).
    let patient = redis::AsyncConnectionConfig::new().set_response_timeout(Some(LIST_TIMEOUT));
    let mut connection = client
        .get_multiplexed_async_connection_with_config(&patient)
        .await?;
    let lease = uuid::Uuid::new_v4().to_string();
    let ttl_ms = LEASE_TTL_SECS * 1000;
    let _: () = redis::cmd("SET")
        .arg(format!("{prefix}floor/lease"))
        .arg(&lease)
        .arg("PX")
        .arg(ttl_ms)
        .query_async(&mut connection)
        .await?;
    let won: Option<String> = redis::cmd("SET")
        .arg(format!("{prefix}floor/leader"))
        .arg(&lease)
        .arg("NX")
        .arg("PX")
        .arg(ttl_ms)
        .query_async(&mut connection)
        .await?;
    if won.is_none() {
        bail!("the floor client could not take its leader key");
    }
    let drained = timed(run(&mut connection, prefix, &lease)).await;
    let _: Result<(), _> = redis::cmd("DEL")
        .arg(format!("{prefix}floor/leader"))
        .arg(format!("{prefix}floor/lease"))
        .query_async(&mut connection)
        .await;
    drained
}

async fn run(
    connection: &mut redis::aio::MultiplexedConnection,
    prefix: &str,
    lease: &str,
) -> anyhow::Result<usize> {
    let keys: Vec<String> = redis::cmd("ZRANGEBYLEX")
        .arg(format!("{prefix}tasks"))
        .arg(format!("[{PREFIX}"))
        .arg(format!("({PREFIX}\u{ff}"))
        .query_async(connection)
        .await?;
    let mut tasks = Vec::with_capacity(keys.len());
    for chunk in keys.chunks(LIST_PIPELINE) {
        let mut pipe = redis::pipe();
        for key in chunk {
            pipe.cmd("HMGET")
                .arg(format!("{prefix}task/{key}"))
                .arg("value")
                .arg("version");
        }
        let rows: Vec<(Option<Vec<u8>>, Option<String>)> = pipe.query_async(connection).await?;
        for (key, (value, version)) in chunk.iter().zip(rows) {
            let (Some(value), Some(version)) = (value, version) else {
                continue;
            };
            tasks.push(Listed {
                key: key.clone(),
                version,
                marked: marked(&value),
            });
        }
    }
    let script = redis::Script::new(BATCH_SCRIPT);
    let mut done: Vec<(String, String)> = Vec::new();
    let mut drained = 0;
    let mut batches = tasks.chunks(BATCH);
    loop {
        let batch = batches.next().unwrap_or_default();
        if batch.is_empty() && done.is_empty() {
            break;
        }
        let mut call = script.prepare_invoke();
        call.arg(prefix).arg(lease).arg(batch.len());
        for task in batch {
            call.arg(&task.key).arg(&task.version).arg(&task.marked);
        }
        for (key, version) in &done {
            call.arg(key).arg(version);
        }
        let answer: redis::Value = call.invoke_async(connection).await?;
        let versions: Vec<i64> = match answer {
            redis::Value::Array(items) => items
                .into_iter()
                .map(|item| match item {
                    redis::Value::Int(v) => Ok(v),
                    other => bail!("the floor script answered {other:?}"),
                })
                .collect::<anyhow::Result<_>>()?,
            redis::Value::Int(code) => bail!("the floor script's check {code} failed"),
            other => bail!("the floor script answered {other:?}"),
        };
        drained += done.len();
        done = batch
            .iter()
            .zip(versions)
            .map(|(task, version)| (task.key.clone(), version.to_string()))
            .collect();
        if done.len() != batch.len() {
            return Err(anyhow::anyhow!(
                "the floor script answered too few versions"
            ))
            .context("draining");
        }
    }
    Ok(drained)
}

/// Commands that write; every other command counted is a read, except these, which are
/// neither: the scripts themselves (their commands are counted one by one), the bench's
/// own INFO and connection chatter.
const WRITES: &[&str] = &[
    "set", "del", "unlink", "hset", "hsetnx", "hdel", "zadd", "zrem", "incr", "incrby", "pexpire",
    "expire", "publish", "setnx", "psetex", "getdel", "hincrby",
];
const NEITHER: &[&str] = &[
    "evalsha",
    "eval",
    "script",
    "info",
    "ping",
    "client",
    "hello",
    "select",
    "subscribe",
    "unsubscribe",
    "config",
    "command",
];

/// Redis's INFO commandstats (calls by command) and CPU.
pub(super) async fn counters(url: &str) -> Option<Counters> {
    let client = redis::Client::open(url).ok()?;
    let mut connection = client.get_multiplexed_async_connection().await.ok()?;
    let text: String = redis::cmd("INFO")
        .arg("commandstats")
        .arg("cpu")
        .query_async(&mut connection)
        .await
        .ok()?;
    let mut counters = Counters {
        cpu_seconds: Some(0.0),
        ..Counters::default()
    };
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("cmdstat_") {
            let (command, stats) = rest.split_once(':')?;
            let calls: f64 = stats
                .split(',')
                .find_map(|field| field.strip_prefix("calls="))?
                .parse()
                .ok()?;
            let command = command.split('|').next().unwrap_or(command);
            if WRITES.contains(&command) {
                counters.writes += calls;
            } else if !NEITHER.contains(&command) {
                counters.reads += calls;
            }
        } else if let Some(cpu) = line
            .strip_prefix("used_cpu_sys:")
            .or_else(|| line.strip_prefix("used_cpu_user:"))
        {
            let cpu: f64 = cpu.trim().parse().ok()?;
            counters.cpu_seconds = counters.cpu_seconds.map(|c| c + cpu);
        }
    }
    Some(counters)
}
