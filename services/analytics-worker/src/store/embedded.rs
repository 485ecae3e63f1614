//! [`EmbeddedStore`]: the statistics in the analytics group's redb file under `store.path`
//! (`analytics.redb`), kept across restarts, beside the group's dedup set. The tables hold what
//! the Redis hashes hold, in the same fields: counters, histogram fields by span, stage times
//! by task (with their expiry time and an index by it), and the fields of each minute of the
//! last hour (see [`crate::window`]) by minute. Recording an event also forgets a batch of the
//! expired task times and of the rows of minutes before the hour, so neither grows unbounded.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use imagepipe_runtime::clock::{Clock, millis};
use imagepipe_runtime::dedup::EmbeddedDedup;
use redb::{ReadableTable, Table, TableDefinition, WriteTransaction};

use super::{Stats, StatsStore, StoreError, counter_fields};
use crate::histogram::Histogram;
use crate::update::{Span, Stage, Update};
use crate::window::{self, MINUTE_MS, Minute, Window};

/// Counter field (see `counter_fields`) → value.
const COUNTERS: TableDefinition<&str, u64> = TableDefinition::new("analytics_counters");
/// Histogram field, `<span>:<field>` (see [`Histogram::fields`]) → value.
const LATENCIES: TableDefinition<&str, u64> = TableDefinition::new("analytics_latencies");
/// (task, stage) → the stage's time, Unix ms.
const STAGES: TableDefinition<(&str, &str), u64> = TableDefinition::new("analytics_stages");
/// Task → when its stage times expire, Unix ms.
const EXPIRES: TableDefinition<&str, u64> = TableDefinition::new("analytics_expires");
/// (expiry, task): the tasks by expiry, soonest first.
const EXPIRY_ORDER: TableDefinition<(u64, &str), ()> = TableDefinition::new("analytics_expiry_order");
/// (minute's start, Unix ms; field, see [`Minute::fields`]) → value: the last hour by minute.
const MINUTES: TableDefinition<(u64, &str), u64> = TableDefinition::new("analytics_minutes");

/// Most tasks whose times expired that one recording forgets besides its own, and most rows of
/// minutes before the last hour it drops (a recording adds at most 13 rows to a minute, so old
/// minutes go faster than new ones come).
const SWEEP_BATCH: usize = 100;

/// The statistics in the analytics group's embedded file (see the module docs).
#[derive(Debug, Clone)]
pub struct EmbeddedStore {
    dedup: EmbeddedDedup,
    task_ttl_ms: u64,
    clock: Arc<dyn Clock>,
}

fn embedded(error: imagepipe_runtime::embedded::EmbeddedError) -> StoreError {
    StoreError::Embedded(error)
}

impl EmbeddedStore {
    /// The statistics in the file of `dedup` (the analytics group's, created when new), which
    /// every recorded event is marked in; task times kept `task_ttl` after their last event by
    /// `clock`.
    pub async fn open(dedup: EmbeddedDedup, task_ttl: Duration, clock: Arc<dyn Clock>) -> Result<Self, StoreError> {
        dedup
            .db()
            .write("creating the analytics tables", |txn| {
                txn.open_table(COUNTERS)?;
                txn.open_table(LATENCIES)?;
                txn.open_table(STAGES)?;
                txn.open_table(EXPIRES)?;
                txn.open_table(EXPIRY_ORDER)?;
                txn.open_table(MINUTES)?;
                Ok(())
            })
            .await
            .map_err(embedded)?;
        let task_ttl_ms = millis(task_ttl).max(1);
        Ok(Self { dedup, task_ttl_ms, clock })
    }

    /// Tasks whose stage times are held and not expired.
    pub async fn tasks_tracked(&self) -> Result<usize, StoreError> {
        let now = self.clock.unix_ms();
        let db = self.dedup.db();
        db.read("counting tracked tasks", move |txn| {
            let mut live = 0;
            for row in txn.open_table(EXPIRES)?.iter()? {
                live += usize::from(row?.1.value() > now);
            }
            Ok(live)
        })
        .await
        .map_err(embedded)
    }

