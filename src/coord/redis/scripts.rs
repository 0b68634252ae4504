//! The Redis coordinator's Lua scripts, the arguments they take, and how they are called.
//! Each call that changes anything is one script, so Redis runs it whole with nothing in
//! between: the check of the lease, the leader record and every task's version, then the
//! writes, all or nothing. Renewal and release only go through scripts that check the lease
//! is still there (never a bare PEXPIRE or DEL). The key layout is `layout.rs`'s.
//!
//! Every script (but [`PRODUCE`]) starts with [`PRELUDE`]: `ARGV[1]` is the key prefix,
//! `ARGV[2]` the leader name, the rest (`A`) the script's own. The scripts name their keys
//! in `ARGV` rather than `KEYS` (task keys are only known inside the script), so they need
//! one Redis (with replicas if wanted), not Redis Cluster.
//!
//! The arguments of the queue's scripts and the reading of their answers are `plan.rs`'s.

use crate::coord::{CoordError, HolderRecord};

use super::layout::{Layout, TOKEN_MAX};
use super::unavailable;

const PRELUDE: &str = r#"
local P, L = ARGV[1], ARGV[2]
local A = {}
for i = 3, #ARGV do A[i - 2] = ARGV[i] end
local function bump()
  local v = redis.call('INCR', P .. 'version')
  redis.call('PUBLISH', P .. 'changes', v)
  return v
end
local function alive(lease)
  return lease ~= '' and redis.call('EXISTS', P .. 'lease/' .. lease) == 1
end
local function resign(lease)
  local key = P .. 'leader/' .. L
  if redis.call('GET', key) == lease then
    redis.call('DEL', key)
    redis.call('HSET', P .. 'holder/' .. L, 'version', bump())
  end
end
"#;

/// `A = [previous or '', node, ttl_ms, new_id]`: takes up `previous` if it is this node's
/// and has the same TTL; ends it if it is this node's with another TTL; else opens `new_id`.
/// Answers `[reused|opened, id]`.
const OPEN: &str = r#"
local previous, node, ttl, new = A[1], A[2], A[3], A[4]
if previous ~= '' then
  local key = P .. 'lease/' .. previous
  local f = redis.call('HMGET', key, 'node', 'ttl')
  if f[1] == node then
    if f[2] == ttl then
      redis.call('PEXPIRE', key, ttl)
      local leader = P .. 'leader/' .. L
      if redis.call('GET', leader) == previous then redis.call('PEXPIRE', leader, ttl) end
      return {'reused', previous}
    end
    resign(previous)
    redis.call('DEL', key)
    bump()
  end
end
local key = P .. 'lease/' .. new
redis.call('HSET', key, 'node', node, 'ttl', ttl)
redis.call('PEXPIRE', key, ttl)
return {'opened', new}
"#;

/// `A = [lease]`: renews the lease, and the leader key with it if it holds it.
const KEEP_ALIVE: &str = r#"
local key = P .. 'lease/' .. A[1]
local ttl = redis.call('HGET', key, 'ttl')
if not ttl then return 'gone' end
redis.call('PEXPIRE', key, ttl)
local leader = P .. 'leader/' .. L
if redis.call('GET', leader) == A[1] then redis.call('PEXPIRE', leader, ttl) end
return 'alive'
"#;

/// `A = [lease]`: gives leadership up if held, and ends the lease.
const REVOKE: &str = r#"
resign(A[1])
if redis.call('DEL', P .. 'lease/' .. A[1]) == 1 then bump() end
return 'ok'
"#;

/// `A = [lease]`: gives leadership up if the lease holds it.
const RESIGN: &str = r#"
resign(A[1])
return 'ok'
"#;

