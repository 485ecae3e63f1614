//! NATS specifics the conformance suite does not see: stream and consumer setup, what lands in
//! JetStream, the 2.9 selector fallback, and the max-deliveries advisory path. Each test runs
//! on the 2.9 server and on the current one (see `nats_support::nats_latest_url`).
#![cfg(feature = "nats")]

mod nats_support;

use std::time::Duration;

use async_nats::jetstream::stream::RetentionPolicy;
use imagepipe_bus::nats::NatsBus;
use imagepipe_bus::{
    BusError, ConsumerConfig, EventBus, Message, NatsConfig, Selector, StartPosition, Subscription, TaskQueue,
};
use imagepipe_contracts::names::headers;
use nats_support::{TestBus, servers, test_config};

const QUEUE: &str = "tasks.download";

fn quick(max_deliveries: u32) -> ConsumerConfig {
    ConsumerConfig { ack_wait: Duration::from_secs(1), max_deliveries }
}

async fn jetstream(url: &str) -> async_nats::jetstream::Context {
    async_nats::jetstream::new(async_nats::connect(url).await.expect("connect"))
}

#[tokio::test]
async fn streams_are_created_once_and_reused() {
    for url in servers() {
        let first = TestBus::new(&url, "streams").await;
        let js = jetstream(&url).await;
        let [tasks, events, dlq] = first.bus.stream_names();
        let info = js.get_stream(&tasks).await.expect("tasks stream").cached_info().clone();
        assert_eq!(info.config.retention, RetentionPolicy::WorkQueue);
        assert_eq!(info.config.subjects, vec![format!("{}.tasks.>", first.prefix)]);
        let info = js.get_stream(&events).await.expect("events stream").cached_info().clone();
        assert_eq!(info.config.retention, RetentionPolicy::Limits);
        assert_eq!(info.config.max_age, Duration::from_secs(7 * 24 * 3600));
        let info = js.get_stream(&dlq).await.expect("dlq stream").cached_info().clone();
        assert_eq!(info.config.subjects, vec![format!("{}.dlq.>", first.prefix)]);

        first.bus.send(QUEUE, Message::new("kept").with_id("kept")).await.expect("send");
        // A second process with other limits updates the streams in place and loses nothing.
        let config = NatsConfig { events_max_age: Duration::from_secs(3600), ..test_config(&url) };
        let second = NatsBus::connect(&first.prefix, &config).await.expect("second connect");
        let info = js.get_stream(&events).await.expect("events stream").cached_info().clone();
        assert_eq!(info.config.max_age, Duration::from_secs(3600), "{url}");
        let consumer = second.consume(QUEUE, quick(3)).await.expect("consume");
        let got = consumer.fetch(10, Duration::from_secs(2)).await.expect("fetch");
        assert_eq!(got.len(), 1, "{url}");
        got.into_iter().next().unwrap().ack().await.expect("ack");
    }
}

#[tokio::test]
async fn a_setting_jetstream_cannot_change_is_a_clear_error() {
    for url in servers() {
        let first = TestBus::new(&url, "mismatch").await;
        let config = NatsConfig { storage: imagepipe_bus::NatsStorage::Memory, ..test_config(&url) };
        let err = NatsBus::connect(&first.prefix, &config).await.err().expect("storage cannot change");
        let shown = format!("{err}: {:?}", std::error::Error::source(&err));
        assert!(matches!(err, BusError::Setup { .. }), "{url}: {shown}");
        assert!(shown.contains("_TASKS"), "{url}: the error names the stream: {shown}");
    }
}

#[tokio::test]
async fn consumer_settings_are_updated_in_place() {
    for url in servers() {
        let t = TestBus::new(&url, "consumer_update").await;
        let js = jetstream(&url).await;
        t.bus.consume(QUEUE, quick(3)).await.expect("consume");
        t.bus
            .consume(QUEUE, ConsumerConfig { ack_wait: Duration::from_secs(7), max_deliveries: 4 })
            .await
            .expect("again");
        let stream = js.get_stream(&t.bus.stream_names()[0]).await.expect("stream");
        let info = stream.consumer_info("tasks_download").await.expect("consumer");
        assert_eq!(info.config.ack_wait, Duration::from_secs(7), "{url}");
        assert_eq!(info.config.max_deliver, 5, "{url}: one above max_deliveries");
        assert_eq!(info.config.filter_subject, format!("{}.tasks.download", t.prefix));
    }
}

