//! Listing tasks through the index sorted sets.

use super::{RedisStore, redis_err};
use crate::store::{ListOrder, ListQuery, Listing, StoreError, TaskPage, decode};

/// A score bound of a `ZRANGEBYSCORE`: `open` (`-inf` / `+inf`) at the end of the `u64` range.
fn score_arg(score: u64, open: &str) -> String {
    if (open == "-inf" && score == 0) || (open == "+inf" && score == u64::MAX) {
        open.to_owned()
    } else {
        score.to_string()
    }
}

/// The store's [`TaskStore::list`](crate::store::TaskStore::list).
pub(super) async fn tasks(store: &RedisStore, query: &ListQuery) -> Result<TaskPage, StoreError> {
    let mut listing = Listing::new(query)?;
    let Some((lo, hi)) = listing.range() else { return Ok(listing.finish()) };
    let key = query.state.map_or_else(|| store.index_key("all"), |s| store.state_key(s));
    let (min, max) = (score_arg(lo, "-inf"), score_arg(hi, "+inf"));
    // A filtered scan takes growing batches: a page may need many entries.
    let mut batch = (query.limit + 1).clamp(16, 512);
    let mut offset = 0;
    'scan: loop {
        let (command, bounds) = match query.order {
            ListOrder::Oldest => ("ZRANGEBYSCORE", (min.as_str(), max.as_str())),
            ListOrder::Newest => ("ZREVRANGEBYSCORE", (max.as_str(), min.as_str())),
        };
        let rows = store.scored_range(command, &key, bounds, offset, batch, "listing tasks").await?;
        let fetched = rows.len();
        offset += fetched;
        let rows: Vec<(String, u64)> = rows.into_iter().filter(|(id, at)| listing.is_past_cursor(*at, id)).collect();
        let mut pipe = redis::pipe();
        for (id, _) in &rows {
            pipe.hget(store.task_key(id), "task");
        }
        let json: Vec<Option<Vec<u8>>> = if rows.is_empty() {
            Vec::new()
        } else {
            pipe.query_async(&mut store.conn.clone()).await.map_err(redis_err("listing tasks"))?
        };
        for ((id, at), json) in rows.iter().zip(json) {
            // Decoded only when it may match: a label filter skips most tasks unread.
            let task = match json {
                Some(json) if listing.may_match(&json) => Some(decode("task", id, super::scripts::task_json(&json))?),
                _ => None,
            };
            if !listing.offer(*at, id, task) {
                break 'scan;
            }
        }
        if fetched < batch {
            break;
        }
        if listing.is_bounded() {
            batch = (batch * 2).min(1024);
        }
    }
    Ok(listing.finish())
}

impl RedisStore {
    /// Members of sorted set `key` after `cursor`, in score order, `batch` at a time.
    pub(super) async fn range_after(
        &self,
        key: &str,
        cursor: Option<(u64, &str)>,
        offset: usize,
        batch: usize,
    ) -> Result<Vec<(String, u64)>, StoreError> {
        let min = cursor.map_or("-inf".to_owned(), |(at, _)| at.to_string());
        let rows = self.scored_range("ZRANGEBYSCORE", key, (&min, "+inf"), offset, batch, "listing").await?;
        Ok(rows
            .into_iter()
            .filter(|(id, at)| cursor.is_none_or(|(c_at, c_id)| *at > c_at || id.as_str() > c_id))
            .collect())
    }

    /// `command` (`ZRANGEBYSCORE`, or `ZREVRANGEBYSCORE` with `from` the higher bound) of sorted
    /// set `key`: members with their scores, `count` of them after skipping `offset`.
    pub(super) async fn scored_range(
        &self,
        command: &str,
        key: &str,
        (from, to): (&str, &str),
        offset: usize,
        count: usize,
        operation: &'static str,
    ) -> Result<Vec<(String, u64)>, StoreError> {
        redis::cmd(command)
            .arg(key)
            .arg(from)
            .arg(to)
            .arg("WITHSCORES")
            .arg("LIMIT")
            .arg(offset)
            .arg(count)
            .query_async(&mut self.conn.clone())
            .await
            .map_err(redis_err(operation))
    }
}
