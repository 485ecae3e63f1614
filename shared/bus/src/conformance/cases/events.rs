//! Event topics: broadcast to groups, competing members, selectors, start positions, durable
//! groups, dedup.

use std::collections::BTreeSet;
use std::time::{Duration, SystemTime};

use imagepipe_contracts::names::headers;

use super::queues::assert_shared;
use crate::bus::Bus;
use crate::config::{StartPosition, Subscription};
use crate::conformance::support::{ack_all, bodies, collect, collect_exactly, consumer_config, expect_none, ids};
use crate::conformance::{Harness, Timing};
use crate::message::Message;
use crate::selector::Selector;
use crate::traits::Consumer;

fn event(body: &str) -> Message {
    Message::new(body.to_owned()).with_key(format!("tsk_{body}")).with_id(format!("evt-{body}"))
}

async fn join(bus: &Bus, t: &Timing, group: &str, selector: &str, start: StartPosition) -> Box<dyn Consumer> {
    let selector = Selector::parse(selector).expect("selector");
    let subscription = Subscription::new(group, selector).starting(start).with_consumer(consumer_config(t, 5));
    bus.events.subscribe(subscription).await.expect("subscribe")
}

fn event_types(deliveries: &[crate::Delivery]) -> Vec<String> {
    deliveries
        .iter()
        .map(|d| d.message.headers.get(headers::EVENT_TYPE).expect("event-type header").to_owned())
        .collect()
}

/// Every group gets every event, once, from its own group.
pub async fn broadcast_to_every_group(h: &dyn Harness) {
    let t = h.timing();
    let bus = h.bus().await;
    let groups = ["analytics", "notifier", "tag-indexer"];
    let mut members = Vec::new();
    for group in groups {
        members.push(join(&bus, &t, group, "*", StartPosition::New).await);
    }
    let published: Vec<Message> = (0..10).map(|i| event(&i.to_string())).collect();
    for (i, message) in published.iter().enumerate() {
        let event_type = if i % 2 == 0 { "image.downloaded" } else { "task.completed" };
        bus.events.publish(event_type, message.clone()).await.expect("publish");
    }
    let all: BTreeSet<String> = published.iter().map(|m| m.id.clone().expect("id")).collect();
    for (group, member) in groups.iter().zip(&members) {
        let got = collect_exactly(&**member, published.len(), &t, group).await;
        assert_eq!(ids(&got), all, "group {group}");
        assert!(got.iter().all(|d| d.source == *group && d.delivery_count == 1), "group {group}: source and count");
        ack_all(got).await;
    }
}

/// Members of one group compete: disjoint shares, together every event once.
pub async fn group_members_compete(h: &dyn Harness) {
    let t = h.timing();
    let bus = h.bus().await;
    let a = join(&bus, &t, "workers", "image.*", StartPosition::New).await;
    let b = join(&bus, &t, "workers", "image.*", StartPosition::New).await;
    let published: Vec<Message> = (0..20).map(|i| event(&i.to_string())).collect();
    for message in &published {
        bus.events.publish("image.analyzed", message.clone()).await.expect("publish");
    }
    let mut expected = published.clone();
    for message in &mut expected {
        message.headers.insert(headers::EVENT_TYPE, "image.analyzed");
    }
    assert_shared(&*a, &*b, &expected, &t).await;
}

/// Groups settle independently: a nack in one group redelivers there only, an ack in another
/// removes the event from that group only.
pub async fn groups_settle_independently(h: &dyn Harness) {
    let t = h.timing();
    let bus = h.bus().await;
    let acking = join(&bus, &t, "acking", "*", StartPosition::New).await;
    let nacking = join(&bus, &t, "nacking", "*", StartPosition::New).await;
    bus.events.publish("task.created", event("1")).await.expect("publish");

    collect_exactly(&*acking, 1, &t, "acking group").await.remove(0).ack().await.expect("ack");
    let first = collect_exactly(&*nacking, 1, &t, "nacking group").await.remove(0);
    first.nack(Duration::ZERO, "not yet").await.expect("nack");
    let again = collect_exactly(&*nacking, 1, &t, "nacking group, redelivered").await.remove(0);
    assert_eq!((again.delivery_count, bodies(std::slice::from_ref(&again))), (2, vec!["1".to_owned()]));
    again.ack().await.expect("ack");
    expect_none(&*acking, t.ack_wait + t.settle, "acking group after the other group's nack").await;
}

/// A selector with alternatives gets exactly the listed event types.
pub async fn selector_alternatives(h: &dyn Harness) {
    let t = h.timing();
    let bus = h.bus().await;
    let member = join(&bus, &t, "finished", "task.completed || task.failed", StartPosition::New).await;
    for (i, event_type) in
        ["task.created", "task.completed", "image.downloaded", "task.failed", "task.retrying"].into_iter().enumerate()
    {
        bus.events.publish(event_type, event(&i.to_string())).await.expect("publish");
    }
    let got = collect_exactly(&*member, 2, &t, "completed and failed").await;
    assert_eq!(event_types(&got), ["task.completed", "task.failed"]);
    assert_eq!(bodies(&got), ["1", "3"]);
    ack_all(got).await;
}

/// `image.*` gets every image event and nothing else.
pub async fn selector_wildcard(h: &dyn Harness) {
    let t = h.timing();
    let bus = h.bus().await;
    let member = join(&bus, &t, "images", "image.*", StartPosition::New).await;
    let types = ["image.downloaded", "task.completed", "image.metadata_extracted", "task.failed", "image.analyzed"];
    for (i, event_type) in types.into_iter().enumerate() {
        bus.events.publish(event_type, event(&i.to_string())).await.expect("publish");
    }
    let got = collect_exactly(&*member, 3, &t, "image events").await;
    assert_eq!(event_types(&got), ["image.downloaded", "image.metadata_extracted", "image.analyzed"]);
    ack_all(got).await;
}

