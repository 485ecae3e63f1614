//! Redis memory per finished task, measured (docs/performance.md, "Redis memory per task"): `TASKS` tasks (10,000 by
//! default) run to completion through the real coordinator on the Redis store, the no-op
//! stages of `imagepipe bench` and the three subscribers (notification, tag indexer,
//! analytics, each deduplicating in Redis), all on the in-process bus. Then it sums
//! `MEMORY USAGE <key> SAMPLES 0` over every key the run wrote, by kind, and reads the growth
//! of `INFO memory`'s `used_memory`; both per task. The run's keys are deleted at the end.
//!
//! ```sh
//! cargo run --release -p imagepipe --example redis_footprint -- [TASKS] [REDIS_URL]
//! ```
//!
//! Every task has an idempotency key and a URL of a typical length; the no-op stages report
//! outputs of realistic size (`imagepipe::bench::noop`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use imagepipe::bench::noop;
use imagepipe_bus::{Bus, Message};
use imagepipe_contracts::SubmitTask;
use imagepipe_contracts::names::queues;
use imagepipe_coordinator::app::{Coordinator, open_store};
use imagepipe_runtime::clock::SystemClock;
use imagepipe_runtime::config::StoreKind;
use imagepipe_runtime::{Settings, Shutdown};
use redis::aio::MultiplexedConnection;
use tokio::task::JoinSet;

/// Longest wait for the tasks, then for the subscribers.
const PATIENCE: Duration = Duration::from_secs(900);

type Failure = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main]
async fn main() -> Result<(), Failure> {
    let mut args = std::env::args().skip(1);
    let tasks: usize = args.next().map_or(Ok(10_000), |n| n.parse())?;
    let url = args.next().unwrap_or_else(|| "redis://127.0.0.1:6379".into());
    let mut settings = Settings::default();
    // A prefix of the default's length (`imagepipe`): every key holds it, most twice (once in
    // the hash tag), so a longer one would inflate every figure. `IMAGEPIPE_FOOTPRINT_PREFIX`
    // sets another (e.g. the 42 characters of `footprint-<uuid>` earlier figures used).
    settings.bus.prefix = std::env::var("IMAGEPIPE_FOOTPRINT_PREFIX")
        .unwrap_or_else(|_| format!("fp{}", &uuid::Uuid::new_v4().simple().to_string()[..7]));
    settings.store.kind = StoreKind::Redis;
    settings.store.redis.url = imagepipe_runtime::config::SecretUrl::new(url.clone());
    let prefix = settings.bus.prefix.clone();
    let mut redis = redis::Client::open(url.as_str())?.get_multiplexed_async_connection().await?;

    let used_before = used_memory(&mut redis).await?;
    let run = run_pipeline(&settings, tasks, &mut redis).await;
    let measured = match run {
        Ok(()) => Some(measure(&mut redis, &prefix, tasks).await?),
        Err(e) => {
            eprintln!("the run failed: {e}");
            None
        }
    };
    let used_after = used_memory(&mut redis).await?;
    let deleted = delete_keys(&mut redis, &prefix).await?;
    let Some(by_kind) = measured else { return Err("no measurement".into()) };

    println!("{tasks} finished tasks, prefix {prefix} ({deleted} keys deleted afterwards)\n");
    println!("{:<44} {:>9} {:>13} {:>10}", "keys", "count", "MEMORY USAGE", "per task");
    let mut total = 0;
    for (kind, (count, bytes)) in &by_kind {
        total += bytes;
        println!("{kind:<44} {count:>9} {bytes:>13} {:>10.0}", *bytes as f64 / tasks as f64);
    }
    println!("{:<44} {:>9} {total:>13} {:>10.0}", "total", "", total as f64 / tasks as f64);
    let grown = used_after.saturating_sub(used_before);
    println!("\nINFO used_memory grew by {grown} bytes: {:.0} per task", grown as f64 / tasks as f64);
    Ok(())
}

