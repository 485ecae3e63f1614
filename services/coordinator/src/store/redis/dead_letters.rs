//! The dead-letter archive: a hash of the letters and a sorted set of their order.

use redis::AsyncCommands;

use super::{RedisStore, redis_err};
use crate::store::{DeadLetter, DeadLetterPage, StoreError, TaskStore, decode, encode, make_cursor, parse_cursor};

/// The store's [`TaskStore::put_dead_letter`](crate::store::TaskStore::put_dead_letter).
pub(super) async fn put(store: &RedisStore, letter: &DeadLetter) -> Result<(), StoreError> {
    let letter = letter.capped();
    let mut pipe = redis::pipe();
    pipe.atomic()
        .hset(store.dlq_key("entries"), &letter.id, encode(&letter))
        .ignore()
        .cmd("ZADD")
        .arg(store.dlq_key("order"))
        .arg("NX")
        .arg(letter.dead_lettered_at)
        .arg(&letter.id)
        .ignore();
    pipe.query_async::<()>(&mut store.conn.clone()).await.map_err(redis_err("archiving a dead letter"))
}

/// The store's [`TaskStore::trim_dead_letters`](crate::store::TaskStore::trim_dead_letters).
pub(super) async fn trim(store: &RedisStore, before: u64, max_entries: u64, max: usize) -> Result<usize, StoreError> {
    store
        .trim_dead_letters
        .key(store.dlq_key("entries"))
        .key(store.dlq_key("order"))
        .arg(before)
        .arg(max_entries)
        .arg(max)
        .invoke_async(&mut store.conn.clone())
        .await
        .map_err(redis_err("trimming dead letters"))
}

/// The store's [`TaskStore::dead_letters`](crate::store::TaskStore::dead_letters).
pub(super) async fn page(store: &RedisStore, limit: usize, cursor: Option<&str>) -> Result<DeadLetterPage, StoreError> {
    let cursor = cursor.map(parse_cursor).transpose()?;
    let rows = store.range_after(&store.dlq_key("order"), cursor, 0, limit + 1 + usize::from(cursor.is_some())).await?;
    let more = rows.len() > limit;
    let mut entries = Vec::new();
    for (id, _) in rows.into_iter().take(limit) {
        if let Some(letter) = store.dead_letter(&id).await? {
            entries.push(letter);
        }
    }
    let next_cursor = more.then(|| entries.last().map(|e| make_cursor(e.dead_lettered_at, &e.id))).flatten();
    Ok(DeadLetterPage { entries, next_cursor })
}

/// The store's [`TaskStore::dead_letter`](crate::store::TaskStore::dead_letter).
pub(super) async fn get(store: &RedisStore, id: &str) -> Result<Option<DeadLetter>, StoreError> {
    let json: Option<Vec<u8>> =
        store.conn.clone().hget(store.dlq_key("entries"), id).await.map_err(redis_err("reading a dead letter"))?;
    json.map(|j| decode("dead letter", id, &j)).transpose()
}

/// The store's [`TaskStore::remove_dead_letter`](crate::store::TaskStore::remove_dead_letter).
pub(super) async fn remove(store: &RedisStore, id: &str) -> Result<bool, StoreError> {
    let mut pipe = redis::pipe();
    pipe.atomic().hdel(store.dlq_key("entries"), id).zrem(store.dlq_key("order"), id).ignore();
    let (removed,): (u32,) =
        pipe.query_async(&mut store.conn.clone()).await.map_err(redis_err("removing a dead letter"))?;
    Ok(removed == 1)
}

/// The store's [`TaskStore::count_dead_letters`](crate::store::TaskStore::count_dead_letters).
pub(super) async fn count(store: &RedisStore) -> Result<u64, StoreError> {
    store.conn.clone().zcard(store.dlq_key("order")).await.map_err(redis_err("counting dead letters"))
}
