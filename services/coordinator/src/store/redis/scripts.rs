//! The Lua scripts of the Redis store: each one atomic in one hash slot.

/// Checks the fence and the version, writes the task, appends history, writes the outbox: one
/// transition. KEYS: task, history (a list: a stream per task would take 4 KiB even when small),
/// outbox, the lease of the task's shard (all in the shard's slot). ARGV: expected version (0:
/// must not exist), new version, state, task JSON, history JSON, fencing token (empty: no
/// fence), the writer's time, then outbox entry id / JSON pairs. Returns 1 when written, 0 when
/// the version moved on, 2 when fenced (the lease has another token or ran out by the writer's
/// time); nothing is written unless it returns 1.
pub(super) const TRANSITION: &str = r#"
if ARGV[6] ~= '' then
  local lease = redis.call('HMGET', KEYS[4], 'token', 'expires_at')
  if lease[1] ~= ARGV[6] or tonumber(lease[2] or '0') <= tonumber(ARGV[7]) then return 2 end
end
local current = redis.call('HGET', KEYS[1], 'version')
if current == false then current = '0' end
if current ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'version', ARGV[2], 'state', ARGV[3], 'task', ARGV[4])
redis.call('RPUSH', KEYS[2], ARGV[5])
for i = 8, #ARGV, 2 do
  redis.call('HSET', KEYS[3], ARGV[i], ARGV[i + 1])
end
return 1
"#;

/// Claims due tasks of some shards. KEYS: the global due and claimed sets, then per shard its
/// due and claimed sets. ARGV: now, lease end, max. Per shard, leases run out by `now` return
/// to the due sets first; then the `max` earliest due entries of all the shards (by wake time,
/// then id) move to the claimed sets with the lease end, globally and in their shard.
pub(super) const CLAIM_IN: &str = r#"
local now, max = ARGV[1], tonumber(ARGV[3])
local found = {}
for i = 3, #KEYS, 2 do
  local expired = redis.call('ZRANGEBYSCORE', KEYS[i + 1], '-inf', now)
  for _, id in ipairs(expired) do
    redis.call('ZREM', KEYS[i + 1], id)
    redis.call('ZREM', KEYS[2], id)
    redis.call('ZADD', KEYS[i], 'LT', now, id)
    redis.call('ZADD', KEYS[1], 'LT', now, id)
  end
  local rows = redis.call('ZRANGEBYSCORE', KEYS[i], '-inf', now, 'WITHSCORES', 'LIMIT', 0, max)
  for j = 1, #rows, 2 do found[#found + 1] = {tonumber(rows[j + 1]), rows[j], i} end
end
table.sort(found, function(a, b)
  if a[1] ~= b[1] then return a[1] < b[1] end
  return a[2] < b[2]
end)
local ids = {}
for k = 1, math.min(max, #found) do
  local id, i = found[k][2], found[k][3]
  redis.call('ZREM', KEYS[i], id)
  redis.call('ZREM', KEYS[1], id)
  redis.call('ZADD', KEYS[i + 1], ARGV[2], id)
  redis.call('ZADD', KEYS[2], ARGV[2], id)
  ids[#ids + 1] = id
end
return ids
"#;

/// Claims the listed candidates of the global due set (read just before, their shards worked
/// out by the caller). KEYS: global due, global claimed, then per candidate its shard's due
/// and claimed sets. ARGV: now, lease end, then per candidate its id and whether it is an
/// expired lease (`1`) or a due entry (`0`). An expired lease still expired returns to the due
/// sets; then each candidate still due by `now` moves to the claimed sets. Returns the claimed.
pub(super) const CLAIM_LISTED: &str = r#"
local now = tonumber(ARGV[1])
for k = 3, #ARGV, 2 do
  local id, i = ARGV[k], k
  if ARGV[k + 1] == '1' then
    local lease = redis.call('ZSCORE', KEYS[2], id)
    if lease and tonumber(lease) <= now then
      redis.call('ZREM', KEYS[2], id)
      redis.call('ZREM', KEYS[i + 1], id)
      redis.call('ZADD', KEYS[1], 'LT', ARGV[1], id)
      redis.call('ZADD', KEYS[i], 'LT', ARGV[1], id)
    end
  end
end
local ids = {}
for k = 3, #ARGV, 2 do
  local id, i = ARGV[k], k
  local due = redis.call('ZSCORE', KEYS[1], id)
  if due and tonumber(due) <= now then
    redis.call('ZREM', KEYS[1], id)
    redis.call('ZREM', KEYS[i], id)
    redis.call('ZADD', KEYS[2], ARGV[2], id)
    redis.call('ZADD', KEYS[i + 1], ARGV[2], id)
    ids[#ids + 1] = id
  end
end
return ids
"#;

/// Takes or renews the lease of one shard. KEYS: the lease (a hash: owner, token, expires_at).
/// ARGV: owner, now, new expiry. Held by the owner: renewed, token kept; free, released or run
/// out: taken, token + 1; held by another: nothing (nil). Returns the token.
pub(super) const ACQUIRE: &str = r#"
local lease = redis.call('HMGET', KEYS[1], 'owner', 'expires_at')
local owner = lease[1] or ''
local live = owner ~= '' and tonumber(lease[2] or '0') > tonumber(ARGV[2])
if live and owner ~= ARGV[1] then return false end
if not live then redis.call('HINCRBY', KEYS[1], 'token', 1) end
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'expires_at', ARGV[3])
return redis.call('HGET', KEYS[1], 'token') or '0'
"#;

/// Releases one shard's lease KEYS[1] if owner ARGV[1] holds it with token ARGV[2]: the owner
/// becomes empty and the expiry 0; the token stays.
pub(super) const RELEASE_LEASE: &str = r#"
local lease = redis.call('HMGET', KEYS[1], 'owner', 'token')
if lease[1] ~= ARGV[1] or lease[2] ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], 'owner', '', 'expires_at', '0')
return 1
"#;

