//! [`Lanes`] over the memory backend: shares under backlog, an empty lane's share going to the
//! others, and waiting on idle lanes without losing what a background wait took. Timing runs
//! on paused tokio time.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use imagepipe_contracts::Priority;
use tokio::time::Instant;

use super::*;
use crate::memory::{MemoryBus, MemoryConfig};
use crate::message::Message;

const QUEUE: &str = "tasks.download";

fn bus() -> MemoryBus {
    MemoryBus::new("unit".into(), MemoryConfig::default())
}

fn consumer_config() -> ConsumerConfig {
    ConsumerConfig { ack_wait: Duration::from_secs(30), max_deliveries: 5 }
}

async fn lanes(bus: &MemoryBus, shares: Shares) -> Lanes {
    Lanes::open(bus, QUEUE, consumer_config(), shares).await.unwrap()
}

/// Sends `n` messages to the lane of `priority`, each body naming its lane and number.
async fn fill(bus: &MemoryBus, priority: Priority, n: usize) {
    let bodies = (0..n).map(|i| Message::new(format!("{priority}-{i}"))).collect();
    bus.send_batch(&priority.lane(QUEUE), bodies).await.unwrap();
}

fn body(delivery: &Delivery) -> String {
    String::from_utf8(delivery.message.payload.to_vec()).unwrap()
}

fn priority_of(delivery: &Delivery) -> Priority {
    body(delivery).split('-').next().unwrap().parse().unwrap()
}

/// Takes `total` messages in fetches of `batch` without waiting, acking each; how many came
/// from each lane.
async fn take(lanes: &Lanes, total: usize, batch: usize) -> BTreeMap<Priority, usize> {
    let mut counts = BTreeMap::new();
    let mut taken = 0;
    while taken < total {
        let got = lanes.fetch(batch.min(total - taken), Duration::ZERO).await.unwrap();
        assert!(!got.is_empty(), "the lanes ran dry after {taken}");
        assert!(got.len() <= batch);
        for delivery in got {
            *counts.entry(priority_of(&delivery)).or_default() += 1;
            delivery.ack().await.unwrap();
            taken += 1;
        }
    }
    counts
}

fn assert_about(counts: &BTreeMap<Priority, usize>, want: [usize; 3], slack: usize) {
    for priority in Priority::ALL {
        let got = counts.get(&priority).copied().unwrap_or(0);
        let want = want[priority.index()];
        assert!(got.abs_diff(want) <= slack, "{priority}: {got} of the lane, want {want}±{slack}: {counts:?}");
    }
}

#[test]
fn the_default_shares_are_70_20_10() {
    let shares = Shares::default();
    assert_eq!((shares.of(Priority::High), shares.of(Priority::Normal), shares.of(Priority::Low)), (70, 20, 10));
}

#[tokio::test(start_paused = true)]
async fn under_backlog_one_at_a_time_the_lanes_get_70_20_10() {
    let bus = bus();
    for priority in Priority::ALL {
        fill(&bus, priority, 150).await;
    }
    let lanes = lanes(&bus, Shares::default()).await;
    assert_about(&take(&lanes, 100, 1).await, [70, 20, 10], 2);
    // and the next hundred too: the round-robin state carries over between fetches
    assert_about(&take(&lanes, 100, 1).await, [70, 20, 10], 2);
}

#[tokio::test(start_paused = true)]
async fn under_backlog_in_batches_of_four_the_lanes_get_70_20_10() {
    let bus = bus();
    for priority in Priority::ALL {
        fill(&bus, priority, 150).await;
    }
    let lanes = lanes(&bus, Shares::default()).await;
    assert_about(&take(&lanes, 100, 4).await, [70, 20, 10], 2);
}

#[tokio::test(start_paused = true)]
async fn even_shares_serve_the_lanes_evenly() {
    let bus = bus();
    for priority in Priority::ALL {
        fill(&bus, priority, 100).await;
    }
    let lanes = lanes(&bus, Shares([1, 1, 1])).await;
    assert_about(&take(&lanes, 99, 1).await, [33, 33, 33], 1);
    assert_about(&take(&lanes, 99, 4).await, [33, 33, 33], 2);
}