#[tokio::test]
async fn a_group_expiring_when_idle_is_deleted_once_nothing_pulls_from_it() {
    for url in servers() {
        let t = TestBus::new(&url, "idle_group").await;
        let idle = Duration::from_secs(1);
        let expiring = Subscription::new("sse-1", Selector::all()).expiring_when_idle(idle).with_consumer(quick(3));
        let consumer = t.bus.subscribe(expiring).await.expect("subscribe");
        let durable = t.bus.subscribe(Subscription::new("kept", Selector::all())).await.expect("subscribe");
        let stream = jetstream(&url).await.get_stream(&t.bus.stream_names()[1]).await.expect("events stream");
        let info = stream.consumer_info("sse-1").await.expect("consumer");
        assert_eq!(info.config.inactive_threshold, idle, "{url}");
        let info = stream.consumer_info("kept").await.expect("consumer");
        assert_eq!(info.config.inactive_threshold, Duration::ZERO, "{url}: a durable group never expires");

        // Pulling keeps it: three times the threshold of back-to-back fetches.
        let pulling = tokio::time::Instant::now();
        while pulling.elapsed() < 3 * idle {
            assert!(consumer.fetch(1, idle / 4).await.expect("fetch").is_empty());
        }
        assert!(stream.consumer_info("sse-1").await.is_ok(), "{url}: deleted while pulled from");

        drop(consumer);
        let gone = tokio::time::Instant::now();
        loop {
            match stream.consumer_info("sse-1").await {
                Err(err) if err.kind() == async_nats::jetstream::context::ConsumerInfoErrorKind::NotFound => break,
                Err(err) => panic!("{url}: {err}"),
                Ok(_) => {}
            }
            assert!(gone.elapsed() < Duration::from_secs(30), "{url}: the idle consumer was not deleted");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(stream.consumer_info("kept").await.is_ok(), "{url}");
        drop(durable);
    }
}

#[tokio::test]
async fn publishes_carry_msg_id_and_headers_on_the_wire() {
    for url in servers() {
        let t = TestBus::new(&url, "wire").await;
        let message = Message::new("{}")
            .with_id("evt-1")
            .with_key("tsk_1")
            .with_header(headers::TRACEPARENT, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
            .with_header(headers::SCHEMA, "1");
        t.bus.publish("image.downloaded", message).await.expect("publish");
        let js = jetstream(&url).await;
        let stream = js.get_stream(&t.bus.stream_names()[1]).await.expect("stream");
        let stored = stream.get_raw_message(1).await.expect("stored event");
        assert_eq!(stored.subject.as_str(), format!("{}.events.image.downloaded", t.prefix));
        let h = &stored.headers;
        assert_eq!(h.get("Nats-Msg-Id").map(|v| v.as_str()), Some("evt-1"));
        assert_eq!(h.get(headers::EVENT_TYPE).map(|v| v.as_str()), Some("image.downloaded"));
        assert_eq!(h.get(headers::SCHEMA).map(|v| v.as_str()), Some("1"));
        assert!(h.get(headers::TRACEPARENT).is_some());
    }
}

#[tokio::test]
async fn a_selector_of_several_patterns_gets_exactly_its_events_on_every_server() {
    for url in servers() {
        let t = TestBus::new(&url, "selector").await;
        let selector = Selector::parse("task.completed || task.failed || image.analyzed").unwrap();
        let group = Subscription::new("notify", selector).starting(StartPosition::Beginning).with_consumer(quick(3));
        for (i, event_type) in
            ["task.completed", "task.created", "image.analyzed", "image.downloaded", "task.failed"].iter().enumerate()
        {
            t.bus.publish(event_type, Message::new(*event_type).with_id(format!("e{i}"))).await.expect("publish");
        }
        let consumer = t.bus.subscribe(group).await.expect("subscribe");
        let mut got = Vec::new();
        for _ in 0..5 {
            for delivery in consumer.fetch(10, Duration::from_millis(500)).await.expect("fetch") {
                got.push(String::from_utf8(delivery.message.payload.to_vec()).unwrap());
                delivery.ack().await.expect("ack");
            }
        }
        assert_eq!(got, ["task.completed", "image.analyzed", "task.failed"], "{url}");
    }
}

#[tokio::test]
async fn terminate_writes_the_dead_letter_and_removes_the_task() {
    for url in servers() {
        let t = TestBus::new(&url, "terminate").await;
        let sent = Message::new("not an image").with_id("bad-1").with_key("tsk_9").with_header(headers::SCHEMA, "1");
        t.bus.send(QUEUE, sent.clone()).await.expect("send");
        let consumer = t.bus.consume(QUEUE, quick(3)).await.expect("consume");
        let delivery = consumer.fetch(1, Duration::from_secs(2)).await.expect("fetch").pop().expect("delivery");
        delivery.terminate("permanent: not an image\nsecond line").await.expect("terminate");

        let dlq = t.bus.consume("dlq.tasks.download", quick(3)).await.expect("consume dlq");
        let letter = dlq.fetch(1, Duration::from_secs(2)).await.expect("fetch dlq").pop().expect("dead letter");
        assert_eq!(letter.message.payload, sent.payload);
        assert_eq!(letter.message.id.as_deref(), Some("bad-1"), "{url}: the original id");
        assert_eq!(letter.message.key.as_deref(), Some("tsk_9"));
        let h = &letter.message.headers;
        assert_eq!(h.get(headers::DLQ_REASON), Some("permanent: not an image second line"));
        assert_eq!(h.get(headers::DLQ_DELIVERY_COUNT), Some("1"));
        assert_eq!(h.get(headers::DLQ_SOURCE), Some(QUEUE));
        assert_eq!(h.get(headers::SCHEMA), Some("1"));
        letter.ack().await.expect("ack");

        let js = jetstream(&url).await;
        let mut tasks = js.get_stream(&t.bus.stream_names()[0]).await.expect("stream");
        assert_eq!(tasks.info().await.expect("info").state.messages, 0, "{url}: the terminated task is gone");
    }
}

/// The last delivery expiring unsettled: JetStream hands it out once more (max_deliver is one
/// above max_deliveries) and the fetch dead-letters it instead of returning it.
#[tokio::test]
async fn an_expired_last_delivery_is_dead_lettered_by_the_next_fetch() {
    for url in servers() {
        let t = TestBus::new(&url, "expired").await;
        t.bus.send(QUEUE, Message::new("stuck").with_id("stuck")).await.expect("send");
        let consumer = t.bus.consume(QUEUE, quick(2)).await.expect("consume");
        for attempt in 1..=2 {
            let delivery = consumer.fetch(1, Duration::from_secs(3)).await.expect("fetch").pop().expect("delivery");
            assert_eq!(delivery.delivery_count, attempt);
            drop(delivery);
        }
        let after = consumer.fetch(1, Duration::from_secs(3)).await.expect("fetch");
        assert!(after.is_empty(), "{url}: delivered past max_deliveries: {after:?}");

        let dlq = t.bus.consume("dlq.tasks.download", quick(3)).await.expect("consume dlq");
        let letter = dlq.fetch(1, Duration::from_secs(2)).await.expect("fetch dlq").pop().expect("dead letter");
        assert_eq!(&letter.message.payload[..], b"stuck");
        assert_eq!(letter.message.headers.get(headers::DLQ_DELIVERY_COUNT), Some("2"));
        assert_eq!(letter.message.headers.get(headers::DLQ_REASON), Some("ack deadline expired after 2 deliveries"));
        let js = jetstream(&url).await;
        let mut tasks = js.get_stream(&t.bus.stream_names()[0]).await.expect("stream");
        assert_eq!(tasks.info().await.expect("info").state.messages, 0, "{url}");
    }
}

/// The backstop: a process that took the extra delivery and died. JetStream gives up on the
/// message with only an advisory; the listener moves it to the DLQ and out of the work queue.
#[tokio::test]
async fn a_message_jetstream_gave_up_on_is_moved_by_the_advisory_listener() {
    for url in servers() {
        let t = TestBus::new(&url, "advisory").await;
        t.bus.send(QUEUE, Message::new("abandoned").with_id("abandoned")).await.expect("send");
        let consumer = t.bus.consume(QUEUE, quick(1)).await.expect("consume");
        let first = consumer.fetch(1, Duration::from_secs(3)).await.expect("fetch").pop().expect("delivery");
        drop(first);
        // A raw client takes the extra delivery and never settles it, as a crashed process would.
        let js = jetstream(&url).await;
        let stream = js.get_stream(&t.bus.stream_names()[0]).await.expect("stream");
        let raw: async_nats::jetstream::consumer::PullConsumer =
            stream.get_consumer("tasks_download").await.expect("consumer");
        // The pull waits for the redelivery, due when the first delivery's 1 s deadline passes.
        let mut batch = raw.fetch().max_messages(1).expires(Duration::from_secs(5)).messages().await.expect("pull");
        let extra = futures::StreamExt::next(&mut batch).await.expect("the extra delivery").expect("message");
        assert_eq!(extra.info().unwrap().delivered, 2);
        drop(batch);
        // After its deadline JetStream gives up at the next pull and publishes the advisory, which
        // the listener turns into the dead letter; until then every fetch comes back empty.
        let dlq = t.bus.consume("dlq.tasks.download", quick(3)).await.expect("consume dlq");
        let until = std::time::Instant::now() + Duration::from_secs(15);
        let letter = loop {
            let again = consumer.fetch(1, Duration::from_millis(300)).await.expect("fetch");
            assert!(again.is_empty(), "{url}: delivered past max_deliver: {again:?}");
            if let Some(letter) = dlq.fetch(1, Duration::from_millis(300)).await.expect("fetch dlq").pop() {
                break letter;
            }
            assert!(std::time::Instant::now() < until, "{url}: no dead letter within 15 s");
        };
        assert_eq!(&letter.message.payload[..], b"abandoned", "{url}");
        assert_eq!(letter.message.headers.get(headers::DLQ_DELIVERY_COUNT), Some("2"));
        let mut stream = stream;
        let mut left = u64::MAX;
        for _ in 0..20 {
            left = stream.info().await.expect("info").state.messages;
            if left == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(left, 0, "{url}: the given-up message is deleted from the work queue");
    }
}

#[tokio::test]
async fn an_unreachable_server_is_a_connect_error_without_secrets() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let config = NatsConfig {
        url: format!("nats://app:hunter2@127.0.0.1:{port}"),
        connect_timeout: Duration::from_millis(500),
        ..NatsConfig::default()
    };
    let started = std::time::Instant::now();
    let err = NatsBus::connect("unreachable", &config).await.err().expect("nobody listens there");
    assert!(started.elapsed() < Duration::from_secs(5), "gave up after {:?}", started.elapsed());
    assert!(matches!(err, BusError::Connect { .. }), "{err:?}");
    let shown = format!("{err} {err:?}");
    assert!(!shown.contains("hunter2"), "the password leaked: {shown}");
    assert!(shown.contains(&format!("127.0.0.1:{port}")), "the error names the server: {shown}");
}

#[tokio::test]
async fn a_message_over_the_servers_max_payload_is_too_large_not_a_retryable_failure() {
    for url in servers() {
        let t = TestBus::new(&url, "maxpayload").await;
        let max_payload = async_nats::connect(url.as_str()).await.expect("connect").server_info().max_payload;
        // The bus's own limit is set above the server's, so the server's refusal is what shows.
        let bus = t.bus.clone().into_bus().with_max_message_bytes(max_payload * 2);
        let body = vec![b'x'; max_payload + 1];
        let result = bus.queues.send(QUEUE, Message::new(body).with_id("big")).await;
        assert!(
            matches!(&result, Err(BusError::TooLarge { max, .. }) if *max == max_payload),
            "{url}: expected TooLarge with the server's max_payload {max_payload}, got {result:?}"
        );
        bus.queues.send(QUEUE, Message::new("small").with_id("small")).await.expect("the connection is still usable");
    }
}
