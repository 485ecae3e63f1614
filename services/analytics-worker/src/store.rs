//! Where the statistics live: the [`StatsStore`] seam, in Redis ([`RedisStore`],
//! `store.kind = redis`), in the embedded file `store.path/analytics.redb` ([`EmbeddedStore`],
//! `store.kind = embedded`, kept across restarts), or in process memory ([`MemoryStore`], tests
//! and handlers run in process).
//!
//! Recording an event is one atomic step: bump its counters, keep the time of the stage it
//! reports unless the task already has one (the first time wins), and for every [`Span`] whose
//! other end is already known, add the latency to that span's histogram. So each latency is
//! measured once, when the later of its two events arrives, whatever their order. A task's
//! stage times are forgotten when it fails or is cancelled, once all of them are known, or
//! `task_ttl` after its last event. The Redis and embedded stores also mark the event handled
//! for the dedup layer in the same step, so a retry after a failure the caller did not see
//! counts nothing twice.
//!
//! The same step adds the event's finished task, failure code and completed latencies to the
//! bucket of its minute (see [`crate::window`]); a snapshot holds the buckets of the hour up to
//! the store's clock. Buckets outside that hour go (Redis: they expire
//! [`MINUTE_GRACE`](crate::window::MINUTE_GRACE) after it; embedded: the next recordings drop
//! them; memory: a ring of 60), so what the stores hold for it depends on the hour, not on the
//! traffic.

mod embedded;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use imagepipe_runtime::clock::{Clock, SystemClock, millis};
use imagepipe_runtime::embedded::EmbeddedError;
use imagepipe_runtime::redis_connection::RedisConnection;
use tokio::time::Instant;

pub use embedded::EmbeddedStore;

use crate::histogram::{BUCKETS_MS, Histogram};
use crate::update::{Span, Stage, Update};
use crate::window::{self, FAILURE_CODES, MAX_CODES_PER_MINUTE, MINUTE_MS, Minute, OTHER_CODE, Window};

/// How long a task's stage times are kept after its last event by default.
pub const DEFAULT_TASK_TTL: Duration = Duration::from_secs(24 * 60 * 60);

/// Counter field of the bytes downloaded.
const BYTES_DOWNLOADED: &str = "bytes_downloaded";

/// Everything counted so far.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// Finished tasks by outcome (`completed`, `failed`, `cancelled`).
    pub tasks: BTreeMap<String, u64>,
    /// Events by type.
    pub events: BTreeMap<String, u64>,
    /// Downloaded images by format.
    pub formats: BTreeMap<String, u64>,
    /// Bytes downloaded.
    pub bytes_downloaded: u64,
    /// Latency histograms of the spans measured at least once.
    pub latencies: BTreeMap<Span, Histogram>,
    /// The last hour, by minute, up to when it was read.
    pub last_hour: Window,
}

/// The counter fields an update adds to, with the amounts: `events:<type>`, `tasks:<outcome>`,
/// `formats:<format>`, `bytes_downloaded` (the fields of the Redis hash and the embedded table;
/// [`Stats::add_counter`] reads them).
fn counter_fields(update: &Update) -> Vec<(String, u64)> {
    let mut fields = vec![(format!("events:{}", update.event_type.as_str()), 1)];
    if let Some(outcome) = update.outcome {
        fields.push((format!("tasks:{}", outcome.as_str()), 1));
    }
    if let Some(format) = &update.format {
        fields.push((format!("formats:{format}"), 1));
    }
    if update.bytes > 0 {
        fields.push((BYTES_DOWNLOADED.to_owned(), update.bytes));
    }
    fields
}

