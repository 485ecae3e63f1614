//! The tag index on every backend (memory, embedded, Redis), and the indexer end to end on the
//! memory bus with the search API over real HTTP.

use std::sync::Arc;
use std::time::Duration;

use imagepipe_bus::{Bus, BusConfig, ConsumerConfig, Message};
use imagepipe_contracts::names::{self, headers};
use imagepipe_contracts::payload::{ImageAnalyzed, ImageMetadataExtracted};
use imagepipe_contracts::step::{AnalysisOutput, MetadataOutput, Prediction};
use imagepipe_contracts::{Event, TraceId};
use imagepipe_runtime::embedded::EmbeddedDb;
use imagepipe_runtime::http::testing;
use imagepipe_runtime::redis_connection::RedisConnection;
use imagepipe_runtime::{Service, Settings, Shutdown};
use imagepipe_tag_indexer_worker::{
    EmbeddedIndex, GROUP, Hit, MemoryIndex, RedisIndex, TagIndex, TagMatch, api, run, serve, subscription,
};

fn tags(pairs: &[(&str, f64)]) -> Vec<(String, f64)> {
    pairs.iter().map(|(t, s)| ((*t).to_owned(), *s)).collect()
}

fn ids(hits: &[Hit]) -> Vec<&str> {
    hits.iter().map(|h| h.task_id.as_str()).collect()
}

/// Any fixed time, Unix ms.
const T0: u64 = 1_763_800_000_000;

fn q(tags: &[&str]) -> Vec<String> {
    tags.iter().map(|s| (*s).to_owned()).collect()
}

async fn suite(index: &dyn TagIndex) {
    index.index("t1", &tags(&[("cat", 0.9), ("animal", 0.95)]), T0).await.unwrap();
    index.index("t2", &tags(&[("cat", 0.4), ("indoor", 0.7)]), T0).await.unwrap();
    index.index("t3", &tags(&[("dog", 0.8), ("animal", 0.85)]), T0).await.unwrap();
    index.set_thumbnail("t1", "sha256:aa", T0).await.unwrap();

    let all = index.search(&q(&["cat", "animal"]), TagMatch::All, 10).await.unwrap();
    assert_eq!(ids(&all), ["t1"]);
    assert!((all[0].score - 1.85).abs() < 1e-9);
    assert_eq!(all[0].thumbnail_key.as_deref(), Some("sha256:aa"));

    let any = index.search(&q(&["cat", "animal"]), TagMatch::Any, 10).await.unwrap();
    assert_eq!(ids(&any), ["t1", "t3", "t2"], "best first");
    assert_eq!(any[1].thumbnail_key, None);
    assert_eq!(ids(&index.search(&q(&["cat", "animal"]), TagMatch::Any, 2).await.unwrap()), ["t1", "t3"]);
    assert!(index.search(&q(&["unicorn"]), TagMatch::Any, 10).await.unwrap().is_empty());
    assert!(index.search(&q(&["cat", "unicorn"]), TagMatch::All, 10).await.unwrap().is_empty());

    index.index("t1", &tags(&[("cat", 0.9), ("animal", 0.95)]), T0).await.unwrap();
    assert_eq!(
        index.search(&q(&["cat", "animal"]), TagMatch::Any, 10).await.unwrap(),
        any,
        "re-indexing changes nothing"
    );
}