/// The live replicas: KEYS the announcements (hash: id -> JSON) and their expiries (sorted
/// set); the ones expired by ARGV[1] are forgotten, the others' announcements returned.
pub(super) const LIVE_REPLICAS: &str = r#"
local gone = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', ARGV[1])
for _, id in ipairs(gone) do
  redis.call('ZREM', KEYS[2], id)
  redis.call('HDEL', KEYS[1], id)
end
local ids = redis.call('ZRANGE', KEYS[2], 0, -1)
if #ids == 0 then return {} end
return redis.call('HMGET', KEYS[1], unpack(ids))
"#;

/// Moves keys to their new names (KEYS: old and new names, in pairs), skipping a key already
/// moved (the old one is gone) and one whose new name is taken. Returns how many moved and how
/// many were left for a taken name.
pub(super) const MOVE_KEYS: &str = r#"
local moved, taken = 0, 0
for i = 1, #KEYS, 2 do
  if redis.call('EXISTS', KEYS[i]) == 1 then
    if redis.call('EXISTS', KEYS[i + 1]) == 1 then
      taken = taken + 1
    else
      redis.call('RENAME', KEYS[i], KEYS[i + 1])
      moved = moved + 1
    end
  end
end
return {moved, taken}
"#;

/// Copies entries of the global sorted set KEYS[1] to the sets of their shards: ARGV[i] goes
/// to KEYS[i + 1] with its score in KEYS[1], when it is still there.
pub(super) const COPY_TO_SHARDS: &str = r#"
for i = 1, #ARGV do
  local score = redis.call('ZSCORE', KEYS[1], ARGV[i])
  if score then redis.call('ZADD', KEYS[i + 1], score, ARGV[i]) end
end
return 0
"#;

/// Removes task ARGV[1] from every sorted set of KEYS where its score is ARGV[2] (its creation
/// time, or its queued index score), so that a new task reusing the id keeps its entries.
pub(super) const UNINDEX: &str = r#"
for _, key in ipairs(KEYS) do
  local score = redis.call('ZSCORE', key, ARGV[1])
  if score and tonumber(score) == tonumber(ARGV[2]) then redis.call('ZREM', key, ARGV[1]) end
end
return 0
"#;

/// Removes ARGV[2..] from the finished set KEYS[1] where finished at or before ARGV[1].
pub(super) const UNFINISH: &str = r#"
for i = 2, #ARGV do
  local score = redis.call('ZSCORE', KEYS[1], ARGV[i])
  if score and tonumber(score) <= tonumber(ARGV[1]) then redis.call('ZREM', KEYS[1], ARGV[i]) end
end
return 0
"#;

/// Drops task ARGV[1]'s blob references: KEYS[1] its set of blobs, KEYS[2] the released set,
/// KEYS[3..] the reference sets of the blobs ARGV[2..]; a blob left without references is
/// released.
pub(super) const UNREFERENCE: &str = r#"
for i = 3, #KEYS do
  redis.call('SREM', KEYS[i], ARGV[1])
  if redis.call('SCARD', KEYS[i]) == 0 then redis.call('SADD', KEYS[2], ARGV[i - 1]) end
end
redis.call('DEL', KEYS[1])
return 0
"#;

/// Deletes the idempotency key KEYS[1] while it names task ARGV[1].
pub(super) const RELEASE_KEY: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"#;

/// Deletes a task's keys (KEYS: task, history, legacy history stream, outbox) if it is still
/// at version ARGV[1].
pub(super) const FORGET: &str = r#"
if redis.call('HGET', KEYS[1], 'version') ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4])
return 1
"#;

/// Builds the finished set KEYS[1] from the terminal states' sets KEYS[2..] when it does not
/// exist (a store written before it was kept; scores are creation times, corrected on expiry).
pub(super) const BUILD_FINISHED: &str = r#"
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
return redis.call('ZUNIONSTORE', KEYS[1], #KEYS - 1, unpack(KEYS, 2))
"#;

/// Deletes dead letters (KEYS: entries hash, order set) dead-lettered at or before ARGV[1],
/// then the oldest beyond ARGV[2] entries; at most ARGV[3] in all. Returns how many.
pub(super) const TRIM_DEAD_LETTERS: &str = r#"
local budget = tonumber(ARGV[3])
local ids = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', ARGV[1], 'LIMIT', 0, budget)
local excess = redis.call('ZCARD', KEYS[2]) - #ids - tonumber(ARGV[2])
if excess > 0 and #ids < budget then
  local oldest = redis.call('ZRANGE', KEYS[2], #ids, #ids + math.min(excess, budget - #ids) - 1)
  for _, id in ipairs(oldest) do ids[#ids + 1] = id end
end
for _, id in ipairs(ids) do
  redis.call('HDEL', KEYS[1], id)
  redis.call('ZREM', KEYS[2], id)
end
return #ids
"#;
