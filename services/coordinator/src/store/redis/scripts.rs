//! The Lua scripts of the Redis store: each one atomic in one hash slot.

/// Checks the fence and the version, writes the task, appends history, writes the outbox: one
/// transition. KEYS: task (a hash), outbox, the lease of the task's shard (all in the shard's
/// slot). ARGV: expected version (0: must not exist), new version, task JSON, history entry
/// JSON, the replica the entry names (empty: none), fencing token (empty: no fence), the
/// writer's time, then outbox entry id / JSON pairs. Returns 1 when written, 0 when the version
/// moved on, 2 when fenced (the lease has another token or ran out by the writer's time).
///
/// The task hash holds `task`, the version, a space and the task's JSON ([`task_json`] reads
/// it), and `hist`: the history, one entry per line, oldest first (read by `history::read`); an
/// entry that names the same replica as the entry before it is kept without it, as `=` and its
/// JSON. A hash an earlier version wrote has the version in a field of its own, `version`, and a
/// `state` field nothing read: both go at its next write.
///
/// Blob references ([`BLOB_KEYS`]): the index commands before the script added the task to the
/// reference set of every blob key in its JSON. A key the task's JSON drops (a reprocessing
/// replaced a derivative) is kept in the hash's `gone` field (space-separated), so that its
/// expiry drops every reference it ever had. A refused write (0 or 2) records there the keys of
/// its JSON the stored task does not hold, and writes nothing else.
pub(super) const TRANSITION: &str = r#"
local function keep_gone(keys)
  local gone = redis.call('HGET', KEYS[1], 'gone')
  local known = blob_keys('', gone or '')
  local added = {}
  for key in pairs(keys) do
    if not known[key] then added[#added + 1] = key end
  end
  if #added == 0 then return end
  table.sort(added)
  local listed = table.concat(added, ' ')
  if gone then listed = gone .. ' ' .. listed end
  redis.call('HSET', KEYS[1], 'gone', listed)
end
local function refused(code, stored)
  if stored then
    local have = blob_keys(stored, redis.call('HGET', KEYS[1], 'gone') or '')
    local missing = {}
    for key in pairs(blob_keys(ARGV[3], '')) do
      if not have[key] then missing[key] = true end
    end
    keep_gone(missing)
  end
  return code
end
if ARGV[6] ~= '' then
  local lease = redis.call('HMGET', KEYS[3], 'token', 'expires_at')
  if lease[1] ~= ARGV[6] or tonumber(lease[2] or '0') <= tonumber(ARGV[7]) then
    return refused(2, redis.call('HGET', KEYS[1], 'task'))
  end
end
local stored = redis.call('HMGET', KEYS[1], 'version', 'task', 'hist')
if stored[2] then
  local version = string.match(stored[2], '^(%d+) ')
  if version then stored[1], stored[2] = version, string.sub(stored[2], #version + 2) end
end
if (stored[1] or '0') ~= ARGV[1] then return refused(0, stored[2]) end
if stored[2] then
  local fresh = blob_keys(ARGV[3], '')
  local dropped = {}
  for key in pairs(blob_keys(stored[2], '')) do
    if not fresh[key] then dropped[key] = true end
  end
  keep_gone(dropped)
end
local entry = ARGV[4]
if ARGV[5] ~= '' and stored[3] and last_replica(stored[3]) == ARGV[5] then
  local suffix = ',"replica":"' .. ARGV[5] .. '"}'
  if string.sub(entry, -#suffix) == suffix then entry = '=' .. string.sub(entry, 1, -#suffix - 1) .. '}' end
end
local hist = entry
if stored[3] then hist = stored[3] .. '\n' .. entry end
redis.call('HSET', KEYS[1], 'task', ARGV[2] .. ' ' .. ARGV[3], 'hist', hist)
if stored[1] then redis.call('HDEL', KEYS[1], 'version', 'state') end
for i = 8, #ARGV, 2 do
  redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1])
end
return 1
"#;

/// The Lua functions the transition script uses, put before it by [`transition_script`]:
/// `blob_keys(json, listed)`, the set (a table: key -> true) of the blob keys in `json` and in
/// the space-separated `listed`: every `sha256:` followed by exactly 64 lowercase hex digits
/// (the only form a blob key takes, [`imagepipe_contracts::command::is_blob_key`]), so a
/// superset of [`blob_keys`](crate::store::blob_keys); and `last_replica(hist)`, the replica the
/// last entry of a `hist` field names (empty: none): the last line not marked `=` names it,
/// found by plain searches for line ends (a pattern walk over every line cost a third of the
/// script's time).
pub(super) const BLOB_KEYS: &str = r#"
local function blob_keys(json, listed)
  local keys, at = {}, 1
  while true do
    local s = string.find(json, 'sha256:', at, true)
    if not s then break end
    local key = string.match(json, '^sha256:[0-9a-f]*', s)
    if #key == 71 then keys[key] = true end
    at = s + #key
  end
  for key in string.gmatch(listed, '%S+') do keys[key] = true end
  return keys
end
local EQUALS = string.byte('=')
local function last_replica(hist)
  local line, at = 1, 1
  while true do
    local nl = string.find(hist, '\n', at, true)
    if not nl then break end
    if string.byte(hist, nl + 1) ~= EQUALS then line = nl + 1 end
    at = nl + 1
  end
  local nl = string.find(hist, '\n', line, true)
  return string.match(string.sub(hist, line, nl and nl - 1 or -1), ',"replica":"([^"]*)"}$') or ''
end
"#;

/// The transition script: [`BLOB_KEYS`] and [`TRANSITION`].
pub(super) fn transition_script() -> String {
    format!("{BLOB_KEYS}{TRANSITION}")
}

/// The task's JSON in the `task` field of a task hash: after the version and a space, or the
/// whole field (a hash an earlier version wrote, with the version in a field of its own).
pub(super) fn task_json(field: &[u8]) -> &[u8] {
    match field.iter().position(|b| *b == b' ') {
        Some(space) if space > 0 && field[..space].iter().all(u8::is_ascii_digit) => &field[space + 1..],
        _ => field,
    }
}

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

/// Deletes a task's keys (KEYS: task, history list, legacy history stream, outbox) if it is
/// still at version ARGV[1] (in the `task` field, or the `version` field of an older hash).
pub(super) const FORGET: &str = r#"
local task = redis.call('HGET', KEYS[1], 'task')
local version = task and string.match(task, '^(%d+) ') or redis.call('HGET', KEYS[1], 'version')
if version ~= ARGV[1] then return 0 end
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