#[tokio::test(start_paused = true)]
async fn the_low_lane_alone_gets_every_fetch() {
    let bus = bus();
    fill(&bus, Priority::Low, 20).await;
    let lanes = lanes(&bus, Shares::default()).await;
    for _ in 0..10 {
        let got = lanes.fetch(1, Duration::ZERO).await.unwrap();
        assert_eq!(got.iter().map(priority_of).collect::<Vec<_>>(), [Priority::Low]);
    }
    let got = lanes.fetch(4, Duration::ZERO).await.unwrap();
    assert_eq!(got.iter().map(priority_of).collect::<Vec<_>>(), [Priority::Low; 4], "a whole batch from one lane");
}

#[tokio::test(start_paused = true)]
async fn an_empty_lane_gives_its_share_to_the_others() {
    let bus = bus();
    fill(&bus, Priority::High, 100).await;
    fill(&bus, Priority::Low, 100).await;
    let lanes = lanes(&bus, Shares::default()).await;
    // normal's 20 go to the others: 70 : 10 of 80
    assert_about(&take(&lanes, 80, 1).await, [70, 0, 10], 2);

    // a lane that runs dry mid-batch leaves the rest of the batch to the others
    let bus = self::bus();
    fill(&bus, Priority::High, 2).await;
    fill(&bus, Priority::Normal, 50).await;
    let lanes = self::lanes(&bus, Shares::default()).await;
    let got = lanes.fetch(10, Duration::ZERO).await.unwrap();
    let high = got.iter().filter(|d| priority_of(d) == Priority::High).count();
    assert_eq!((got.len(), high), (10, 2), "two high, the rest normal");
}

#[tokio::test(start_paused = true)]
async fn a_zero_share_is_served_only_when_the_others_are_empty() {
    let bus = bus();
    fill(&bus, Priority::Normal, 5).await;
    fill(&bus, Priority::Low, 5).await;
    let lanes = lanes(&bus, Shares([70, 20, 0])).await;
    let order: Vec<Priority> = {
        let mut order = Vec::new();
        for _ in 0..10 {
            order.extend(lanes.fetch(1, Duration::ZERO).await.unwrap().iter().map(priority_of));
        }
        order
    };
    assert_eq!(order, [[Priority::Normal; 5], [Priority::Low; 5]].concat());
}

#[tokio::test(start_paused = true)]
async fn opening_reads_the_three_lanes_of_the_queue() {
    let bus = bus();
    let lanes = Lanes::open(&bus, "tasks.x", consumer_config(), Shares::default()).await.unwrap();
    for lane in ["tasks.x.high", "tasks.x", "tasks.x.low"] {
        assert!(bus.backlog(lane).await.unwrap().is_some(), "{lane} has a consumer");
        bus.send(lane, Message::new(lane)).await.unwrap();
    }
    bus.send("tasks.x.other", Message::new("tasks.x.other")).await.unwrap();
    let got: HashSet<String> = lanes.fetch(10, Duration::ZERO).await.unwrap().iter().map(body).collect();
    assert_eq!(got, HashSet::from(["tasks.x.high", "tasks.x", "tasks.x.low"].map(String::from)));
}

#[tokio::test(start_paused = true)]
async fn a_fetch_on_idle_lanes_returns_when_a_message_arrives_on_any_lane() {
    for priority in Priority::ALL {
        let bus = bus();
        let lanes = lanes(&bus, Shares::default()).await;
        let started = Instant::now();
        let sender = {
            let bus = bus.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_secs(3)).await;
                fill(&bus, priority, 1).await;
            })
        };
        let got = lanes.fetch(4, Duration::from_secs(30)).await.unwrap();
        assert_eq!(got.iter().map(priority_of).collect::<Vec<_>>(), [priority]);
        assert_eq!(started.elapsed(), Duration::from_secs(3), "woken by the {priority} lane at once");
        sender.await.unwrap();
    }
}

