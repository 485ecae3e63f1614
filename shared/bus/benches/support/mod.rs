//! What both throughput benchmarks measure through the bus traits, so NATS and Kafka run the
//! same phases with the same messages.

use std::time::{Duration, Instant};

use futures::future::join_all;
use imagepipe_bus::{ConsumerConfig, Message, TaskQueue};

/// Messages sent in one `send_batch`.
pub const BATCH: usize = 500;
/// Most messages taken by one fetch.
pub const FETCH: usize = 256;
/// Body size of every message.
pub const PAYLOAD: usize = 256;

/// Prints one phase's rate.
pub fn rate(what: &str, n: usize, took: Duration) {
    println!("{what:<48} {n:>7} msgs in {:>7.2?}  {:>9.0} msgs/s", took, n as f64 / took.as_secs_f64());
}

/// The `i`th message: a body of `PAYLOAD` bytes, a key of 64, an id and the usual headers.
pub fn message(i: usize) -> Message {
    Message::new(vec![b'x'; PAYLOAD])
        .with_key(format!("tsk_{}", i % 64))
        .with_id(format!("bench-{i}"))
        .with_header("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
        .with_header("imagepipe-schema", "1")
}

/// Sends `single` messages one at a time and `batched` in batches to `tasks.bench`, opens a
/// consumer on it, then takes half of them back acking each in turn and the rest acking each
/// fetched batch concurrently, printing the rate of every phase.
pub async fn trait_phases(queues: &dyn TaskQueue, single: usize, batched: usize) {
    let started = Instant::now();
    for i in 0..single {
        queues.send("tasks.bench", message(i)).await.expect("send");
    }
    rate("bus: send, one at a time (await each ack)", single, started.elapsed());

    let started = Instant::now();
    for chunk in 0..batched / BATCH {
        let messages = (0..BATCH).map(|i| message(single + chunk * BATCH + i)).collect();
        queues.send_batch("tasks.bench", messages).await.expect("send_batch");
    }
    rate(&format!("bus: send_batch of {BATCH} (pipelined)"), batched, started.elapsed());

    let total = single + batched;
    let started = Instant::now();
    let consumer = queues
        .consume("tasks.bench", ConsumerConfig { ack_wait: Duration::from_secs(30), max_deliveries: 5 })
        .await
        .expect("consume");
    println!("{:<48} {:>7.2?}", "bus: consume (open; on Kafka, the first assignment)", started.elapsed());
    let started = Instant::now();
    let mut done = 0;
    while done < total / 2 {
        for delivery in consumer.fetch(FETCH, Duration::from_secs(1)).await.expect("fetch") {
            delivery.ack().await.expect("ack");
            done += 1;
        }
    }
    rate(&format!("bus: fetch({FETCH}) + ack each in turn"), done, started.elapsed());

    let started = Instant::now();
    let mut concurrent = 0;
    while done + concurrent < total {
        let batch = consumer.fetch(FETCH, Duration::from_secs(1)).await.expect("fetch");
        concurrent += batch.len();
        for result in join_all(batch.into_iter().map(|d| d.ack())).await {
            result.expect("ack");
        }
    }
    rate(&format!("bus: fetch({FETCH}) + acks concurrently"), concurrent, started.elapsed());
}
