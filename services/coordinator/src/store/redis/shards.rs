//! The cluster's records (replicas, leases, handovers) and the per-shard claims and queues.

use std::collections::{BTreeSet, VecDeque};
use std::time::Duration;

use redis::AsyncCommands;

use super::{RedisStore, redis_err};
use crate::store::{HANDOVERS_KEPT, Handover, Lease, Replica, StoreError, decode, encode};
use crate::task::{Task, TaskState};

/// Milliseconds of `d`, saturated.
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Sends `pipe` (whose scripts are all `script`'s); when the server lost the script, loads it
/// and sends the pipeline again (each of the pipelines in this module is repeatable).
async fn query_scripts<T: redis::FromRedisValue>(
    store: &RedisStore,
    pipe: &redis::Pipeline,
    script: &redis::Script,
    operation: &'static str,
) -> Result<T, StoreError> {
    let mut conn = store.conn.clone();
    match pipe.query_async::<T>(&mut conn).await {
        Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
            script.prepare_invoke().load_async(&mut conn).await.map_err(redis_err(operation))?;
            pipe.query_async::<T>(&mut conn).await.map_err(redis_err(operation))
        }
        other => other.map_err(redis_err(operation)),
    }
}

fn check_replica_id(id: &str, operation: &'static str) -> Result<(), StoreError> {
    if id.is_empty() { Err(StoreError::EmptyReplicaId { operation }) } else { Ok(()) }
}

/// The store's [`TaskStore::heartbeat`](crate::store::TaskStore::heartbeat).
pub(super) async fn heartbeat(store: &RedisStore, replica: &Replica, ttl: Duration) -> Result<(), StoreError> {
    check_replica_id(&replica.id, "announcing a replica")?;
    let until = replica.heartbeat_at.saturating_add(millis(ttl));
    let mut pipe = redis::pipe();
    pipe.atomic()
        .hset(store.cluster_key("replicas"), &replica.id, encode(replica))
        .ignore()
        .zadd(store.cluster_key("alive"), &replica.id, until)
        .ignore();
    pipe.query_async::<()>(&mut store.conn.clone()).await.map_err(redis_err("announcing a replica"))
}

/// The store's [`TaskStore::replicas`](crate::store::TaskStore::replicas).
pub(super) async fn replicas(store: &RedisStore, now: u64) -> Result<Vec<Replica>, StoreError> {
    let json: Vec<Option<Vec<u8>>> = store
        .live_replicas
        .key(store.cluster_key("replicas"))
        .key(store.cluster_key("alive"))
        .arg(now)
        .invoke_async(&mut store.conn.clone())
        .await
        .map_err(redis_err("reading replicas"))?;
    let mut replicas: Vec<Replica> =
        json.iter().flatten().map(|j| decode("replica", "announcement", j)).collect::<Result<_, _>>()?;
    replicas.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(replicas)
}

/// The store's [`TaskStore::leave`](crate::store::TaskStore::leave).
pub(super) async fn leave(store: &RedisStore, id: &str) -> Result<(), StoreError> {
    let mut pipe = redis::pipe();
    pipe.atomic().hdel(store.cluster_key("replicas"), id).ignore().zrem(store.cluster_key("alive"), id).ignore();
    pipe.query_async::<()>(&mut store.conn.clone()).await.map_err(redis_err("withdrawing a replica"))
}

/// The store's [`TaskStore::acquire_shards`](crate::store::TaskStore::acquire_shards): one
/// script per shard, in one pipeline.
pub(super) async fn acquire(
    store: &RedisStore,
    owner: &str,
    shards: &[u16],
    now: u64,
    ttl: Duration,
) -> Result<Vec<Option<Lease>>, StoreError> {
    check_replica_id(owner, "acquiring shards")?;
    if shards.is_empty() {
        return Ok(Vec::new());
    }
    let until = now.saturating_add(millis(ttl));
    let mut pipe = redis::pipe();
    for shard in shards {
        pipe.invoke_script(store.acquire.key(store.lease_key(*shard)).arg(owner).arg(now).arg(until));
    }
    let tokens: Vec<Option<u64>> = query_scripts(store, &pipe, &store.acquire, "acquiring shards").await?;
    Ok(shards
        .iter()
        .zip(tokens)
        .map(|(shard, token)| {
            token.map(|token| Lease { shard: *shard, owner: owner.to_owned(), token, expires_at: until })
        })
        .collect())
}