impl Stats {
    /// Adds `value` to the counter a store keeps in `field` (see `counter_fields`).
    fn add_counter(&mut self, field: &str, value: u64) -> Result<(), StoreError> {
        if field == BYTES_DOWNLOADED {
            self.bytes_downloaded = self.bytes_downloaded.saturating_add(value);
            return Ok(());
        }
        let (map, name) = match field.split_once(':') {
            Some(("events", name)) => (&mut self.events, name),
            Some(("tasks", name)) => (&mut self.tasks, name),
            Some(("formats", name)) => (&mut self.formats, name),
            _ => return Err(StoreError::Corrupt { what: "counter field", value: field.to_owned() }),
        };
        let counter = map.entry(name.to_owned()).or_default();
        *counter = counter.saturating_add(value);
        Ok(())
    }

    /// Sets the histogram field a store keeps in `field`: `<span>:<histogram field>` (see
    /// [`Histogram::fields`]).
    fn set_latency_field(&mut self, field: &str, value: u64) -> Result<(), StoreError> {
        let corrupt = || StoreError::Corrupt { what: "histogram field", value: field.to_owned() };
        let (name, part) = field.split_once(':').ok_or_else(corrupt)?;
        let span = Span::parse(name).ok_or_else(corrupt)?;
        self.latencies.entry(span).or_default().set_field(part, value).map_err(|_| corrupt())
    }
}

/// The store could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Connecting to Redis failed.
    #[error("connecting to Redis for the analytics store")]
    Connect(#[source] redis::RedisError),
    /// A Redis command failed.
    #[error("analytics store: {action}")]
    Redis {
        /// What was being done.
        action: &'static str,
        /// What Redis said.
        #[source]
        source: redis::RedisError,
    },
    /// The embedded file failed.
    #[error("analytics store")]
    Embedded(#[source] EmbeddedError),
    /// The store held something this code did not write.
    #[error("analytics store: unexpected {what} {value:?}")]
    Corrupt {
        /// What was read.
        what: &'static str,
        /// The value.
        value: String,
    },
}

/// Where the statistics are kept.
#[async_trait]
pub trait StatsStore: Send + Sync + 'static {
    /// Records `update` atomically; returns the latencies (ms) it completed.
    async fn record(&self, update: &Update) -> Result<Vec<(Span, u64)>, StoreError>;
    /// Everything counted so far.
    async fn snapshot(&self) -> Result<Stats, StoreError>;
}

/// The statistics in Redis, under `<prefix>:{<prefix>:analytics}:` (the hash tag of the
/// subscriber group, [`imagepipe_runtime::dedup::redis_group_tag`]; its dedup keys carry the
/// shortest tag of the same slot, so the script's keys share one Redis Cluster slot): a hash of counters, a hash of
/// histogram fields (`latencies:v2`: `<span>:count`, `:sum`, `:min`, `:max`, `:<bucket>`), a
/// hash of stage times per task (`task:<id>`, with a TTL), and a hash per minute of the last
/// hour (`minute:<start, Unix ms>`, the fields of [`Minute::fields`], expiring
/// [`MINUTE_GRACE`](window::MINUTE_GRACE) after the minute leaves the hour). One Lua script
/// records an event. The hour is read up to the store's clock.
///
/// The histogram hash is versioned: `<prefix>:analytics:latencies` held the coarser buckets of
/// earlier versions, indexed differently, and is no longer read (its histograms start afresh).
///
/// Before the hash tag the keys were under `<prefix>:analytics:` and the dedup keys under
/// [`legacy_redis_prefix`](imagepipe_runtime::dedup::legacy_redis_prefix) (a layout that ran on
/// a single server only). On a single server, [`RedisStore::connect`] renames the old counters,
/// histograms, minutes and task times to their new names (those whose new name is free), and
/// an event marked under the old dedup key counts as a duplicate until that mark expires.
#[derive(Clone)]
pub struct RedisStore {
    connection: RedisConnection,
    prefix: String,
    dedup_prefix: String,
    /// Where events were marked before the hash tag; the new prefix again on a cluster.
    legacy_dedup_prefix: String,
    task_ttl: Duration,
    dedup_ttl: Duration,
    script: redis::Script,
    clock: Arc<dyn Clock>,
}

