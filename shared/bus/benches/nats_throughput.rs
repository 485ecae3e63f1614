//! Publish and consume-with-ack rates through the bus traits next to raw async-nats, on the
//! NATS server at `IMAGEPIPE_BENCH_NATS_URL` (default 127.0.0.1:4222). A benchmark, not a test:
//! `cargo bench -p imagepipe-bus --features nats --bench nats_throughput`.

mod support;

use std::time::Instant;

use async_nats::jetstream::{self, AckKind, consumer::PullConsumer, stream};
use futures::StreamExt;
use futures::future::join_all;
use imagepipe_bus::NatsConfig;
use imagepipe_bus::nats::NatsBus;
use support::{BATCH, FETCH, PAYLOAD, rate};

const SINGLE: usize = 5_000;
const BATCHED: usize = 50_000;

async fn bus_benchmarks(url: &str) {
    let prefix = format!("bench_{}", uuid::Uuid::new_v4().simple());
    let config = NatsConfig { url: url.to_owned(), ..NatsConfig::default() };
    let bus = NatsBus::connect(&prefix, &config).await.expect("connect");
    println!("server {} (file storage, 1 replica), payload {PAYLOAD} B + 4 headers", bus.server_version());

    support::trait_phases(&bus, SINGLE, BATCHED).await;
    bus.delete_streams().await.expect("cleanup");
}

async fn raw_benchmarks(url: &str) {
    let client = async_nats::connect(url).await.expect("connect");
    let js = jetstream::new(client);
    let name = format!("BENCH_RAW_{}", uuid::Uuid::new_v4().simple());
    let subject = format!("{name}.tasks");
    let stream = js
        .create_stream(stream::Config {
            name: name.clone(),
            subjects: vec![format!("{name}.>")],
            retention: stream::RetentionPolicy::WorkQueue,
            ..Default::default()
        })
        .await
        .expect("stream");
    let payload = bytes::Bytes::from(vec![b'x'; PAYLOAD]);
    let headers = |i: usize| {
        let mut h = async_nats::HeaderMap::new();
        h.insert("Nats-Msg-Id", format!("raw-{i}").as_str());
        h.insert("imagepipe-key", format!("tsk_{}", i % 64).as_str());
        h.insert("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
        h.insert("imagepipe-schema", "1");
        h
    };

    let started = Instant::now();
    for i in 0..SINGLE {
        js.publish_with_headers(subject.clone(), headers(i), payload.clone())
            .await
            .expect("publish")
            .await
            .expect("ack");
    }
    rate("raw: publish, one at a time (await each ack)", SINGLE, started.elapsed());

    let started = Instant::now();
    for chunk in 0..BATCHED / BATCH {
        let mut acks = Vec::with_capacity(BATCH);
        for i in 0..BATCH {
            let h = headers(SINGLE + chunk * BATCH + i);
            acks.push(js.publish_with_headers(subject.clone(), h, payload.clone()).await.expect("publish"));
        }
        for ack in acks {
            ack.await.expect("ack");
        }
    }
    rate(&format!("raw: publish {BATCH}, then await the acks"), BATCHED, started.elapsed());

    let total = SINGLE + BATCHED;
    let consumer: PullConsumer = stream
        .create_consumer(jetstream::consumer::pull::Config {
            durable_name: Some("raw".into()),
            ack_policy: jetstream::consumer::AckPolicy::Explicit,
            ..Default::default()
        })
        .await
        .expect("consumer");
    let started = Instant::now();
    let mut done = 0;
    while done < total / 2 {
        let mut batch = consumer.fetch().max_messages(FETCH).messages().await.expect("fetch");
        while let Some(message) = batch.next().await {
            message.expect("message").double_ack_with(AckKind::Ack).await.expect("ack");
            done += 1;
        }
    }
    rate(&format!("raw: fetch({FETCH}) + confirmed ack each in turn"), done, started.elapsed());

    let started = Instant::now();
    let mut concurrent = 0;
    while done + concurrent < total {
        let batch: Vec<_> = consumer.fetch().max_messages(FETCH).messages().await.expect("fetch").collect().await;
        concurrent += batch.len();
        let acks = batch.into_iter().map(|m| async move { m.expect("message").double_ack_with(AckKind::Ack).await });
        for result in join_all(acks).await {
            result.expect("ack");
        }
    }
    rate(&format!("raw: fetch({FETCH}) + confirmed acks concurrently"), concurrent, started.elapsed());
    js.delete_stream(&name).await.expect("cleanup");
}

#[tokio::main]
async fn main() {
    let url = std::env::var("IMAGEPIPE_BENCH_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into());
    bus_benchmarks(&url).await;
    raw_benchmarks(&url).await;
}