/// `A = [lease, record, floor, max]`: `SET leader <lease> NX PX <the lease's PTTL>` if the
/// lease lives and the key is free (or already its own: taken anew), with a new token and
/// the holder's record. Answers `[won, token]`, `[held]`, `[gone]`, or `[exhausted, token]`
/// (writing nothing) when the token would pass `max`.
///
/// The token is the highest of: the last one stored plus one (tokens rise while Redis
/// keeps its data); Redis's clock in milliseconds (`TIME`; tokens issued after the counter
/// was lost, by a restart without persistence, an eviction or an operator's `DEL` or
/// `FLUSHALL`, are above every earlier one unless Redis's clock went back by more than the
/// time between the two wins); and `floor` plus one, the highest token the campaigner has
/// seen (covers a clock that went back, for replicas that saw the earlier token, before
/// their own restart too: [`campaign_floor`]). Redis 7
/// replicates a script by its effects, so `TIME` may precede writes and a replica of Redis
/// stores the token computed here. Milliseconds keep tokens under 10^14 (until the year
/// 5138), which Lua's `tostring` still writes exactly: the previous release's script
/// answered `tostring(INCR …)`, so its replicas keep reading tokens during a rolling
/// upgrade. Lua numbers are doubles, exact up to `max` (2^53 - 1); written with `%d`.
///
/// A leader key naming a lease that is gone (its key deleted by hand: a revoke) is free:
/// its holder lost leadership with its lease, and its guarded writes already fail.
const CAMPAIGN: &str = r#"
local lease, record = A[1], A[2]
local floor, max = tonumber(A[3]) or 0, tonumber(A[4])
local left = redis.call('PTTL', P .. 'lease/' .. lease)
if left <= 0 then return {'gone'} end
local key = P .. 'leader/' .. L
local current = redis.call('GET', key)
if current and current ~= lease and alive(current) then return {'held'} end
local counter = P .. 'fencing/' .. L
local now = redis.call('TIME')
local token = math.max((tonumber(redis.call('GET', counter) or '0') or 0) + 1,
  tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000), floor + 1)
if token > max then return {'exhausted', string.format('%.0f', token)} end
token = string.format('%d', token)
redis.call('SET', counter, token)
if current then
  redis.call('SET', key, lease, 'XX', 'PX', left)
else
  redis.call('SET', key, lease, 'NX', 'PX', left)
end
redis.call('HSET', P .. 'holder/' .. L, 'lease', lease, 'token', token, 'record', record,
  'version', bump())
return {'won', token}
"#;

/// `A = []`: `[leader, leader_pttl, lease, token, record, version]`; `leader` is empty
/// when the leader key's lease is gone (as `CAMPAIGN` sees it), so its holder's watch sees
/// a revoke at once.
const OBSERVE: &str = r#"
local key = P .. 'leader/' .. L
local leader = redis.call('GET', key) or ''
if not alive(leader) then leader = '' end
local left = redis.call('PTTL', key)
local h = redis.call('HMGET', P .. 'holder/' .. L, 'lease', 'token', 'record', 'version')
return {leader, tostring(left), h[1] or '', h[2] or '0', h[3] or '', h[4] or '0'}
"#;

/// One step of a rebuild of the task index (`index.rs`), by `A[1]`:
/// - `start` (`A = [start, run]`): the mark in, at `run` (a number above 0 of this rebuild
///   alone): a rebuild runs (a deletion of the index takes it away);
/// - `scan` (`A = [scan, cursor, pattern, count]`): one `SCAN` step over the task hashes,
///   adding to the index each key it lacks (one `ZMSCORE` for those it has), a change when
///   any was missing; answers `[next cursor, keys added]`;
/// - `done` (`A = [done, run]`): the mark to 0, the index whole, only if it is still at
///   `run`: an index deleted during the rebuild (even if another rebuild has begun since),
///   or a rebuild cut short, leaves it missing or above 0, and the next read rebuilds again.
const REINDEX: &str = r#"
local index = P .. 'tasks'
if A[1] == 'start' then
  redis.call('ZADD', index, A[2], '')
  return {'0', 0}
elseif A[1] == 'done' then
  if redis.call('ZSCORE', index, '') == A[2] then redis.call('ZADD', index, 0, '') end
  return {'0', 0}