#[tokio::test(start_paused = true)]
async fn a_fetch_on_idle_lanes_returns_empty_after_its_wait() {
    let bus = bus();
    let lanes = lanes(&bus, Shares::default()).await;
    let started = Instant::now();
    assert!(lanes.fetch(4, Duration::from_secs(5)).await.unwrap().is_empty());
    assert_eq!(started.elapsed(), Duration::from_secs(5));
    // and the next one still wakes on a message
    fill(&bus, Priority::Normal, 1).await;
    assert_eq!(lanes.fetch(4, Duration::from_secs(5)).await.unwrap().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn what_a_background_wait_took_is_handed_out_by_the_next_fetch() {
    let bus = bus();
    let lanes = lanes(&bus, Shares::default()).await;
    let sender = {
        let bus = bus.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            // both arrive while every lane waits: each lane's background fetch takes its own
            fill(&bus, Priority::High, 1).await;
            fill(&bus, Priority::Low, 1).await;
        })
    };
    let first = lanes.fetch(1, Duration::from_secs(30)).await.unwrap();
    sender.await.unwrap();
    assert_eq!(first.iter().map(priority_of).collect::<Vec<_>>(), [Priority::High]);
    // let the low lane's background wait finish with its message
    tokio::time::sleep(Duration::from_millis(10)).await;
    let low = bus.backlog(&Priority::Low.lane(QUEUE)).await.unwrap().unwrap();
    assert_eq!((low.waiting, low.unacked), (0, 1), "the low message was taken by the background wait");

    let second = lanes.fetch(1, Duration::ZERO).await.unwrap();
    assert_eq!(second.iter().map(priority_of).collect::<Vec<_>>(), [Priority::Low], "from the stash");
    for delivery in first.into_iter().chain(second) {
        assert_eq!(delivery.delivery_count, 1);
        delivery.ack().await.unwrap();
    }
    tokio::time::sleep(consumer_config().ack_wait * 2).await;
    assert!(lanes.fetch(10, Duration::from_secs(1)).await.unwrap().is_empty(), "nothing comes back");
}

#[tokio::test(start_paused = true)]
async fn messages_trickling_into_idle_lanes_are_each_delivered_once() {
    let bus = bus();
    let lanes = lanes(&bus, Shares::default()).await;
    const SENT: usize = 60;
    let sender = {
        let bus = bus.clone();
        tokio::spawn(async move {
            for i in 0..SENT {
                // bursts on several lanes at once, then quiet
                let priority = Priority::ALL[i % 3];
                bus.send(&priority.lane(QUEUE), Message::new(format!("{priority}-{i}"))).await.unwrap();
                if i % 4 == 3 {
                    tokio::time::sleep(Duration::from_millis(700)).await;
                }
            }
        })
    };
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    while seen.len() < SENT && Instant::now() < deadline {
        for delivery in lanes.fetch(2, Duration::from_secs(1)).await.unwrap() {
            assert_eq!(delivery.delivery_count, 1, "{} came back", body(&delivery));
            seen.push(body(&delivery));
            delivery.ack().await.unwrap();
        }
    }
    sender.await.unwrap();
    let distinct: HashSet<&String> = seen.iter().collect();
    assert_eq!((seen.len(), distinct.len()), (SENT, SENT), "{seen:?}");
    // none is left with a background wait or in the queues
    tokio::time::sleep(consumer_config().ack_wait * 2).await;
    assert!(lanes.fetch(10, Duration::from_secs(1)).await.unwrap().is_empty());
    for priority in Priority::ALL {
        assert_eq!(bus.backlog(&priority.lane(QUEUE)).await.unwrap().unwrap().depth(), 0, "{priority}");
    }
}

#[tokio::test(start_paused = true)]
async fn partitioned_lanes_read_their_partitions_of_every_lane_only() {
    let bus = bus();
    for priority in Priority::ALL {
        let lane = priority.lane(QUEUE);
        bus.send(&lane, Message::new(format!("{priority}-owned")).with_partition(2)).await.unwrap();
        bus.send(&lane, Message::new(format!("{priority}-other")).with_partition(3)).await.unwrap();
        bus.send(&lane, Message::new(format!("{priority}-unpartitioned"))).await.unwrap();
    }
    let consumers = Lanes::open_each_partitions(&bus, QUEUE, &[2], consumer_config()).await.unwrap();
    let order: Vec<Priority> = consumers.iter().map(|(priority, _)| *priority).collect();
    assert_eq!(order, Priority::ALL, "highest first");
    let lanes = Lanes::new(consumers, Shares::default());
    let got = lanes.fetch(10, Duration::from_secs(1)).await.unwrap();
    let mut bodies: Vec<String> = got.iter().map(body).collect();
    bodies.sort();
    assert_eq!(bodies, ["high-owned", "low-owned", "normal-owned"]);
    assert!(got.iter().all(|d| d.message.partition == Some(2)));
    assert!(
        lanes.fetch(10, Duration::from_secs(1)).await.unwrap().is_empty(),
        "nothing of partition 3 or the lanes themselves"
    );
}