/// The store's [`TaskStore::release_shards`](crate::store::TaskStore::release_shards).
pub(super) async fn release(store: &RedisStore, owner: &str, leases: &[Lease]) -> Result<(), StoreError> {
    check_replica_id(owner, "releasing shards")?;
    if leases.is_empty() {
        return Ok(());
    }
    let mut pipe = redis::pipe();
    for lease in leases {
        pipe.invoke_script(store.release_lease.key(store.lease_key(lease.shard)).arg(owner).arg(lease.token));
    }
    query_scripts::<Vec<i64>>(store, &pipe, &store.release_lease, "releasing shards").await.map(|_| ())
}

/// The store's [`TaskStore::leases`](crate::store::TaskStore::leases): the record of each of
/// the store's shards, in one round trip.
pub(super) async fn leases(store: &RedisStore) -> Result<Vec<Lease>, StoreError> {
    let mut pipe = redis::pipe();
    for shard in 0..store.shards {
        pipe.cmd("HMGET").arg(store.lease_key(shard)).arg("owner").arg("token").arg("expires_at");
    }
    let rows: Vec<(Option<String>, Option<u64>, Option<u64>)> =
        pipe.query_async(&mut store.conn.clone()).await.map_err(redis_err("reading leases"))?;
    Ok((0..store.shards)
        .zip(rows)
        .filter_map(|(shard, (owner, token, expires_at))| {
            Some(Lease { shard, owner: owner.unwrap_or_default(), token: token?, expires_at: expires_at.unwrap_or(0) })
        })
        .collect())
}

/// The store's [`TaskStore::record_handovers`](crate::store::TaskStore::record_handovers).
pub(super) async fn record_handovers(store: &RedisStore, handovers: &[Handover]) -> Result<(), StoreError> {
    if handovers.is_empty() {
        return Ok(());
    }
    let key = store.cluster_key("handovers");
    let json: Vec<String> = handovers.iter().map(encode).collect();
    let mut pipe = redis::pipe();
    pipe.atomic().lpush(&key, json).ignore().ltrim(&key, 0, HANDOVERS_KEPT as isize - 1).ignore();
    pipe.query_async::<()>(&mut store.conn.clone()).await.map_err(redis_err("recording handovers"))
}

/// The store's [`TaskStore::handovers`](crate::store::TaskStore::handovers).
pub(super) async fn handovers(store: &RedisStore, limit: usize) -> Result<Vec<Handover>, StoreError> {
    let limit = limit.min(HANDOVERS_KEPT);
    if limit == 0 {
        return Ok(Vec::new());
    }
    let json: Vec<Vec<u8>> = store
        .conn
        .clone()
        .lrange(store.cluster_key("handovers"), 0, limit as isize - 1)
        .await
        .map_err(redis_err("reading handovers"))?;
    json.iter().map(|j| decode("handover", "log", j)).collect()
}

/// The store's [`TaskStore::claim_due_in`](crate::store::TaskStore::claim_due_in): one script
/// over the shards' due and claimed sets.
pub(super) async fn claim_due_in(
    store: &RedisStore,
    shards: &[u16],
    now: u64,
    lease: Duration,
    max: usize,
) -> Result<Vec<String>, StoreError> {
    let shards: BTreeSet<u16> = shards.iter().copied().filter(|s| *s < store.shards).collect();
    if shards.is_empty() || max == 0 {
        return Ok(Vec::new());
    }
    let mut invocation = store.claim_in.key(store.index_key("due"));
    invocation.key(store.index_key("claimed"));
    for shard in shards {
        invocation.key(store.shard_index_key("due", shard)).key(store.shard_index_key("claimed", shard));
    }
    invocation
        .arg(now)
        .arg(now.saturating_add(millis(lease)))
        .arg(max)
        .invoke_async(&mut store.conn.clone())
        .await
        .map_err(redis_err("claiming due tasks"))
}

/// The store's [`TaskStore::claim_due`](crate::store::TaskStore::claim_due), over every shard:
/// reads the candidates of the global sets (leases run out and due entries), then claims those
/// still due in one script that keeps the per-shard sets in step.
pub(super) async fn claim_due(
    store: &RedisStore,
    now: u64,
    lease: Duration,
    max: usize,
) -> Result<Vec<String>, StoreError> {
    if max == 0 {
        return Ok(Vec::new());
    }
    let (expired, due): (Vec<String>, Vec<String>) = redis::pipe()
        .cmd("ZRANGEBYSCORE")
        .arg(store.index_key("claimed"))
        .arg("-inf")
        .arg(now)
        .arg("LIMIT")
        .arg(0)
        .arg(max)
        .cmd("ZRANGEBYSCORE")
        .arg(store.index_key("due"))
        .arg("-inf")
        .arg(now)
        .arg("LIMIT")
        .arg(0)
        .arg(max)
        .query_async(&mut store.conn.clone())
        .await
        .map_err(redis_err("claiming due tasks"))?;
    if expired.is_empty() && due.is_empty() {
        return Ok(Vec::new());
    }
    let mut invocation = store.claim_listed.key(store.index_key("due"));
    invocation.key(store.index_key("claimed")).arg(now).arg(now.saturating_add(millis(lease)));
    // A lease run out first: it returns to the due set at `now`, before the later due entries.
    for (id, expired) in expired.iter().map(|id| (id, "1")).chain(due.iter().map(|id| (id, "0"))) {
        let shard = store.shard(id);
        invocation.key(store.shard_index_key("due", shard)).key(store.shard_index_key("claimed", shard));
        invocation.arg(id).arg(expired);
    }
    let mut ids: Vec<String> =
        invocation.invoke_async(&mut store.conn.clone()).await.map_err(redis_err("claiming due tasks"))?;
    ids.truncate(max);
    Ok(ids)
}