/// Entries go with the task's latest event: a task is dropped whole (tags and thumbnail) once
/// its latest event is at or before the cut-off, a later event keeps it, `max` bounds a call.
async fn expiry(index: &dyn TagIndex) {
    index.set_thumbnail("old", "sha256:old", T0).await.unwrap();
    index.index("old", &tags(&[("cat", 0.9), ("animal", 0.5)]), T0 + 10).await.unwrap();
    index.index("late", &tags(&[("cat", 0.5)]), T0).await.unwrap();
    index.set_thumbnail("late", "sha256:late", T0 + 100).await.unwrap();
    index.index("new", &tags(&[("cat", 0.1), ("dog", 0.2)]), T0 + 50).await.unwrap();

    assert_eq!(index.expire(T0 + 9, 10).await.unwrap(), 0, "the latest event of `old` counts");
    assert_eq!(index.expire(T0 + 10, 10).await.unwrap(), 1);
    let cats = index.search(&q(&["cat"]), TagMatch::Any, 10).await.unwrap();
    assert_eq!(ids(&cats), ["late", "new"]);
    assert!(index.search(&q(&["animal"]), TagMatch::Any, 10).await.unwrap().is_empty());
    index.index("old", &tags(&[("bird", 0.3)]), T0 + 200).await.unwrap();
    let reindexed = index.search(&q(&["bird"]), TagMatch::Any, 10).await.unwrap();
    assert_eq!(reindexed[0].thumbnail_key, None, "its thumbnail went with it");

    assert_eq!(index.expire(T0 + 100, 1).await.unwrap(), 1, "at most `max`");
    assert_eq!(index.expire(T0 + 100, 1).await.unwrap(), 1);
    assert_eq!(index.expire(T0 + 100, 1).await.unwrap(), 0);
    assert!(index.search(&q(&["cat", "dog"]), TagMatch::Any, 10).await.unwrap().is_empty());
    assert_eq!(index.expire(T0 + 200, 10).await.unwrap(), 1);
    assert!(index.search(&q(&["bird"]), TagMatch::Any, 10).await.unwrap().is_empty());
}

#[tokio::test]
async fn the_memory_index_searches_best_first() {
    suite(&MemoryIndex::new()).await;
}

#[tokio::test]
async fn the_memory_index_drops_the_entries_of_expired_tasks() {
    expiry(&MemoryIndex::new()).await;
}

/// An embedded index in `dir`.
async fn embedded_index(dir: &std::path::Path) -> EmbeddedIndex {
    EmbeddedIndex::open(EmbeddedDb::open(&dir.join("tag-indexer.redb")).unwrap()).await.unwrap()
}

#[tokio::test]
async fn the_embedded_index_searches_best_first() {
    let dir = tempfile::tempdir().unwrap();
    suite(&embedded_index(dir.path()).await).await;
}

#[tokio::test]
async fn the_embedded_index_drops_the_entries_of_expired_tasks_and_leaves_no_row() {
    let dir = tempfile::tempdir().unwrap();
    let index = embedded_index(dir.path()).await;
    expiry(&index).await;
    use redb::{ReadableDatabase, ReadableTableMetadata, TableHandle};
    let db = EmbeddedDb::open(&dir.path().join("tag-indexer.redb")).unwrap();
    let txn = db.database().begin_read().unwrap();
    let mut rows = Vec::new();
    for handle in txn.list_tables().unwrap() {
        let len = txn.open_untyped_table(handle.clone()).unwrap().len().unwrap();
        rows.push((handle.name().to_owned(), len));
    }
    assert_eq!(rows.len(), 5, "{rows:?}");
    assert!(rows.iter().all(|(_, n)| *n == 0), "left behind: {rows:?}");
}

#[tokio::test]
async fn the_embedded_index_keeps_its_entries_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let index = embedded_index(dir.path()).await;
    index.index("t1", &tags(&[("cat", 0.9)]), T0).await.unwrap();
    index.set_thumbnail("t1", "sha256:aa", T0).await.unwrap();
    drop(index);
    let reopened = embedded_index(dir.path()).await;
    let hits = reopened.search(&q(&["cat"]), TagMatch::All, 10).await.unwrap();
    assert_eq!(hits, [Hit { task_id: "t1".into(), score: 0.9, thumbnail_key: Some("sha256:aa".into()) }]);
    assert_eq!(reopened.expire(T0, 10).await.unwrap(), 1, "its event time was kept too");
}