/// Runs `tasks` tasks through the coordinator, the no-op stages and the subscribers, and waits
/// until every subscriber has handled every task's events.
async fn run_pipeline(settings: &Settings, tasks: usize, redis: &mut MultiplexedConnection) -> Result<(), Failure> {
    let bus = Bus::connect(&settings.bus).await?;
    for subscription in [
        imagepipe_notification_worker::subscription(settings),
        imagepipe_tag_indexer_worker::subscription(settings),
        imagepipe_analytics_worker::subscription(settings),
    ] {
        bus.events.subscribe(subscription).await?;
    }
    let stop = Shutdown::new();
    let mut services: JoinSet<Result<(), String>> = JoinSet::new();
    let coordinator = Coordinator::new(settings, open_store(settings).await?, bus.clone(), Arc::new(SystemClock));
    let s = stop.clone();
    services.spawn(async move { coordinator.run(s).await.map_err(|e| e.to_string()) });
    noop::spawn(&bus, settings, &stop, &mut services).await?;
    let index = imagepipe_tag_indexer_worker::open_index(settings).await?;
    let stats = imagepipe_analytics_worker::open_store(settings).await?;
    let (b, s, st) = (bus.clone(), settings.clone(), stop.clone());
    services.spawn(async move { imagepipe_tag_indexer_worker::run(b, &s, index, st).await.map_err(|e| e.to_string()) });
    let (b, s, st) = (bus.clone(), settings.clone(), stop.clone());
    services.spawn(async move { imagepipe_analytics_worker::run(b, &s, stats, st).await.map_err(|e| e.to_string()) });
    let (b, s, st) = (bus.clone(), settings.clone(), stop.clone());
    services.spawn(async move { imagepipe_notification_worker::run(b, &s, st).await.map_err(|e| e.to_string()) });

    let started = Instant::now();
    let submits: Vec<Message> = (0..tasks)
        .map(|i| {
            let submit = SubmitTask {
                task_id: Some(format!("tsk_{}", uuid::Uuid::new_v4().simple())),
                idempotency_key: Some(format!("order-{i:08}")),
                ..SubmitTask::url(format!("https://images.example.com/uploads/2026/11/24/{i:08}-original.jpg"))
            };
            Message::new(serde_json::to_vec(&submit).expect("a submit serializes"))
        })
        .collect();
    for batch in submits.chunks(500) {
        bus.queues.send_batch(queues::SUBMIT, batch.to_vec()).await?;
    }
    let p = &settings.bus.prefix;
    let finished = format!("{p}:{{{p}:idx}}:finished");
    wait_for(redis, "finished tasks", tasks, started, |r| zcard(r, finished.clone())).await?;
    let indexed = format!("{p}:{{{p}:tags}}:indexed");
    wait_for(redis, "tag-indexed tasks", tasks, started, |r| zcard(r, indexed.clone())).await?;
    let analytics = imagepipe_runtime::dedup::redis_group_tag(p, imagepipe_analytics_worker::GROUP);
    let counters = format!("{p}:{analytics}:counters");
    wait_for(redis, "tasks counted by analytics", tasks, started, |r| completed_count(r, counters.clone())).await?;
    let notified = format!("{}:*", imagepipe_runtime::dedup::redis_prefix(p, imagepipe_notification_worker::GROUP));
    wait_for(redis, "events handled by notification", tasks, started, |r| count_keys(r, notified.clone())).await?;
    println!("ran {tasks} tasks in {:.1} s", started.elapsed().as_secs_f64());

    stop.trigger();
    while let Some(joined) = services.join_next().await {
        joined?.map_err(|e| -> Failure { e.into() })?;
    }
    Ok(())
}