    /// Minutes whose buckets the file holds, those before the last hour not dropped yet
    /// included.
    pub async fn minutes_held(&self) -> Result<usize, StoreError> {
        let db = self.dedup.db();
        db.read("counting minutes", move |txn| {
            let mut minutes = std::collections::BTreeSet::new();
            for row in txn.open_table(MINUTES)?.iter()? {
                minutes.insert(row?.0.value().0);
            }
            Ok(minutes.len())
        })
        .await
        .map_err(embedded)
    }

    /// [`StatsStore::record`] inside `txn`, at `now` (Unix ms).
    fn record_in(&self, txn: &WriteTransaction, update: &Update, now: u64) -> Result<Vec<(Span, u64)>, redb::Error> {
        if !self.dedup.mark_in(txn, &update.event_id)? {
            return Ok(Vec::new());
        }
        let mut expires = txn.open_table(EXPIRES)?;
        let mut order = txn.open_table(EXPIRY_ORDER)?;
        let mut stages = txn.open_table(STAGES)?;
        let mut expired = Vec::new();
        for row in order.iter()?.take(SWEEP_BATCH) {
            let (key, _) = row?;
            let (at, task) = key.value();
            if at > now {
                break;
            }
            expired.push(task.to_owned());
        }
        let own_expired = match update.task_id.as_deref() {
            Some(task_id) => expires.get(task_id)?.is_some_and(|at| at.value() <= now).then_some(task_id),
            None => None,
        };
        for task in expired.iter().map(String::as_str).chain(own_expired) {
            forget(&mut expires, &mut order, &mut stages, task)?;
        }
        let mut minutes = txn.open_table(MINUTES)?;
        drop_minutes_before(&mut minutes, Window::ending_at(now).first_minute())?;

        let mut counters = txn.open_table(COUNTERS)?;
        for (field, value) in counter_fields(update) {
            let current = counters.get(field.as_str())?.map_or(0, |v| v.value());
            counters.insert(field.as_str(), current.saturating_add(value))?;
        }

        let mut recorded = Vec::new();
        // A queue event belongs to no task: it only counts.
        if let Some(task_id) = update.task_id.as_deref() {
            if let Some(stage) = update.stage {
                if stages.get((task_id, stage.as_str()))?.is_none() {
                    stages.insert((task_id, stage.as_str()), update.timestamp)?;
                    let mut latencies = txn.open_table(LATENCIES)?;
                    for span in Span::touching(stage) {
                        let (from, to) = span.stages();
                        let from = stages.get((task_id, from.as_str()))?.map(|v| v.value());
                        let to = stages.get((task_id, to.as_str()))?.map(|v| v.value());
                        if let (Some(from), Some(to)) = (from, to) {
                            let ms = Span::latency(from, to);
                            add_sample(&mut latencies, span, ms)?;
                            recorded.push((span, ms));
                        }
                    }
                }
                if let Some(previous) = expires.insert(task_id, now.saturating_add(self.task_ttl_ms))? {
                    order.remove((previous.value(), task_id))?;
                }
                order.insert((now.saturating_add(self.task_ttl_ms), task_id), ())?;
            }
            let known = stages
                .range((task_id, "")..)?
                .take_while(|row| row.as_ref().is_ok_and(|(k, _)| k.value().0 == task_id));
            let complete = known.count() == Stage::ALL.len();
            if update.ends_measurement() || complete {
                forget(&mut expires, &mut order, &mut stages, task_id)?;
            }
        }
        if let Some(minute) = window::bucket_minute(update.timestamp, now)
            && Minute::changed_by(update, &recorded)
        {
            add_to_minute(&mut minutes, minute, update, &recorded)?;
        }
        Ok(recorded)
    }
}