/// KEYS: counters, latencies, task, the event's dedup key, its dedup key before the hash tag
/// (the same key on a cluster), and the bucket of the minute it counts in (absent when it is
/// before the last hour). ARGV: event type, outcome, format, bytes,
/// stage, timestamp, task TTL ms, forget ('1' drops the task's times), dedup TTL ms, the
/// minute's TTL ms, failure code, then counted lists: every stage name; the spans touching the
/// stage as (name, from, to). The bucket bounds are the table `bounds`, the code that failures
/// beyond `max_codes` distinct ones in a minute count as is `other`, both put before this text
/// by [`record_script`]. Replies `'duplicate'` when the event was counted before, else
/// `'counted'` followed by the latencies it completed as (span, ms) pairs.
///
/// Marking the event done in the same script is what makes a retry safe: when the reply is lost
/// (a timeout) after Redis ran the script, the redelivered event finds its mark and counts
/// nothing.
const RECORD_SCRIPT: &str = r"
local counters, latencies, task, seen, legacy_seen, minute = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local event_type, outcome, format, bytes = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local stage, timestamp, ttl, forget = ARGV[5], ARGV[6], ARGV[7], ARGV[8]
local minute_ttl, code = ARGV[10], ARGV[11]
if redis.call('EXISTS', legacy_seen) == 1 then return {'duplicate'} end
if not redis.call('SET', seen, '1', 'NX', 'PX', ARGV[9]) then return {'duplicate'} end
local i = 12
local stages = {}
for _ = 1, tonumber(ARGV[i]) do i = i + 1; stages[#stages + 1] = ARGV[i] end
i = i + 1
local spans = {}
for _ = 1, tonumber(ARGV[i]) do spans[#spans + 1] = {ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]}; i = i + 3 end

-- Adds a sample of ms in bucket index `bucket` to the histogram in the fields `prefix ..` of hash.
local function add_sample(hash, prefix, ms, bucket)
  redis.call('HINCRBY', hash, prefix .. 'count', 1)
  redis.call('HINCRBY', hash, prefix .. 'sum', ms)
  redis.call('HINCRBY', hash, prefix .. bucket, 1)
  local min = redis.call('HGET', hash, prefix .. 'min')
  if not min or ms < tonumber(min) then redis.call('HSET', hash, prefix .. 'min', ms) end
  local max = redis.call('HGET', hash, prefix .. 'max')
  if not max or ms > tonumber(max) then redis.call('HSET', hash, prefix .. 'max', ms) end
end

redis.call('HINCRBY', counters, 'events:' .. event_type, 1)
if outcome ~= '' then redis.call('HINCRBY', counters, 'tasks:' .. outcome, 1) end
if format ~= '' then redis.call('HINCRBY', counters, 'formats:' .. format, 1) end
if bytes ~= '0' then redis.call('HINCRBY', counters, 'bytes_downloaded', bytes) end

local recorded = {'counted'}
if stage ~= '' and redis.call('HSETNX', task, stage, timestamp) == 1 then
  for _, span in ipairs(spans) do
    local from = redis.call('HGET', task, span[2])
    local to = redis.call('HGET', task, span[3])
    if from and to then
      local ms = math.max(0, tonumber(to) - tonumber(from))
      local lo, hi = 1, #bounds + 1
      while lo < hi do
        local mid = math.floor((lo + hi) / 2)
        if bounds[mid] < ms then lo = mid + 1 else hi = mid end
      end
      local name = span[1]
      add_sample(latencies, name .. ':', ms, lo - 1)
      if minute then add_sample(minute, 'latencies:' .. name .. ':', ms, lo - 1) end
      recorded[#recorded + 1] = name
      recorded[#recorded + 1] = tostring(ms)
    end
  end
end

if stage ~= '' or forget == '1' then
  local known = 0
  for _, name in ipairs(stages) do
    if redis.call('HEXISTS', task, name) == 1 then known = known + 1 end
  end
  if forget == '1' or known == #stages then
    redis.call('DEL', task)
  elseif stage ~= '' then
    redis.call('PEXPIRE', task, ttl)
  end
end

if minute then
  if outcome ~= '' then redis.call('HINCRBY', minute, 'tasks:' .. outcome, 1) end
  if code ~= '' then
    if code ~= other and redis.call('HEXISTS', minute, 'failures:' .. code) == 0 then
      if tonumber(redis.call('HGET', minute, failure_codes) or '0') < max_codes then
        redis.call('HINCRBY', minute, failure_codes, 1)
      else
        code = other
      end
    end
    redis.call('HINCRBY', minute, 'failures:' .. code, 1)
  end
  redis.call('PEXPIRE', minute, minute_ttl)
end
return recorded
";

/// [`RECORD_SCRIPT`] with the bucket bounds ([`BUCKETS_MS`]) as its table `bounds`, and the
/// cap on failure codes per minute as `max_codes`, `other` and `failure_codes` (see
/// [`Minute::failure_label`]).
fn record_script() -> String {
    let bounds: Vec<String> = BUCKETS_MS.iter().map(u64::to_string).collect();
    format!(
        "local bounds = {{{}}}\nlocal max_codes, other, failure_codes = {MAX_CODES_PER_MINUTE}, '{OTHER_CODE}', \
         '{FAILURE_CODES}'{RECORD_SCRIPT}",
        bounds.join(",")
    )
}

impl RedisStore {
    /// Connects to `url`, keys under `<prefix>:{<prefix>:analytics}:`, task times kept
    /// `task_ttl`; each counted event is marked done under the subscriber's dedup key (see
    /// [`imagepipe_runtime::dedup::redis_prefix`]) for `dedup_ttl`. On a single server the keys
    /// of the layout before the hash tag are moved first (see [`RedisStore`]).
    pub async fn connect(url: &str, prefix: &str, task_ttl: Duration, dedup_ttl: Duration) -> Result<Self, StoreError> {
        let connection = RedisConnection::open(url).await.map_err(StoreError::Connect)?;
        let dedup_prefix = imagepipe_runtime::dedup::redis_prefix(prefix, crate::GROUP);
        let legacy_dedup_prefix = if connection.is_cluster() {
            dedup_prefix.clone()
        } else {
            imagepipe_runtime::dedup::legacy_redis_prefix(prefix, crate::GROUP)
        };
        let store = Self {
            connection,
            prefix: format!("{prefix}:{}", imagepipe_runtime::dedup::redis_group_tag(prefix, crate::GROUP)),
            dedup_prefix,
            legacy_dedup_prefix,
            task_ttl,
            dedup_ttl,
            script: redis::Script::new(&record_script()),
            clock: Arc::new(SystemClock),
        };
        if !store.connection.is_cluster() {
            let moved = store.move_legacy_keys(&format!("{prefix}:analytics")).await?;
            if moved > 0 {
                tracing::info!(
                    keys = moved,
                    "analytics keys of the layout before the hash tag moved under {}",
                    store.prefix
                );
            }
        }
        Ok(store)
    }

    /// Renames the keys under `old` (the layout before the hash tag) to their names under the
    /// store's prefix, each whose new name is free; returns how many. One server only: the
    /// rename spans slots.
    async fn move_legacy_keys(&self, old: &str) -> Result<usize, StoreError> {
        let mut keys = self
            .connection
            .scan_match(&format!("{old}:task:*"), 1_000)
            .await
            .map_err(redis_err("listing analytics keys of the old layout"))?;
        keys.extend(
            self.connection
                .scan_match(&format!("{old}:minute:*"), 1_000)
                .await
                .map_err(redis_err("listing analytics keys of the old layout"))?,
        );
        keys.extend([format!("{old}:counters"), format!("{old}:latencies:v2")]);
        let rename = redis::Script::new(MOVE_LEGACY);
        rename
            .prepare_invoke()
            .load_async(&mut self.connection.clone())
            .await
            .map_err(redis_err("moving analytics keys of the old layout"))?;
        let mut moved = 0;
        for batch in keys.chunks(500) {
            let mut pipe = redis::pipe();
            for key in batch {
                let new = format!("{}{}", self.prefix, &key[old.len()..]);
                pipe.invoke_script(rename.key(key).key(new));
            }
            let done: Vec<u8> = pipe
                .query_async(&mut self.connection.clone())
                .await
                .map_err(redis_err("moving analytics keys of the old layout"))?;
            moved += done.iter().map(|d| usize::from(*d)).sum::<usize>();
        }
        Ok(moved)
    }

    /// The same store reading the time (the last hour's end, the minute an event counts in)
    /// from `clock` instead of the system's.
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    fn counters_key(&self) -> String {
        format!("{}:counters", self.prefix)
    }

    fn latencies_key(&self) -> String {
        format!("{}:latencies:v2", self.prefix)
    }

    /// The stage times of `task_id`; without a task (a queue event), a key the script does not
    /// touch (such an update has no stage and ends no measurement).
    fn task_key(&self, task_id: Option<&str>) -> String {
        match task_id {
            Some(task_id) => format!("{}:task:{task_id}", self.prefix),
            None => format!("{}:no-task", self.prefix),
        }
    }

    fn minute_key(&self, minute: u64) -> String {
        format!("{}:minute:{minute}", self.prefix)
    }
}

/// Renames `KEYS[1]` to `KEYS[2]` when the first exists and the second does not (keeping its
/// TTL); returns 1 when it did.
const MOVE_LEGACY: &str = r"
if redis.call('EXISTS', KEYS[1]) == 0 or redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
redis.call('RENAME', KEYS[1], KEYS[2])
return 1
";

fn redis_err(action: &'static str) -> impl FnOnce(redis::RedisError) -> StoreError {
    move |source| StoreError::Redis { action, source }
}

fn parse_u64(what: &'static str, value: &str) -> Result<u64, StoreError> {
    value.parse().map_err(|_| StoreError::Corrupt { what, value: value.to_owned() })
}

#[async_trait]
impl StatsStore for RedisStore {
    async fn record(&self, update: &Update) -> Result<Vec<(Span, u64)>, StoreError> {
        let now = self.clock.unix_ms();
        let minute = window::bucket_minute(update.timestamp, now);
        let mut invocation = self.script.prepare_invoke();
        invocation
            .key(self.counters_key())
            .key(self.latencies_key())
            .key(self.task_key(update.task_id.as_deref()))
            .key(format!("{}:{}", self.dedup_prefix, update.event_id))
            .key(format!("{}:{}", self.legacy_dedup_prefix, update.event_id));
        if let Some(minute) = minute {
            invocation.key(self.minute_key(minute));
        }
        invocation
            .arg(update.event_type.as_str())
            .arg(update.outcome.map_or("", |o| o.as_str()))
            .arg(update.format.as_deref().unwrap_or(""))
            .arg(update.bytes.to_string())
            .arg(update.stage.map_or("", Stage::as_str))
            .arg(update.timestamp.to_string())
            .arg(millis(self.task_ttl).max(1))
            .arg(if update.ends_measurement() { "1" } else { "0" })
            .arg(millis(self.dedup_ttl).max(1))
            .arg(minute.map_or(1, |minute| millis(window::bucket_ttl(minute, now))))
            .arg(update.failure_code.as_deref().unwrap_or(""))
            .arg(Stage::ALL.len());
        for stage in Stage::ALL {
            invocation.arg(stage.as_str());
        }
        let spans: Vec<Span> = update.stage.map(|stage| Span::touching(stage).collect()).unwrap_or_default();
        invocation.arg(spans.len());
        for span in &spans {
            let (from, to) = span.stages();
            invocation.arg(span.as_str()).arg(from.as_str()).arg(to.as_str());
        }
        let reply: Vec<String> =
            invocation.invoke_async(&mut self.connection.clone()).await.map_err(redis_err("recording an event"))?;
        let flat = match reply.split_first() {
            Some((status, _)) if status == "duplicate" => return Ok(Vec::new()),
            Some((status, flat)) if status == "counted" => flat,
            _ => return Err(StoreError::Corrupt { what: "script reply", value: format!("{reply:?}") }),
        };
        flat.chunks(2)
            .map(|pair| match pair {
                [name, ms] => {
                    let span =
                        Span::parse(name).ok_or_else(|| StoreError::Corrupt { what: "span", value: name.clone() })?;
                    Ok((span, parse_u64("latency", ms)?))
                }
                _ => Err(StoreError::Corrupt { what: "script reply", value: format!("{flat:?}") }),
            })
            .collect()
    }

    async fn snapshot(&self) -> Result<Stats, StoreError> {
        let mut stats = Stats { last_hour: Window::ending_at(self.clock.unix_ms()), ..Stats::default() };
        let minutes: Vec<u64> = stats.last_hour.minute_starts().collect();
        let mut pipe = redis::pipe();
        pipe.cmd("HGETALL").arg(self.counters_key()).cmd("HGETALL").arg(self.latencies_key());
        for minute in &minutes {
            pipe.cmd("HGETALL").arg(self.minute_key(*minute));
        }
        let hashes: Vec<HashMap<String, String>> =
            pipe.query_async(&mut self.connection.clone()).await.map_err(redis_err("reading statistics"))?;
        let [counters, latencies, buckets @ ..] = hashes.as_slice() else {
            return Err(StoreError::Corrupt { what: "pipeline reply", value: format!("{} hashes", hashes.len()) });
        };
        for (field, value) in counters {
            stats.add_counter(field, parse_u64("counter", value)?)?;
        }
        for (field, value) in latencies {
            stats.set_latency_field(field, parse_u64("histogram value", value)?)?;
        }
        for (minute, fields) in minutes.into_iter().zip(buckets).filter(|(_, fields)| !fields.is_empty()) {
            let Some(bucket) = stats.last_hour.bucket_mut(minute) else { continue };
            for (field, value) in fields {
                bucket.set_field(field, parse_u64("minute value", value)?)?;
            }
        }
        Ok(stats)
    }
}

/// The statistics in process memory, gone with the process (tests, handlers run in process).
/// The last hour is a ring of a bucket per minute, on the store's clock.
#[derive(Debug)]
pub struct MemoryStore {
    task_ttl: Duration,
    clock: Arc<dyn Clock>,
    inner: Mutex<Tables>,
}

#[derive(Debug)]
struct Tables {
    stats: Stats,
    tasks: HashMap<String, TaskTimes>,
    next_sweep: Instant,
    minutes: MinuteRing,
}

/// The buckets of the last hour: slot `(minute / MINUTE_MS) % 60` holds the bucket of the
/// latest minute recorded there, so the 60 minutes of any window have a slot each.
#[derive(Debug)]
struct MinuteRing {
    slots: Vec<Option<(u64, Minute)>>,
}

impl MinuteRing {
    fn new() -> Self {
        Self { slots: (0..window::WINDOW_MINUTES).map(|_| None).collect() }
    }

    /// The bucket of `minute` (a minute's start), replacing an older minute's in its slot;
    /// `None` when the slot holds a later minute (the clock went back over an hour).
    fn bucket(&mut self, minute: u64) -> Option<&mut Minute> {
        let slot = &mut self.slots[((minute / MINUTE_MS) % window::WINDOW_MINUTES) as usize];
        match slot {
            Some((held, _)) if *held > minute => return None,
            Some((held, _)) if *held == minute => {}
            _ => *slot = Some((minute, Minute::default())),
        }
        slot.as_mut().map(|(_, bucket)| bucket)
    }

    /// The window ending at `now` (Unix ms), with the buckets of its minutes.
    fn window(&self, now: u64) -> Window {
        let mut window = Window::ending_at(now);
        for (minute, bucket) in self.slots.iter().flatten() {
            if let Some(read) = window.bucket_mut(*minute) {
                *read = bucket.clone();
            }
        }
        window
    }
}

#[derive(Debug, Default)]
struct TaskTimes {
    at: BTreeMap<Stage, u64>,
    expires: Option<Instant>,
}

impl MemoryStore {
    /// An empty store keeping task times `task_ttl` after their last event.
    pub fn new(task_ttl: Duration) -> Self {
        let tables = Tables {
            stats: Stats::default(),
            tasks: HashMap::new(),
            next_sweep: Instant::now(),
            minutes: MinuteRing::new(),
        };
        Self { task_ttl, clock: Arc::new(SystemClock), inner: Mutex::new(tables) }
    }

    /// The same store reading the time (the last hour's end, the minute an event counts in)
    /// from `clock` instead of the system's.
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Tasks whose stage times are held.
    pub fn tasks_tracked(&self) -> usize {
        let mut tables = self.inner.lock().expect("analytics store lock");
        tables.sweep(Instant::now(), self.task_ttl);
        tables.tasks.len()
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new(DEFAULT_TASK_TTL)
    }
}

impl Tables {
    /// Forgets expired task times, at most once per `ttl / 10` (and once a minute at most).
    fn sweep(&mut self, now: Instant, ttl: Duration) {
        if now < self.next_sweep {
            return;
        }
        self.tasks.retain(|_, task| task.expires.is_none_or(|expires| expires > now));
        self.next_sweep = now + (ttl / 10).min(Duration::from_secs(60));
    }
}

#[async_trait]
impl StatsStore for MemoryStore {
    async fn record(&self, update: &Update) -> Result<Vec<(Span, u64)>, StoreError> {
        let now = Instant::now();
        let mut tables = self.inner.lock().expect("analytics store lock");
        tables.sweep(now, self.task_ttl);
        for (field, value) in counter_fields(update) {
            tables.stats.add_counter(&field, value)?;
        }

        let mut recorded = Vec::new();
        if let (Some(stage), Some(task_id)) = (update.stage, &update.task_id) {
            let Tables { stats, tasks, .. } = &mut *tables;
            let task = tasks.entry(task_id.clone()).or_default();
            if let std::collections::btree_map::Entry::Vacant(entry) = task.at.entry(stage) {
                entry.insert(update.timestamp);
                for span in Span::touching(stage) {
                    let (from, to) = span.stages();
                    if let (Some(&from), Some(&to)) = (task.at.get(&from), task.at.get(&to)) {
                        let ms = Span::latency(from, to);
                        stats.latencies.entry(span).or_default().record(ms);
                        recorded.push((span, ms));
                    }
                }
            }
            task.expires = Some(now + self.task_ttl);
        }
        if let Some(task_id) = &update.task_id {
            let complete = tables.tasks.get(task_id).is_some_and(|task| task.at.len() == Stage::ALL.len());
            if update.ends_measurement() || complete {
                tables.tasks.remove(task_id);
            }
        }
        if let Some(minute) = window::bucket_minute(update.timestamp, self.clock.unix_ms())
            && let Some(bucket) = tables.minutes.bucket(minute)
        {
            bucket.record(update, &recorded);
        }
        Ok(recorded)
    }

    async fn snapshot(&self) -> Result<Stats, StoreError> {
        let tables = self.inner.lock().expect("analytics store lock");
        Ok(Stats { last_hour: tables.minutes.window(self.clock.unix_ms()), ..tables.stats.clone() })
    }
}
