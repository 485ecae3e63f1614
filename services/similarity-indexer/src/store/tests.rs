//! The same cases against [`EmbeddedStore`] and [`RedisStore`] (a real Redis and a real Redis
//! Cluster, a unique prefix per test).

use std::sync::Arc;

use imagepipe_contracts::Embedding;
use imagepipe_runtime::embedded::EmbeddedDb;

use super::*;

const T0: u64 = 1_763_800_000_000;

async fn stores(test: &str) -> (Vec<Arc<dyn SimilarityStore>>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let db = EmbeddedDb::open(&dir.path().join("similarity.redb")).unwrap();
    let mut stores: Vec<Arc<dyn SimilarityStore>> = vec![Arc::new(EmbeddedStore::open(db).await.unwrap())];
    for (_, url) in imagepipe_contracts::testing::redis_urls() {
        let prefix = format!("test-similarity-{test}-{}", uuid::Uuid::new_v4().simple());
        match RedisStore::connect(&url, &prefix).await {
            Ok(store) => stores.push(Arc::new(store)),
            Err(error) => imagepipe_contracts::testing::environment_missing(&format!("Redis at {url}: {error}")),
        }
    }
    (stores, dir)
}

fn embedding(seed: f32) -> Embedding {
    Embedding::from_features("m@1/pool", &[1.0, seed, 0.5, 0.25]).unwrap()
}

fn metadata(phash: u64) -> Change {
    let labels = [("album".to_owned(), format!("a{phash}"))].into();
    Change::Metadata { phash: Some(phash), thumbnail_key: format!("sha256:{phash:x}/thumb"), labels }
}

async fn all_changes(store: &dyn SimilarityStore, after: u64) -> Changes {
    let mut changes = Changes::default();
    let mut cursor = after;
    loop {
        let page = store.changes(cursor, 2).await.unwrap();
        changes.epoch = page.epoch;
        let Some(last) = page.items.last() else { return changes };
        cursor = last.seq;
        changes.items.extend(page.items);
    }
}

#[tokio::test]
async fn updates_merge_into_one_entry_and_the_log_gives_each_task_once_in_order() {
    for store in stores("merge").await.0 {
        let first = store.update("t1", T0 + 10, metadata(0xabc)).await.unwrap();
        assert!(!first.is_complete());
        let done = store
            .update("t1", T0, Change::Embedding { embedding: embedding(0.1), labels: Default::default() })
            .await
            .unwrap();
        assert!(done.is_complete());
        assert_eq!((done.created, done.at), (T0, T0 + 10), "first and latest event times");
        assert_eq!(done.phash, Some(0xabc));
        assert_eq!(done.thumbnail_key.as_deref(), Some("sha256:abc/thumb"));
        assert_eq!(done.embedding, Some(embedding(0.1)));
        assert_eq!(done.labels, Default::default(), "the latest event's labels");
        let relabelled = store.update("t1", T0 + 10, metadata(0xabc)).await.unwrap();
        assert_eq!(relabelled.labels.get("album").map(String::as_str), Some("a2748"));
        store.update("t2", T0 + 20, metadata(0xdef)).await.unwrap();
        let pairs = vec![Pair { task_id: "t2".into(), cosine: Some(0.97), phash_distance: Some(3) }];
        let paired = store.update("t1", T0 + 30, Change::Pairs(pairs.clone())).await.unwrap();
        assert_eq!(paired.pairs, pairs);
        assert_eq!(store.entry("t1").await.unwrap(), Some(paired.clone()));
        assert_eq!(store.entry("nobody").await.unwrap(), None);

        let changes = all_changes(store.as_ref(), 0).await;
        let order: Vec<&str> = changes.items.iter().map(|c| c.task_id.as_str()).collect();
        assert_eq!(order, ["t2", "t1"], "each task once, by its latest change");
        assert_eq!(changes.items[1].entry.as_ref(), Some(&paired));
        let after = changes.items[0].seq;
        let later = all_changes(store.as_ref(), after).await;
        assert_eq!(later.items.len(), 1);
        assert_eq!(all_changes(store.as_ref(), changes.items[1].seq).await.items, []);
    }
}

#[tokio::test]
async fn expired_entries_come_back_once_as_removals_then_leave_the_log() {
    for store in stores("expire").await.0 {
        store.update("old", T0, metadata(1)).await.unwrap();
        store.update("new", T0 + 1_000, metadata(2)).await.unwrap();
        let cursor = all_changes(store.as_ref(), 0).await.items.last().unwrap().seq;
        assert_eq!(store.expire(T0, T0 + 5_000, 10).await.unwrap(), 1);
        assert_eq!(store.entry("old").await.unwrap(), None);
        let removal = all_changes(store.as_ref(), cursor).await;
        assert_eq!(removal.items.len(), 1);
        assert_eq!((removal.items[0].task_id.as_str(), &removal.items[0].entry), ("old", &None));
        // An hour on, the removal is forgotten: a reader from the start sees the live entry only.
        assert_eq!(store.expire(T0, T0 + 5_000 + TOMBSTONE_TTL_MS + 1, 10).await.unwrap(), 0);
        let from_start = all_changes(store.as_ref(), 0).await;
        let ids: Vec<&str> = from_start.items.iter().map(|c| c.task_id.as_str()).collect();
        assert_eq!(ids, ["new"]);
    }
}

#[tokio::test]
async fn clearing_starts_a_new_epoch_with_nothing_in_it() {
    for store in stores("clear").await.0 {
        store.update("t1", T0, metadata(1)).await.unwrap();
        let before = store.changes(0, 10).await.unwrap().epoch;
        let epoch = store.clear().await.unwrap();
        assert!(epoch > before);
        let after = store.changes(0, 10).await.unwrap();
        assert_eq!((after.epoch, after.items.len()), (epoch, 0));
        assert_eq!(store.entry("t1").await.unwrap(), None);
        store.update("t1", T0, metadata(1)).await.unwrap();
        assert_eq!(store.changes(0, 10).await.unwrap().items.len(), 1);
    }
}

/// Every key the Redis store writes carries one hash tag, so a Redis Cluster keeps them in one
/// slot and its multi-key scripts run there.
#[tokio::test]
async fn every_redis_key_is_in_one_cluster_slot() {
    let url = std::env::var("IMAGEPIPE_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let prefix = format!("test-similarity-slot-{}", uuid::Uuid::new_v4().simple());
    let store = match RedisStore::connect(&url, &prefix).await {
        Ok(store) => store,
        Err(error) => return imagepipe_contracts::testing::environment_missing(&format!("Redis at {url}: {error}")),
    };
    store.update("t1", T0, metadata(1)).await.unwrap();
    store.update("t1", T0, Change::Embedding { embedding: embedding(0.3), labels: Default::default() }).await.unwrap();
    store.update("t2", T0 + 1, metadata(2)).await.unwrap();
    store.expire(T0, T0 + 10, 10).await.unwrap();
    store.clear().await.unwrap();
    store.update("t3", T0, metadata(3)).await.unwrap();
    let mut connection = ::redis::Client::open(url).unwrap().get_multiplexed_async_connection().await.unwrap();
    let keys: Vec<String> = ::redis::cmd("KEYS").arg(format!("{prefix}*")).query_async(&mut connection).await.unwrap();
    assert!(keys.len() >= 4, "{keys:?}");
    let tag = format!("{{{prefix}:similarity}}");
    for key in &keys {
        assert!(key.starts_with(&format!("{prefix}:{tag}:")), "{key} outside the slot's hash tag");
    }
    let _: () = ::redis::cmd("DEL").arg(&keys).query_async(&mut connection).await.unwrap();
}