/// A new group starting at `New` gets only events published after it was created.
pub async fn start_new_only(h: &dyn Harness) {
    let t = h.timing();
    let bus = h.bus().await;
    bus.events.publish("task.created", event("before")).await.expect("publish");
    let member = join(&bus, &t, "newcomer", "*", StartPosition::New).await;
    bus.events.publish("task.created", event("after")).await.expect("publish");
    let got = collect_exactly(&*member, 1, &t, "events after creation").await;
    assert_eq!(bodies(&got), ["after"]);
    ack_all(got).await;
}

/// A new group starting at `Beginning` gets every retained event and then new ones, in publish
/// order within each topic.
pub async fn start_from_beginning(h: &dyn Harness) {
    let t = h.timing();
    let bus = h.bus().await;
    bus.events.publish("image.downloaded", event("e1")).await.expect("publish");
    bus.events.publish("task.completed", event("e2")).await.expect("publish");
    let member = join(&bus, &t, "replayer", "*", StartPosition::Beginning).await;
    bus.events.publish("image.downloaded", event("e3")).await.expect("publish");
    let got = collect_exactly(&*member, 3, &t, "every retained event, then the new one").await;
    let order = bodies(&got);
    assert_eq!(order.iter().filter(|b| b.as_str() != "e2").collect::<Vec<_>>(), ["e1", "e3"]);
    assert_eq!(order.iter().collect::<BTreeSet<_>>().len(), 3, "each once: {order:?}");
    ack_all(got).await;
}

/// A new group starting `Since(t)` gets the retained events published at or after `t`.
pub async fn start_since_timestamp(h: &dyn Harness) {
    let t = h.timing();
    let bus = h.bus().await;
    bus.events.publish("task.created", event("before")).await.expect("publish");
    tokio::time::sleep(t.settle).await;
    let since = SystemTime::now();
    tokio::time::sleep(t.settle).await;
    bus.events.publish("task.created", event("after")).await.expect("publish");
    let member = join(&bus, &t, "since", "*", StartPosition::Since(since)).await;
    bus.events.publish("task.created", event("later")).await.expect("publish");
    let got = collect_exactly(&*member, 2, &t, "events since the timestamp").await;
    assert_eq!(bodies(&got), ["after", "later"]);
    ack_all(got).await;
}

/// A group is durable: joining it again resumes after the acked events, ignoring the start
/// position, with no replay.
pub async fn durable_group_resumes(h: &dyn Harness) {
    let t = h.timing();
    let bus = h.bus().await;
    let member = join(&bus, &t, "durable", "*", StartPosition::New).await;
    for i in 1..=4 {
        bus.events.publish("image.downloaded", event(&format!("e{i}"))).await.expect("publish");
    }
    let first = collect(&*member, 2, crate::conformance::support::PATIENCE).await;
    assert_eq!(bodies(&first), ["e1", "e2"]);
    ack_all(first).await;
    drop(member);

    let member = join(&bus, &t, "durable", "*", StartPosition::Beginning).await;
    let rest = collect_exactly(&*member, 2, &t, "the events not yet handled").await;
    assert_eq!(bodies(&rest), ["e3", "e4"]);
    ack_all(rest).await;
    bus.events.publish("image.downloaded", event("e5")).await.expect("publish");
    let next = collect_exactly(&*member, 1, &t, "a later event").await;
    assert_eq!(bodies(&next), ["e5"]);
    ack_all(next).await;
}

/// An event whose id was already published on its topic is accepted and dropped.
pub async fn publish_dedup_by_message_id_topic(h: &dyn Harness) {
    let t = h.timing();
    let bus = h.bus().await;
    let member = join(&bus, &t, "dedup", "*", StartPosition::New).await;
    bus.events.publish("task.completed", Message::new("first").with_id("evt-dup")).await.expect("publish");
    bus.events
        .publish("task.completed", Message::new("second").with_id("evt-dup"))
        .await
        .expect("a duplicate is accepted");
    bus.events.publish("task.completed", Message::new("third").with_id("evt-other")).await.expect("publish");
    let got = collect_exactly(&*member, 2, &t, "the distinct events").await;
    assert_eq!(bodies(&got), ["first", "third"]);
    ack_all(got).await;
}

/// `publish` adds the `imagepipe-event-type` header; the rest of the message (its CloudEvents
/// attributes too) arrives unchanged.
pub async fn event_type_header_added(h: &dyn Harness) {
    let t = h.timing();
    let bus = h.bus().await;
    let member = join(&bus, &t, "headers", "*", StartPosition::New).await;
    let attributes = imagepipe_contracts::CloudEvent {
        id: "8f0c7c7e-0b5e-4d55-9a47-2a5b5d1c9e11".into(),
        event_type: "image.metadata_extracted".into(),
        source: "/imagepipe/metadata-worker".into(),
        time_ms: 1_763_800_000_000,
        subject: Some("tsk_photo_0001".into()),
    };
    let published = event("typed")
        .with_cloud_event(&attributes)
        .with_header(headers::TRACEPARENT, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
        .with_header(headers::SCHEMA, imagepipe_contracts::SCHEMA_VERSION);
    bus.events.publish("image.metadata_extracted", published.clone()).await.expect("publish");
    let got = collect_exactly(&*member, 1, &t, "the event").await;
    let mut expected = published;
    expected.headers.insert(headers::EVENT_TYPE, "image.metadata_extracted");
    assert_eq!(got[0].message, expected);
    assert_eq!(got[0].message.headers.cloud_event(), Ok(attributes));
    ack_all(got).await;
}
