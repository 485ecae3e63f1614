//! Reading what a broker holds without changing it: `TaskQueue::backlog` on every backend,
//! `nats::inspect` and `kafka::inspect` (what `imagepipe doctor` reports).
#![cfg(all(feature = "memory", feature = "nats", feature = "kafka"))]

mod kafka_support;
mod nats_support;

use std::time::Duration;

use imagepipe_bus::kafka::KafkaBus;
use imagepipe_bus::{Backlog, Bus, BusConfig, ConsumerConfig, Message, TaskQueue, kafka, nats};
use imagepipe_contracts::names::queues;

const QUEUE: &str = queues::DOWNLOAD;

fn consumer_config() -> ConsumerConfig {
    ConsumerConfig { ack_wait: Duration::from_secs(30), max_deliveries: 5 }
}

/// Sends three messages to [`QUEUE`], takes one without settling it, and checks the backlog:
/// two waiting, one unacknowledged (`unacked_known`: the broker counts deliveries).
async fn three_sent_one_taken(queues: &dyn TaskQueue, unacked_known: bool) {
    assert_eq!(queues.backlog(QUEUE).await.unwrap(), None, "nothing consumed the queue yet");
    let consumer = queues.consume(QUEUE, consumer_config()).await.unwrap();
    for i in 0..3 {
        queues.send(QUEUE, Message::new(format!("m{i}")).with_key(format!("k{i}"))).await.unwrap();
    }
    let taken = consumer.fetch(1, Duration::from_secs(10)).await.unwrap();
    assert_eq!(taken.len(), 1);
    let expected = if unacked_known { Backlog { waiting: 2, unacked: 1 } } else { Backlog { waiting: 3, unacked: 0 } };
    assert_eq!(queues.backlog(QUEUE).await.unwrap(), Some(expected));
    assert_eq!(expected.depth(), 3);
    drop(taken);
}

#[tokio::test]
async fn the_memory_backlog_counts_waiting_and_unacked_messages() {
    let bus = Bus::connect(&BusConfig::default()).await.unwrap();
    three_sent_one_taken(bus.queues.as_ref(), true).await;
}

#[tokio::test]
async fn the_nats_backlog_is_the_durable_consumers_pending_counts() {
    for url in nats_support::servers() {
        let test = nats_support::TestBus::new(&url, "backlog").await;
        three_sent_one_taken(&test.bus, true).await;
    }
}

#[tokio::test]
async fn nats_inspect_reports_streams_consumers_and_other_prefixes_without_creating_anything() {
    for url in nats_support::servers() {
        let config = nats_support::test_config(&url);
        let test = nats_support::TestBus::new(&url, "inspect").await;
        let consumer = test.bus.consume(QUEUE, consumer_config()).await.unwrap();
        test.bus.send(QUEUE, Message::new("one").with_key("k")).await.unwrap();

        let report = nats::inspect(&test.prefix, &config).await.unwrap();
        assert!(report.server.starts_with("nats-server "), "{}", report.server);
        let names: Vec<&str> = report.stores.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, test.bus.stream_names().iter().map(String::as_str).collect::<Vec<_>>());
        assert!(report.stores.iter().all(|s| s.exists && s.problem.is_none()), "{:?}", report.stores);
        assert_eq!(report.stores[0].captures, format!("{}.tasks.>", test.prefix));
        let download = report.consumers.iter().find(|c| c.serves == QUEUE).expect("the download queue is listed");
        assert_eq!(download.name, "tasks_download");
        assert_eq!(download.backlog, Some(Backlog { waiting: 1, unacked: 0 }));
        let submit = report.consumers.iter().find(|c| c.serves == queues::SUBMIT).unwrap();
        assert_eq!(submit.backlog, None, "no submit consumer was opened");

        let missing = nats_support::unique_prefix("inspect_missing");
        let report = nats::inspect(&missing, &config).await.unwrap();
        assert!(report.stores.iter().all(|s| !s.exists), "{:?}", report.stores);
        assert!(report.consumers.is_empty());
        let other = report.other_prefixes.iter().find(|o| o.prefix == test.prefix).expect("the live prefix is listed");
        assert_eq!(other.stream, test.bus.stream_names()[0]);
        assert_eq!(other.captures, format!("{}.tasks.>", test.prefix));
        let report = nats::inspect(&missing, &config).await.unwrap();
        assert!(report.stores.iter().all(|s| !s.exists), "inspecting created nothing");
        drop(consumer);
    }
}

#[tokio::test]
async fn nats_inspect_of_an_unreachable_server_is_a_connect_error() {
    let mut config = nats_support::test_config("nats://127.0.0.1:1");
    config.connect_timeout = Duration::from_millis(500);
    let err = nats::inspect("imagepipe", &config).await.unwrap_err();
    assert!(matches!(err, imagepipe_bus::BusError::Connect { .. }), "{err:?}");
}

#[tokio::test]
async fn kafka_inspect_reports_topics_and_group_lag_and_the_bus_backlog_agrees() {
    let cleanup = kafka_support::Cleanup::default();
    let config = kafka_support::test_config();
    let prefix = kafka_support::unique_prefix("inspect");

    let report = kafka::inspect(&prefix, &config).await.unwrap();
    assert!(report.stores.iter().all(|s| !s.exists), "a fresh prefix has no topics: {:?}", report.stores);

    let bus = cleanup.track(KafkaBus::connect(&prefix, &config).await.unwrap());
    let consumer = bus.consume(QUEUE, consumer_config()).await.unwrap();
    for i in 0..3 {
        bus.send(QUEUE, Message::new(format!("m{i}")).with_key(format!("k{i}"))).await.unwrap();
    }
    let mut taken = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while taken.len() < 3 && tokio::time::Instant::now() < deadline {
        taken.extend(consumer.fetch(3 - taken.len(), Duration::from_secs(1)).await.unwrap());
    }
    assert_eq!(taken.len(), 3);
    taken.remove(0).ack().await.unwrap();

    let report = kafka::inspect(&prefix, &config).await.unwrap();
    assert!(report.stores.iter().all(|s| s.exists), "{:?}", report.stores);
    let topic = format!("{prefix}.{QUEUE}");
    let stored = report.stores.iter().find(|s| s.name == topic).unwrap();
    assert_eq!(stored.messages, Some(3));
    // The ack is committed asynchronously: wait for the lag to show it.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let lag = bus.backlog(QUEUE).await.unwrap();
        if lag.is_some_and(|b| b.waiting < 3) || tokio::time::Instant::now() >= deadline {
            let waiting = lag.expect("the group committed offsets").waiting;
            assert_eq!(waiting, 2, "the acknowledged message is committed, the two in flight are not");
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let report = kafka::inspect(&prefix, &config).await.unwrap();
    let download = report.consumers.iter().find(|c| c.serves == QUEUE).unwrap();
    assert_eq!(download.name, format!("{prefix}.{QUEUE}"));
    assert!(download.backlog.is_some_and(|b| b.waiting <= 2), "{download:?}");
    drop((taken, consumer));
}