const REDIS: &str = "redis://127.0.0.1:6379";

/// An index on a prefix of its own, on the single Redis server.
async fn redis_index(name: &str) -> (RedisIndex, String) {
    redis_index_at(REDIS, name).await
}

/// An index on a prefix of its own, at `url`.
async fn redis_index_at(url: &str, name: &str) -> (RedisIndex, String) {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    let prefix = format!("imagepipe-test-tags-{name}-{}-{nanos}", std::process::id());
    (RedisIndex::connect(url, &prefix).await.unwrap_or_else(|e| panic!("Redis at {url}: {e}")), prefix)
}

/// Every key under `prefix` on the single server.
async fn redis_keys(prefix: &str) -> (Vec<String>, RedisConnection) {
    redis_keys_at(REDIS, prefix).await
}

/// Every key under `prefix` at `url` (`KEYS` goes to every primary of a cluster).
async fn redis_keys_at(url: &str, prefix: &str) -> (Vec<String>, RedisConnection) {
    let mut connection = RedisConnection::open(url).await.unwrap();
    let keys = redis::cmd("KEYS").arg(format!("{prefix}:*")).query_async(&mut connection).await.unwrap();
    (keys, connection)
}

#[tokio::test]
async fn the_redis_index_drops_the_entries_of_expired_tasks_and_leaves_no_key() {
    for (name, url) in imagepipe_contracts::testing::redis_urls() {
        let (index, prefix) = redis_index_at(&url, "expiry").await;
        expiry(&index).await;
        let (keys, _) = redis_keys_at(&url, &prefix).await;
        assert!(keys.is_empty(), "{name}: left behind: {keys:?}");
    }
}

#[tokio::test]
async fn the_redis_index_searches_best_first() {
    for (name, url) in imagepipe_contracts::testing::redis_urls() {
        let (index, prefix) = redis_index_at(&url, "search").await;
        suite(&index).await;
        let (keys, mut connection) = redis_keys_at(&url, &prefix).await;
        assert!(!keys.is_empty(), "{name}");
        let _: () = redis::cmd("DEL").arg(&keys).query_async(&mut connection).await.unwrap();
    }
}

/// The Redis Cluster slot of `key`: CRC16/XMODEM of its hash tag (the part between the first
/// `{` and the next `}`, when not empty) or of the whole key, mod 16384.
fn cluster_slot(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let hashed = bytes
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let close = bytes[open + 1..].iter().position(|&b| b == b'}')?;
            (close > 0).then(|| &bytes[open + 1..open + 1 + close])
        })
        .unwrap_or(bytes);
    let mut crc: u16 = 0;
    for &byte in hashed {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 { (crc << 1) ^ 0x1021 } else { crc << 1 };
        }
    }
    crc % 16_384
}

/// The values Redis's cluster specification and `CLUSTER KEYSLOT` give.
#[test]
fn cluster_slot_is_the_one_redis_computes() {
    assert_eq!(cluster_slot("123456789"), 0x31C3, "the CRC16/XMODEM check value");
    assert_eq!(cluster_slot("foo"), 12_182);
    assert_eq!(cluster_slot("bar"), 5_061);
    assert_eq!(cluster_slot("{user1000}.following"), cluster_slot("{user1000}.followers"));
    assert_eq!(cluster_slot("{user1000}.following"), cluster_slot("user1000"));
    assert_eq!(cluster_slot("foo{bar}{zap}"), cluster_slot("bar"));
    assert_ne!(cluster_slot("foo{}{bar}"), cluster_slot("bar"), "an empty first tag: the whole key is hashed");
    assert_eq!(cluster_slot("foo{{bar}}zap"), cluster_slot("{bar"));
}

/// Every key the Redis index writes for tasks of several tags (some with `:`, a space or braces
/// of their own) and a thumbnail is in one cluster slot, so each multi-key command, `MULTI`
/// block and script touches one slot; searches over several tags and expiry work on them.
#[tokio::test]
async fn every_key_of_the_redis_index_is_in_one_cluster_slot() {
    for (_, url) in imagepipe_contracts::testing::redis_urls() {
        one_slot_at(&url).await;
    }
}