end
local found = redis.call('SCAN', A[2], 'MATCH', A[3], 'COUNT', A[4])
local hashes = P .. 'task/'
local keys = {}
for _, hash in ipairs(found[2]) do
  if string.sub(hash, 1, #hashes) == hashes then keys[#keys + 1] = string.sub(hash, #hashes + 1) end
end
local added = 0
if #keys > 0 then
  local scores = redis.call('ZMSCORE', index, unpack(keys))
  for i, key in ipairs(keys) do
    if not scores[i] and key ~= '' then
      redis.call('ZADD', index, 0, key)
      added = added + 1
    end
  end
end
if added > 0 then bump() end
return {found[1], added}
"#;

/// `A = [guarded|own, lease, token, scope, (kind, key, counter, gone, value, to)*]`, `scope`
/// the prefix common to every key written (published: readers of other prefixes sleep on). Guarded:
/// the leader key and the holder's record must name `lease` and `token`. Own: every task
/// written must be held by `lease`, alive. Each op sees the ops before it. Answers
/// `[notleader]`, `[conflict, keys…]` or `[done, token, counter, claimed or released keys…]`.
const WRITE: &str = r#"
local mode, lease, token = A[1], A[2], A[3]
local hkey = P .. 'holder/' .. L
local current = redis.call('HGET', hkey, 'token') or '0'
if mode == 'guarded' then
  if redis.call('GET', P .. 'leader/' .. L) ~= lease or redis.call('HGET', hkey, 'lease') ~= lease
    or current ~= token then
    return {'notleader'}
  end
end
local next = string.format('%d', tonumber(redis.call('GET', P .. 'version') or '0') + 1)
local staged, order, failed, versions = {}, {}, {}, {}
local function load(key)
  local s = staged[key]
  if s ~= nil then return s end
  -- Not the value: every write stages a value of its own, so reading it would only copy
  -- (and intern) bytes the script never looks at.
  local f = redis.call('HMGET', P .. 'task/' .. key, 'version', 'created', 'holder')
  if not f[1] then return false end
  return {version = f[1], created = f[2] or f[1], holder = f[3] or ''}
end
local function stage(key, task)
  if staged[key] == nil then order[#order + 1] = key end
  staged[key] = task
end
local function fail(key)
  for _, k in ipairs(failed) do if k == key then return end end
  failed[#failed + 1] = key
end
-- Whether a holder's lease lives, asked once per lease and script: a batch's tasks are
-- mostly held by one lease, and nothing in the script ends one.
local living = {}
local function lives(holder)
  local l = living[holder]
  if l == nil then l = alive(holder); living[holder] = l end
  return l
end
local i = 5
while i <= #A do
  local kind, key, version, gone, value, to = A[i], A[i + 1], A[i + 2], A[i + 3], A[i + 4], A[i + 5]
  i = i + 6
  local task = load(key)
  local held_alive = task and lives(task.holder)
  local orphan = task and task.holder ~= '' and not held_alive
  if kind == 'create' then
    if task or mode == 'own' then fail(key) else
      stage(key, {value = value, version = next, created = next, holder = '', new = true})
    end
  elseif not task or task.version ~= version or (orphan and '1' or '0') ~= gone then
    fail(key)
  else
    local own = held_alive and task.holder == lease
    local held = held_alive and task.holder ~= ''
    if mode == 'own' and not own then
      fail(key)
    elseif kind == 'claim' then
      if held and not own then fail(key) else
        stage(key, {value = value, version = next, created = task.created, holder = lease,
          new = task.new})
        versions[#versions + 1] = key
      end
    elseif kind == 'complete' then
      stage(key, false)
    elseif kind == 'release' then
      if not own then fail(key) else
        stage(key, {value = value, version = next, created = task.created, holder = '',
          new = task.new})
        versions[#versions + 1] = key
      end
    elseif kind == 'rewrite' then
      if held then fail(key) else
        stage(key, {value = value, version = next, created = task.created, holder = '',
          new = task.new})
      end
    elseif kind == 'move' then
      stage(key, false)
      local target = load(to)
      stage(to, {value = value, version = next, created = target and target.created or next,
        holder = target and target.holder or '', new = not target or target.new})
    else
      return redis.error_reply('leaderq: unknown op ' .. kind)
    end
  end
end
if #failed > 0 then
  local out = {'conflict'}
  for _, key in ipairs(failed) do out[#out + 1] = key end
  return out
end
if #order > 0 then
  redis.call('SET', P .. 'version', next)
  for _, key in ipairs(order) do
    local task = staged[key]
    if task then
      redis.call('HSET', P .. 'task/' .. key, 'value', task.value, 'version', task.version,
        'created', task.created, 'holder', task.holder)
      -- A task read from Redis is in the index already (every write keeps the two
      -- together): only a new key is added.
      if task.new then redis.call('ZADD', P .. 'tasks', 0, key) end
    else
      redis.call('DEL', P .. 'task/' .. key)
      redis.call('ZREM', P .. 'tasks', key)
    end
  end
  redis.call('PUBLISH', P .. 'changes', 'tasks:' .. A[4])
end
local out = {'done', current, next}
for _, key in ipairs(versions) do out[#out + 1] = key end
return out
"#;

/// `A = [(create|delete|put|replace, key, counter, gone, value)*]`: create-only writes,
/// deletes and replaces (with no claim) at a version, and puts of whatever is there, all or
/// nothing. Answers `[done]` or `[conflict, keys…]`.
const EDIT: &str = r#"
local next = string.format('%d', tonumber(redis.call('GET', P .. 'version') or '0') + 1)
local staged, failed = {}, {}
local function fail(key)
  for _, k in ipairs(failed) do if k == key then return end end
  failed[#failed + 1] = key
end
local i = 1
while i <= #A do
  local kind, key, version, gone = A[i], A[i + 1], A[i + 2], A[i + 3]
  i = i + 5
  local f = redis.call('HMGET', P .. 'task/' .. key, 'version', 'holder')
  local exists = f[1] ~= false
  if staged[key] ~= nil then exists = staged[key] end
  if kind == 'create' then
    if exists then fail(key) else staged[key] = true end
  elseif kind == 'put' then
    staged[key] = true
  else
    local holder = f[2] or ''
    local orphan = holder ~= '' and not alive(holder)
    if not exists or staged[key] ~= nil or f[1] ~= version or (orphan and '1' or '0') ~= gone then
      fail(key)
    else
      staged[key] = kind == 'replace'
    end
  end
end
if #failed > 0 then
  local out = {'conflict'}
  for _, key in ipairs(failed) do out[#out + 1] = key end
  return out
end
if #A == 0 then return {'done'} end
redis.call('SET', P .. 'version', next)
i = 1
while i <= #A do
  local kind, key, value = A[i], A[i + 1], A[i + 4]
  i = i + 5
  if kind == 'create' then
    redis.call('HSET', P .. 'task/' .. key, 'value', value, 'version', next, 'created', next,
      'holder', '')
    redis.call('ZADD', P .. 'tasks', 0, key)
  elseif kind == 'put' or kind == 'replace' then
    local created = redis.call('HGET', P .. 'task/' .. key, 'created') or next
    redis.call('HSET', P .. 'task/' .. key, 'value', value, 'version', next, 'created', created,
      'holder', '')
    redis.call('ZADD', P .. 'tasks', 0, key)
  else
    redis.call('DEL', P .. 'task/' .. key)
    redis.call('ZREM', P .. 'tasks', key)
  end
end
redis.call('PUBLISH', P .. 'changes', next)
return {'done'}
"#;

/// The producers' write, on one line so it can be pasted after `redis-cli EVAL`:
/// `ARGV = [key prefix, task key, JSON]`. Creates the task or replaces its value (keeping
/// its place in the creation order and any claim on it), and wakes the leader.
pub const PRODUCE: &str = "local p,k=ARGV[1],ARGV[2] local v=redis.call('INCR',p..'version') local t=p..'task/'..k redis.call('HSETNX',t,'created',v) redis.call('HSET',t,'value',ARGV[3],'version',v) redis.call('ZADD',p..'tasks',0,k) redis.call('PUBLISH',p..'changes',v) return v";

/// The scripts, compiled once per coordinator (`redis::Script` sends EVALSHA and loads
/// the script again after a Redis restart emptied its cache).
pub struct Scripts {
    pub open: redis::Script,
    /// The keep-alive's text, sent whole each time (`RedisCoordinator::write_text`).
    pub keep_alive: String,
    pub revoke: redis::Script,
    pub resign: redis::Script,
    pub campaign: redis::Script,
    pub observe: redis::Script,
    pub reindex: redis::Script,
    pub write: redis::Script,
    pub edit: redis::Script,
}

impl Scripts {
    pub fn new() -> Scripts {
        let with_prelude = |body: &str| redis::Script::new(&format!("{PRELUDE}{body}"));
        Scripts {
            open: with_prelude(OPEN),
            keep_alive: format!("{PRELUDE}{KEEP_ALIVE}"),
            revoke: with_prelude(REVOKE),
            resign: with_prelude(RESIGN),
            campaign: with_prelude(CAMPAIGN),
            observe: with_prelude(OBSERVE),
            reindex: with_prelude(REINDEX),
            write: with_prelude(WRITE),
            edit: with_prelude(EDIT),
        }
    }
}

/// Runs `script` on `connection` with `layout`'s prefix and leader name, then `args`.
pub async fn invoke<T: redis::FromRedisValue>(
    connection: &mut (impl redis::aio::ConnectionLike + Send),
    layout: &Layout,
    script: &redis::Script,
    args: &[&[u8]],
) -> Result<T, CoordError> {
    let mut invocation = script.prepare_invoke();
    invocation
        .arg(layout.prefix.as_bytes())
        .arg(layout.leader.as_bytes());
    for arg in args {
        invocation.arg(*arg);
    }
    invocation
        .invoke_async(connection)
        .await
        .map_err(|err| unavailable(&err))
}

/// The `floor` argument of [`CAMPAIGN`], the highest token seen before the win: what this
/// coordinator has seen (`highest`), or one below the floor the campaign's `record` asks
/// for (its replica's, above the highest token it has seen, kept in its data dir across
/// its own restarts), whichever is higher. A floor past [`TOKEN_MAX`] + 1 follows no token
/// leaderq handed out, and is left out as such tokens are.
pub fn campaign_floor(highest: u64, record: &HolderRecord) -> u64 {
    let asked = record
        .floor
        .filter(|floor| *floor <= TOKEN_MAX + 1)
        .map_or(0, |floor| floor.saturating_sub(1));
    highest.max(asked)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A campaign passes as seen the higher of what its coordinator saw and one below its
    /// record's floor, so a replica restarted with an empty memory still asks for a token
    /// above the highest it saw before; a floor no token of leaderq's could be under counts
    /// for nothing.
    #[test]
    fn a_campaign_passes_the_higher_of_the_tokens_seen_and_the_records_floor() {
        let record = |floor: Option<u64>| HolderRecord {
            floor,
            ..HolderRecord::default()
        };
        assert_eq!(campaign_floor(0, &record(None)), 0);
        assert_eq!(campaign_floor(40, &record(None)), 40);
        assert_eq!(campaign_floor(0, &record(Some(1))), 0);
        assert_eq!(campaign_floor(0, &record(Some(158))), 157);
        assert_eq!(campaign_floor(400, &record(Some(158))), 400);
        assert_eq!(campaign_floor(0, &record(Some(TOKEN_MAX + 1))), TOKEN_MAX);
        assert_eq!(campaign_floor(7, &record(Some(TOKEN_MAX + 2))), 7);
    }

    /// The producers' script is one line (pasted after `redis-cli EVAL`) with no double
    /// quote in it, so it fits inside the shell's double quotes.
    #[test]
    fn the_producers_script_pastes_into_a_shell() {
        assert!(!PRODUCE.contains('\n') && !PRODUCE.contains('"') && !PRODUCE.contains('$'));
    }

    /// The Redis guide's producer command (docs/redis.md) is this script, word for word:
    /// what the tests write with (testkit's `harness::redis`) is what users paste.
    #[test]
    fn the_redis_guide_shows_the_producers_script() {
        let guide = include_str!("../../../docs/redis.md");
        let block = guide
            .split("<!-- readme-redis:start -->")
            .nth(1)
            .and_then(|rest| rest.split("<!-- readme-redis:end -->").next())
            .expect("docs/redis.md has a readme-redis block");
        assert!(
            block.contains(&format!("redis-cli EVAL \"{PRODUCE}\"")),
            "docs/redis.md's producer command differs from scripts::PRODUCE"
        );
    }
}