/// Polls `count` until it reaches `want`, printing progress; fails after [`PATIENCE`].
async fn wait_for<F, Fut>(
    redis: &mut MultiplexedConnection,
    what: &str,
    want: usize,
    started: Instant,
    count: F,
) -> Result<(), Failure>
where
    F: Fn(MultiplexedConnection) -> Fut,
    Fut: Future<Output = redis::RedisResult<usize>>,
{
    let mut last = usize::MAX;
    loop {
        let n = count(redis.clone()).await?;
        if n != last {
            eprintln!("{:>6.1} s  {what}: {n}/{want}", started.elapsed().as_secs_f64());
            last = n;
        }
        if n >= want {
            return Ok(());
        }
        if started.elapsed() > PATIENCE {
            return Err(format!("{what}: {n} of {want} after {PATIENCE:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn zcard(mut redis: MultiplexedConnection, key: String) -> redis::RedisResult<usize> {
    redis::cmd("ZCARD").arg(key).query_async(&mut redis).await
}

async fn completed_count(mut redis: MultiplexedConnection, key: String) -> redis::RedisResult<usize> {
    let n: Option<usize> = redis::cmd("HGET").arg(key).arg("tasks:completed").query_async(&mut redis).await?;
    Ok(n.unwrap_or(0))
}

async fn count_keys(mut redis: MultiplexedConnection, pattern: String) -> redis::RedisResult<usize> {
    Ok(keys(&mut redis, &pattern).await?.len())
}

async fn keys(redis: &mut MultiplexedConnection, pattern: &str) -> redis::RedisResult<Vec<String>> {
    let mut cursor = 0u64;
    let mut all = Vec::new();
    loop {
        let (next, batch): (u64, Vec<String>) =
            redis::cmd("SCAN").arg(cursor).arg("MATCH").arg(pattern).arg("COUNT").arg(5_000).query_async(redis).await?;
        all.extend(batch);
        if next == 0 {
            return Ok(all);
        }
        cursor = next;
    }
}

/// What a key of the run holds, by its name.
fn kind_of(prefix: &str, key: &str) -> String {
    let rest = key.strip_prefix(prefix).and_then(|r| r.strip_prefix(':')).unwrap_or(key);
    let coordinator = |what: &str| format!("coordinator: {what}");
    if let Some(index) = rest.strip_prefix(&format!("{{{prefix}:idx}}:")) {
        return match index.split(':').next().unwrap_or_default() {
            "blob" => coordinator("blob references (a set per blob)"),
            "task_blobs" => coordinator("blob references (a set per task, before)"),
            _ => coordinator("indexes (sorted sets)"),
        };
    }
    if rest.starts_with(&format!("{{{prefix}:dlq}}")) {
        return coordinator("dead-letter archive");
    }
    if rest.starts_with(&format!("{{{prefix}:tags}}")) {
        return "tag index".into();
    }
    if rest.starts_with(&format!("{{{prefix}:similarity}}")) {
        return "similarity index".into();
    }
    if rest.starts_with(&format!("{{{prefix}:cluster}}")) {
        return coordinator("cluster records (replicas, handovers)");
    }
    if rest.starts_with(&format!("{{{prefix}:{}}}", imagepipe_analytics_worker::GROUP)) {
        return "analytics".into();
    }
    // A shard's keys sit in its slot: `{<short tag>}:task:<id>`, and `{P:s<shard>}:lease`.
    let rest = match rest.strip_prefix('{') {
        Some(tagged) => tagged.split_once("}:").map_or(rest, |(_, key)| key),
        None => rest,
    };
    match rest.split(':').next().unwrap_or_default() {
        "task" => coordinator("task record (hash: the task, its history)"),
        "hist" => coordinator("history (list, before the hash kept it)"),
        "history" => coordinator("history (stream, before lists)"),
        "outbox" => coordinator("outbox (hash)"),
        "idem" => coordinator("idempotency key"),
        "analytics" => "analytics".into(),
        "lease" => coordinator("shard leases"),
        // `dedup:<group>:{<tag>}:<id>`, or `dedup:{<prefix>:<group>}:<id>` before the short tags
        "dedup" => match rest.split(':').nth(1).unwrap_or_default() {
            tagged if tagged.starts_with('{') => {
                format!("dedup: {}", rest.split(':').nth(2).unwrap_or_default().trim_end_matches('}'))
            }
            group => format!("dedup: {group}"),
        },
        other => format!("other ({other})"),
    }
}

/// `MEMORY USAGE` of every key under `prefix:`, summed by kind: (keys, bytes).
async fn measure(
    redis: &mut MultiplexedConnection,
    prefix: &str,
    tasks: usize,
) -> Result<BTreeMap<String, (usize, u64)>, Failure> {
    let all = keys(redis, &format!("{prefix}:*")).await?;
    eprintln!("measuring {} keys of {tasks} tasks", all.len());
    let mut by_kind: BTreeMap<String, (usize, u64)> = BTreeMap::new();
    for chunk in all.chunks(1_000) {
        let mut pipe = redis::pipe();
        for key in chunk {
            pipe.cmd("MEMORY").arg("USAGE").arg(key).arg("SAMPLES").arg(0);
        }
        let sizes: Vec<Option<u64>> = pipe.query_async(redis).await?;
        for (key, size) in chunk.iter().zip(sizes) {
            let entry = by_kind.entry(kind_of(prefix, key)).or_default();
            entry.0 += 1;
            entry.1 += size.unwrap_or(0);
        }
    }
    Ok(by_kind)
}

async fn used_memory(redis: &mut MultiplexedConnection) -> Result<u64, Failure> {
    let info: String = redis::cmd("INFO").arg("memory").query_async(redis).await?;
    let line = info.lines().find_map(|l| l.strip_prefix("used_memory:")).ok_or("INFO memory has no used_memory")?;
    Ok(line.trim().parse()?)
}

async fn delete_keys(redis: &mut MultiplexedConnection, prefix: &str) -> Result<usize, Failure> {
    let all = keys(redis, &format!("{prefix}:*")).await?;
    for chunk in all.chunks(1_000) {
        redis::cmd("UNLINK").arg(chunk).query_async::<()>(redis).await?;
    }
    Ok(all.len())
}