/// One shard's queued set as [`queued_in`] reads it: rows fetched and not yet taken (score,
/// id; in order), the offset and size of the next page, whether the set has more.
struct Head {
    rows: VecDeque<(u64, String)>,
    next: usize,
    page: usize,
    exhausted: bool,
}

impl Head {
    /// Whether the merge must fetch this shard's next page before it can take another row.
    fn needs_page(&self) -> bool {
        self.rows.is_empty() && !self.exhausted
    }
}

/// Largest page of one shard's queued set read at once.
const MAX_PAGE: usize = 512;

/// The store's [`TaskStore::queued_in`](crate::store::TaskStore::queued_in): merges the
/// shards' queued sets in score order (priority band, then creation time, then id), a page per
/// shard at a time, and keeps the tasks still queued. The scores say which rows are wanted (a
/// row past `room` only while it is in the high band), so only those tasks are read. A shard's
/// first page is its share of `max` and a few more; a shard that runs out of rows in hand
/// reads a page twice as large the next time.
pub(super) async fn queued_in(
    store: &RedisStore,
    shards: &[u16],
    room: usize,
    max: usize,
) -> Result<Vec<Task>, StoreError> {
    let shards: Vec<u16> =
        shards.iter().copied().filter(|s| *s < store.shards).collect::<BTreeSet<_>>().into_iter().collect();
    if shards.is_empty() || max == 0 {
        return Ok(Vec::new());
    }
    let first_page = (max.div_ceil(shards.len()) + 4).min(MAX_PAGE);
    let mut heads: Vec<Head> =
        shards.iter().map(|_| Head { rows: VecDeque::new(), next: 0, page: first_page, exhausted: false }).collect();
    let mut out = Vec::new();
    let mut done = false;
    while out.len() < max && !done {
        let refill: Vec<usize> = (0..heads.len()).filter(|i| heads[*i].needs_page()).collect();
        if !refill.is_empty() {
            let mut pipe = redis::pipe();
            for i in &refill {
                let (key, head) = (store.shard_index_key("queued", shards[*i]), &heads[*i]);
                pipe.cmd("ZRANGE").arg(key).arg(head.next).arg(head.next + head.page - 1).arg("WITHSCORES");
            }
            let pages: Vec<Vec<(String, u64)>> =
                pipe.query_async(&mut store.conn.clone()).await.map_err(redis_err("listing queued tasks"))?;
            for (i, rows) in refill.into_iter().zip(pages) {
                let head = &mut heads[i];
                head.next += rows.len();
                head.exhausted = rows.len() < head.page;
                head.page = (head.page * 2).min(MAX_PAGE);
                head.rows.extend(rows.into_iter().map(|(id, score)| (score, id)));
            }
        }
        // The smallest rows while every shard that has more still has rows in hand.
        let mut candidates = Vec::new();
        while out.len() + candidates.len() < max && !heads.iter().any(Head::needs_page) {
            let Some(head) = heads.iter_mut().filter(|h| !h.rows.is_empty()).min_by(|a, b| a.rows[0].cmp(&b.rows[0]))
            else {
                done = true;
                break;
            };
            if out.len() + candidates.len() >= room && !Task::queued_score_is_high(head.rows[0].0) {
                done = true;
                break;
            }
            candidates.extend(head.rows.pop_front().map(|(_, id)| id));
        }
        if candidates.is_empty() {
            continue;
        }
        let ids: Vec<&str> = candidates.iter().map(String::as_str).collect();
        let tasks = store.read_tasks(&ids).await?;
        out.extend(tasks.into_iter().flatten().filter(|t| t.state == TaskState::Queued));
    }
    out.truncate(max);
    Ok(out)
}
