//! Losing the server with messages in flight: the test starts a nats-server of its own on a
//! spare loopback port, stops it, restarts it on the same port and store, and checks that
//! readiness follows the connection, unacknowledged messages come back and acknowledged ones
//! do not. Runs with Debian's server (2.9) and with the current one, whose binary
//! `IMAGEPIPE_TEST_NATS_LATEST_BIN` names (scripts/nats.sh exports it; without it the test
//! fails, unless `IMAGEPIPE_TEST_ALLOW_SKIP=1` lets it run on 2.9 only).
#![cfg(feature = "nats")]

mod nats_support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use imagepipe_bus::nats::NatsBus;
use imagepipe_bus::{BusError, ConsumerConfig, Delivery, Message, NatsConfig};

const DEBIAN_SERVER: &str = "/usr/sbin/nats-server";
const QUEUE: &str = "tasks.metadata";

/// A nats-server this test started; killed when dropped.
struct Server {
    child: Option<Child>,
    binary: PathBuf,
    port: u16,
    store: PathBuf,
}

impl Server {
    fn start(binary: &Path, port: u16, store: &Path) -> Self {
        let mut server = Self { child: None, binary: binary.to_owned(), port, store: store.to_owned() };
        server.spawn();
        server
    }

    fn spawn(&mut self) {
        let child = Command::new(&self.binary)
            .args(["-a", "127.0.0.1", "-p", &self.port.to_string(), "-js", "-sd"])
            .arg(&self.store)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|err| panic!("starting {}: {err}", self.binary.display()));
        self.child = Some(child);
        let until = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(Instant::now() < until, "{} did not listen on port {}", self.binary.display(), self.port);
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stops the server the way an orchestrator does (SIGTERM) and waits for it to exit.
    fn stop(&mut self) {
        let mut child = self.child.take().expect("server running");
        let status = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().expect("kill");
        assert!(status.success());
        let until = Instant::now() + Duration::from_secs(10);
        while child.try_wait().expect("wait").is_none() {
            assert!(Instant::now() < until, "the server did not stop");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn spare_port() -> u16 {
    imagepipe_contracts::testing::spare_port().expect("a spare port")
}

fn binaries() -> Vec<PathBuf> {
    let mut binaries = vec![PathBuf::from(DEBIAN_SERVER)];
    match std::env::var_os("IMAGEPIPE_TEST_NATS_LATEST_BIN") {
        Some(bin) => binaries.push(bin.into()),
        None => imagepipe_contracts::testing::environment_missing(&format!(
            "IMAGEPIPE_TEST_NATS_LATEST_BIN is not set, so the current NATS server is not tested, only \
             {DEBIAN_SERVER} (run the tests through scripts/test.sh, or `source scripts/nats.sh && ensure_nats_latest`)"
        )),
    }
    binaries
}

async fn wait_until(what: &str, within: Duration, mut done: impl FnMut() -> bool) {
    let until = Instant::now() + within;
    while !done() {
        assert!(Instant::now() < until, "{what} within {within:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn body(delivery: &Delivery) -> String {
    String::from_utf8(delivery.message.payload.to_vec()).expect("utf-8")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unacked_messages_come_back_after_the_server_restarts() {
    for binary in binaries() {
        let store = tempfile::tempdir().expect("tempdir");
        let mut server = Server::start(&binary, spare_port(), store.path());
        let config = NatsConfig {
            url: server.url(),
            reconnect_delay_min: Duration::from_millis(50),
            reconnect_delay_max: Duration::from_millis(500),
            request_timeout: Duration::from_secs(2),
            ..NatsConfig::default()
        };
        let nats = NatsBus::connect("reconnect", &config).await.expect("connect");
        let bus = nats.clone().into_bus();
        assert!(bus.is_connected());

        for i in 1..=4 {
            bus.queues.send(QUEUE, Message::new(format!("m{i}")).with_id(format!("m{i}"))).await.expect("send");
        }
        let consumer = bus
            .queues
            .consume(QUEUE, ConsumerConfig { ack_wait: Duration::from_secs(1), max_deliveries: 5 })
            .await
            .expect("consume");
        let mut in_flight = Vec::new();
        while in_flight.len() < 4 {
            in_flight.extend(consumer.fetch(4 - in_flight.len(), Duration::from_secs(2)).await.expect("fetch"));
        }
        let unacked: Vec<Delivery> = in_flight.split_off(2);
        let acked: Vec<String> = in_flight.iter().map(body).collect();
        for delivery in in_flight {
            delivery.ack().await.expect("ack");
        }
        // An ack is a publish the client may still hold in its buffer; only an ack the server
        // has received is a promise that the message does not come back.
        bus.queues.flush().await.expect("flush the acks");
        let expected: Vec<String> = unacked.iter().map(body).collect();
        drop(unacked);

        server.stop();
        wait_until("readiness turns false", Duration::from_secs(5), || !bus.is_connected()).await;
        let during = consumer.fetch(1, Duration::from_millis(200)).await;
        assert!(matches!(during, Err(BusError::Receive { .. })), "fetch while down: {during:?}");

        tokio::time::sleep(Duration::from_millis(300)).await;
        server.spawn();
        wait_until("the client reconnects", Duration::from_secs(10), || bus.is_connected()).await;

        let mut back = Vec::new();
        let until = Instant::now() + Duration::from_secs(10);
        while back.len() < 2 && Instant::now() < until {
            match consumer.fetch(4, Duration::from_secs(1)).await {
                Ok(deliveries) => back.extend(deliveries),
                Err(err) => eprintln!("fetch right after the reconnect: {err}"),
            }
        }
        let mut got: Vec<String> = back.iter().map(body).collect();
        got.sort();
        assert_eq!(got, expected, "{}: the unacked messages come back (acked: {acked:?})", binary.display());
        assert!(back.iter().all(|d| d.delivery_count == 2), "{}: redeliveries", binary.display());
        for delivery in back {
            delivery.ack().await.expect("ack after reconnect");
        }
        let extra = consumer.fetch(4, Duration::from_millis(1500)).await.expect("fetch");
        assert!(extra.is_empty(), "{}: acked messages came back: {:?}", binary.display(), extra);

        bus.queues.send(QUEUE, Message::new("after").with_id("after")).await.expect("send after reconnect");
        let after = consumer.fetch(1, Duration::from_secs(2)).await.expect("fetch");
        assert_eq!(after.iter().map(body).collect::<Vec<_>>(), ["after"]);
        after.into_iter().next().unwrap().ack().await.expect("ack");
        drop(consumer);
        nats.delete_streams().await.expect("cleanup");
    }
}
