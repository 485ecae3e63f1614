//! The Lua scripts of the Redis store: each one atomic in one hash slot.

/// Checks the version, writes the task, appends history, writes the outbox: one transition.
/// KEYS: task, history (a list: a stream per task would take 4 KiB even when small), outbox.
/// ARGV: expected version (0: must not exist), new version, state, task JSON, history JSON,
/// then outbox entry id / JSON pairs.
pub(super) const TRANSITION: &str = r#"
local current = redis.call('HGET', KEYS[1], 'version')
if current == false then current = '0' end
if current ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'version', ARGV[2], 'state', ARGV[3], 'task', ARGV[4])
redis.call('RPUSH', KEYS[2], ARGV[5])
for i = 6, #ARGV, 2 do
  redis.call('HSET', KEYS[3], ARGV[i], ARGV[i + 1])
end
return 1
"#;

/// Returns expired leases to the due set, then moves up to ARGV[3] due entries to the claimed
/// set with lease end ARGV[2]. KEYS: due, claimed. ARGV: now, lease end, max.
pub(super) const CLAIM: &str = r#"
local expired = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', ARGV[1])
for _, id in ipairs(expired) do
  redis.call('ZREM', KEYS[2], id)
  redis.call('ZADD', KEYS[1], 'LT', ARGV[1], id)
end
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[3]))
for _, id in ipairs(ids) do
  redis.call('ZREM', KEYS[1], id)
  redis.call('ZADD', KEYS[2], ARGV[2], id)
end
return ids
"#;

/// Removes task ARGV[1] from every sorted set of KEYS where its score is ARGV[2] (its creation
/// time), so that a new task reusing the id keeps its entries.
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