/// Adds what `update` (with the `latencies` it completed) adds to the bucket of `minute`.
fn add_to_minute(
    minutes: &mut Table<(u64, &str), u64>,
    minute: u64,
    update: &Update,
    latencies: &[(Span, u64)],
) -> Result<(), redb::Error> {
    let mut bucket = Minute::default();
    for row in minutes.range((minute, "")..(minute + MINUTE_MS, ""))? {
        let (key, value) = row?;
        bucket
            .set_field(key.value().1, value.value())
            .map_err(|e| redb::Error::Corrupted(format!("analytics_minutes: {e}")))?;
    }
    let before: HashMap<String, u64> = bucket.fields().into_iter().collect();
    bucket.record(update, latencies);
    for (field, value) in bucket.fields() {
        if before.get(&field) != Some(&value) {
            minutes.insert((minute, field.as_str()), value)?;
        }
    }
    Ok(())
}

/// Drops up to [`SWEEP_BATCH`] rows of minutes before `first` (Unix ms).
fn drop_minutes_before(minutes: &mut Table<(u64, &str), u64>, first: u64) -> Result<(), redb::Error> {
    for _ in 0..SWEEP_BATCH {
        let old = minutes.first()?.is_some_and(|(key, _)| key.value().0 < first);
        if !old {
            break;
        }
        minutes.pop_first()?;
    }
    Ok(())
}

/// Adds a sample of `ms` to `span`'s histogram in `latencies`.
fn add_sample(latencies: &mut Table<&str, u64>, span: Span, ms: u64) -> Result<(), redb::Error> {
    let prefix = format!("{}:", span.as_str());
    let mut histogram = Histogram::new();
    for row in latencies.range(prefix.as_str()..)? {
        let (field, value) = row?;
        let Some(part) = field.value().strip_prefix(&prefix) else { break };
        histogram
            .set_field(part, value.value())
            .map_err(|e| redb::Error::Corrupted(format!("analytics_latencies: {e}")))?;
    }
    histogram.record(ms);
    for (part, value) in histogram.fields() {
        latencies.insert(format!("{prefix}{part}").as_str(), value)?;
    }
    Ok(())
}

/// Drops `task`'s stage times and expiry.
fn forget(
    expires: &mut Table<&str, u64>,
    order: &mut Table<(u64, &str), ()>,
    stages: &mut Table<(&str, &str), u64>,
    task: &str,
) -> Result<(), redb::Error> {
    if let Some(at) = expires.remove(task)? {
        order.remove((at.value(), task))?;
    }
    for stage in Stage::ALL {
        stages.remove((task, stage.as_str()))?;
    }
    Ok(())
}

#[async_trait]
impl StatsStore for EmbeddedStore {
    async fn record(&self, update: &Update) -> Result<Vec<(Span, u64)>, StoreError> {
        let (this, update, now) = (self.clone(), update.clone(), self.clock.unix_ms());
        let db = self.dedup.db();
        db.write("recording an event", move |txn| this.record_in(txn, &update, now)).await.map_err(embedded)
    }

    async fn snapshot(&self) -> Result<Stats, StoreError> {
        type Rows = Vec<(String, u64)>;
        let rows = |table: &redb::ReadOnlyTable<&str, u64>| -> Result<Rows, redb::Error> {
            table.iter()?.map(|row| row.map(|(k, v)| (k.value().to_owned(), v.value())).map_err(Into::into)).collect()
        };
        let last_hour = Window::ending_at(self.clock.unix_ms());
        let first = last_hour.first_minute();
        let (counters, latencies, minutes) = self
            .dedup
            .db()
            .read("reading statistics", move |txn| {
                let minutes: Vec<(u64, String, u64)> = txn
                    .open_table(MINUTES)?
                    .range((first, "")..)?
                    .map(|row| row.map(|(k, v)| (k.value().0, k.value().1.to_owned(), v.value())))
                    .collect::<Result<_, _>>()?;
                Ok((rows(&txn.open_table(COUNTERS)?)?, rows(&txn.open_table(LATENCIES)?)?, minutes))
            })
            .await
            .map_err(embedded)?;
        let mut stats = Stats { last_hour, ..Stats::default() };
        for (field, value) in counters {
            stats.add_counter(&field, value)?;
        }
        for (field, value) in latencies {
            stats.set_latency_field(&field, value)?;
        }
        for (minute, field, value) in minutes {
            if let Some(bucket) = stats.last_hour.bucket_mut(minute) {
                bucket.set_field(&field, value)?;
            }
        }
        Ok(stats)
    }
}