async fn one_slot_at(url: &str) {
    let (index, prefix) = redis_index_at(url, "slot").await;
    let several = tags(&[("cat", 0.9), ("animal", 0.95), ("tiger cat", 0.4), ("a:b", 0.3), ("{x}", 0.2)]);
    index.index("t1", &several, T0).await.unwrap();
    index.index("t2", &tags(&[("dog", 0.8), ("animal", 0.6)]), T0).await.unwrap();
    index.set_thumbnail("t1", "sha256:aa", T0).await.unwrap();
    assert_eq!(ids(&index.search(&q(&["cat", "animal", "{x}"]), TagMatch::All, 10).await.unwrap()), ["t1"]);
    assert_eq!(ids(&index.search(&q(&["a:b", "dog"]), TagMatch::Any, 10).await.unwrap()), ["t2", "t1"]);

    let (keys, _) = redis_keys_at(url, &prefix).await;
    assert_eq!(keys.len(), 6 + 2 + 2, "a key per tag, per task, `indexed` and `thumbnails`: {keys:?}");
    let slot = cluster_slot(&format!("{{{prefix}:tags}}"));
    for key in &keys {
        assert!(key.starts_with(&format!("{prefix}:{{{prefix}:tags}}:")), "{key}");
        assert_eq!(cluster_slot(key), slot, "{key}");
    }
    assert_eq!(index.expire(T0, 10).await.unwrap(), 2);
    let (left, _) = redis_keys_at(url, &prefix).await;
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// An index written by the old layout (`P:tags:…`, a slot per key) is moved to the hash-tagged
/// names at connect: renamed where the new name is free, merged where a newer indexer already
/// wrote it (the later event time; the new layout's score and thumbnail where both have one);
/// connecting again moves nothing; keys the index never wrote stay.
#[tokio::test]
async fn connecting_moves_the_keys_of_the_old_layout_once() {
    let (index, prefix) = redis_index("migrate").await;
    index.index("both", &tags(&[("cat", 0.7)]), T0 + 5).await.unwrap();
    index.set_thumbnail("both", "sha256:new", T0 + 5).await.unwrap();
    let (_, mut connection) = redis_keys(&prefix).await;
    let old = |rest: &str| format!("{prefix}:tags:{rest}");
    let mut write = redis::pipe();
    write.cmd("ZADD").arg(old("tag:cat")).arg(0.9).arg("old").arg(0.1).arg("both").ignore();
    write.cmd("ZADD").arg(old("tag:tiger cat")).arg(0.4).arg("old").ignore();
    write.cmd("HSET").arg(old("task:old")).arg("cat").arg("").arg("tiger cat").arg("").ignore();
    write.cmd("HSET").arg(old("task:both")).arg("cat").arg("").ignore();
    write.cmd("ZADD").arg(old("indexed")).arg(T0).arg("old").arg(T0 + 9).arg("both").ignore();
    write.cmd("HSET").arg(old("thumbnails")).arg("old").arg("sha256:old").arg("both").arg("sha256:stale").ignore();
    write.cmd("SET").arg(old("unknown")).arg("x").ignore();
    write.query_async::<()>(&mut connection).await.unwrap();

    let moved = RedisIndex::connect(REDIS, &prefix).await.unwrap();
    let cats = moved.search(&q(&["cat"]), TagMatch::Any, 10).await.unwrap();
    assert_eq!(
        cats,
        [
            Hit { task_id: "old".into(), score: 0.9, thumbnail_key: Some("sha256:old".into()) },
            Hit { task_id: "both".into(), score: 0.7, thumbnail_key: Some("sha256:new".into()) },
        ]
    );
    assert_eq!(ids(&moved.search(&q(&["cat", "tiger cat"]), TagMatch::All, 10).await.unwrap()), ["old"]);
    let (keys, _) = redis_keys(&prefix).await;
    let slot = cluster_slot(&format!("{{{prefix}:tags}}"));
    let old_keys: Vec<&String> = keys.iter().filter(|key| cluster_slot(key) != slot).collect();
    assert_eq!(old_keys, [&old("unknown")], "only the key the index never wrote stays");

    drop(RedisIndex::connect(REDIS, &prefix).await.unwrap());
    assert_eq!(redis_keys(&prefix).await.0.len(), keys.len(), "a second connect moves nothing");

    assert_eq!(moved.expire(T0 + 8, 10).await.unwrap(), 1, "`old` at T0");
    assert_eq!(moved.expire(T0 + 9, 10).await.unwrap(), 1, "`both` at the later of T0 + 5 and T0 + 9");
    let (left, mut connection) = redis_keys(&prefix).await;
    assert_eq!(left, [old("unknown")]);
    let _: () = redis::cmd("DEL").arg(&left).query_async(&mut connection).await.unwrap();
}

/// Now in Unix ms: events of the end-to-end test are recent, so the indexer's expiry (of tasks
/// older than `coordinator.retention`) leaves them alone.
fn now_ms() -> u64 {
    u64::try_from(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis()).unwrap()
}

fn analyzed(task_id: &str, tags: &[(&str, f64)]) -> Vec<u8> {
    let tags = tags.iter().map(|(label, score)| Prediction { label: (*label).into(), score: *score }).collect();
    let payload = ImageAnalyzed {
        blob_key: "sha256:00".into(),
        analysis: AnalysisOutput { model: "m".into(), predictions: vec![], tags, embedding: None },
        labels: Default::default(),
    };
    Event::for_task(task_id, 1, TraceId::random(), now_ms(), "ai-worker", payload).to_json()
}

fn extracted(task_id: &str, thumbnail_key: &str) -> Vec<u8> {
    let metadata: MetadataOutput = serde_json::from_value(serde_json::json!({
        "format": "jpeg", "width": 4, "height": 3, "colorType": "rgb8", "bitDepth": 8, "hasAlpha": false,
        "frameCount": 1, "hasIccProfile": false, "dominantColors": [], "meanBrightness": 0.5,
        "phash": "00", "blurhash": "LEHV6nWB2yk8", "thumbnailKey": thumbnail_key
    }))
    .unwrap();
    let payload = ImageMetadataExtracted { blob_key: "sha256:00".into(), metadata, labels: Default::default() };
    Event::for_task(task_id, 1, TraceId::random(), now_ms(), "metadata-worker", payload).to_json()
}

async fn get(addr: std::net::SocketAddr, path: &str) -> (u16, serde_json::Value) {
    let answer = testing::get(addr, path).await;
    (answer.status, serde_json::from_str(&answer.body).unwrap())
}

/// The indexer as its binary runs it ([`serve`]), with `http.auth_token` set: `/v1/search`
/// needs the token like every `/v1` route.
#[tokio::test]
async fn the_standalone_indexer_answers_search_only_with_the_token() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = Settings::default();
    settings.store.path = dir.path().to_owned();
    settings.http.bind = std::net::Ipv4Addr::LOCALHOST.into();
    settings.http.port = 0;
    settings.http.auth_token = Some("search-t0ken-0123456789abcdef0123456789".to_owned().into());
    let service = Service::start_with("tag-indexer-worker", settings, Shutdown::new()).await.unwrap();
    let addr = service.http_addr();
    let checks = async {
        let path = "/v1/search?tags=cat";
        let answer =
            testing::get_until(addr, path, Some("search-t0ken-0123456789abcdef0123456789"), |a| a.status != 404).await;
        assert_eq!(answer.status, 200, "the search route is served: {answer:?}");
        let anonymous = testing::get(addr, path).await;
        assert_eq!(anonymous.status, 401, "{anonymous:?}");
        assert!(anonymous.body.contains(r#""error":"unauthorized""#), "{anonymous:?}");
        assert_eq!(testing::request(addr, "GET", path, Some("wrong")).await.status, 401);
        service.shutdown.trigger();
    };
    let (served, ()) = tokio::join!(serve(&service), checks);
    served.unwrap();
    service.stop().await.unwrap();
}

#[tokio::test]
async fn events_become_searchable_with_thumbnails() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = Settings::default();
    settings.store.path = dir.path().to_owned();
    let bus = Bus::connect(&BusConfig::default()).await.unwrap();
    drop(bus.events.subscribe(subscription(&settings)).await.unwrap());
    let index: Arc<dyn TagIndex> = Arc::new(MemoryIndex::new());
    let addr = testing::serve_api(api::routes(index.clone())).await;
    let shutdown = Shutdown::new();
    let worker = tokio::spawn({
        let (bus, settings, shutdown, index) = (bus.clone(), settings.clone(), shutdown.clone(), index.clone());
        async move { run(bus, &settings, index, shutdown).await.unwrap() }
    });

    let publish = |event_type: &'static str, body: Vec<u8>| {
        let bus = bus.clone();
        async move { bus.events.publish(event_type, Message::new(body)).await.unwrap() }
    };
    publish("image.metadata_extracted", extracted("tsk_cat", "sha256:thumb-cat")).await;
    publish("image.analyzed", analyzed("tsk_cat", &[("Cat", 0.9), ("animal", 0.95)])).await;
    publish("image.analyzed", analyzed("tsk_dog", &[("dog", 0.8), ("animal", 0.6)])).await;
    publish("image.analyzed", analyzed("tsk_cat", &[("Cat", 0.9), ("animal", 0.95)])).await;
    publish("image.analyzed", b"{\"eventType\": \"image.analyzed\"}".to_vec()).await;

    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let body = loop {
        let (status, body) = get(addr, "/v1/search?tags=animal&mode=any").await;
        assert_eq!(status, 200);
        if body["results"].as_array().unwrap().len() == 2 {
            break body;
        }
        assert!(tokio::time::Instant::now() < deadline, "not indexed: {body}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(body["results"][0]["taskId"], "tsk_cat");
    assert_eq!(body["results"][0]["thumbnailKey"], "sha256:thumb-cat");
    assert_eq!(body["results"][1]["taskId"], "tsk_dog");
    assert_eq!(body["results"][1]["thumbnailKey"], serde_json::Value::Null);

    let (status, body) = get(addr, "/v1/search?tags=CAT,%20animal&limit=5").await;
    assert_eq!((status, body["mode"].as_str()), (200, Some("all")));
    assert_eq!(body["results"].as_array().unwrap().len(), 1);
    assert!((body["results"][0]["score"].as_f64().unwrap() - 1.85).abs() < 1e-9);

    for bad in [
        "/v1/search",
        "/v1/search?tags=,",
        "/v1/search?tags=cat&mode=some",
        "/v1/search?tags=cat&limit=0",
        "/v1/search?tags=cat&limit=x",
    ] {
        let (status, body) = get(addr, bad).await;
        assert_eq!(status, 400, "{bad}");
        assert!(body["error"].is_string(), "{bad}: {body}");
    }

    let dlq = bus.queues.consume(&names::dead_letter_queue_of_group(GROUP), ConsumerConfig::default()).await.unwrap();
    let dead = dlq.fetch(1, Duration::from_secs(5)).await.unwrap().pop().expect("the malformed event");
    assert!(dead.message.headers.get(headers::DLQ_REASON).unwrap().contains("eventId"));
    dead.ack().await.unwrap();

    shutdown.trigger();
    tokio::time::timeout(Duration::from_secs(10), worker).await.unwrap().unwrap();
}
