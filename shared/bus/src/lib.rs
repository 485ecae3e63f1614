//! Task queues and event topics (docs/design.md, "Queues and topics").
//!
//! Two seams, one per messaging pattern, shaped by what NATS JetStream and Kafka both offer:
//!
//! - [`TaskQueue`]: commands addressed to one kind of worker. [`TaskQueue::send`] with a key and
//!   headers; [`TaskQueue::consume`] opens a [`Consumer`] that competing replicas share.
//! - [`EventBus`]: broadcast events. [`EventBus::publish`]; [`EventBus::subscribe`] with a durable
//!   group, a [`Selector`] and a [`StartPosition`]; every group gets every matching event, the
//!   members of one group compete. A group of one process expires when idle ([`GroupLifetime`]).
//!
//! Both hand out [`Delivery`]s that the handler settles: [`Delivery::ack`],
//! [`Delivery::nack`] (redeliver after a delay), [`Delivery::progress`] (extend the ack
//! deadline), [`Delivery::terminate`] (straight to the dead-letter queue with a reason).
//! A message delivered `max_deliveries` times without an ack is dead-lettered too.
//!
//! [`Lanes`] reads a queue's priority lanes as one consumer, with guaranteed shares.
//!
//! [`TaskQueue::backlog`] says how many messages of a queue wait; `nats::inspect` and
//! `kafka::inspect` report what the broker holds for a prefix ([`BrokerReport`]) without
//! creating anything.
//!
//! Backends: [`memory`] (feature `memory`, default), `nats` (feature `nats`), `kafka` (feature
//! `kafka`). [`Bus::connect`] picks one from [`BusConfig`]. The [`conformance`] suite (feature
//! `conformance`) is the one set of tests every backend passes.

mod bus;
mod config;
mod delivery;
mod error;
mod inspect;
mod lanes;
mod message;
mod opening;
mod selector;
mod traits;

#[cfg(feature = "conformance")]
pub mod conformance;
#[cfg(feature = "kafka")]
pub mod kafka;
#[cfg(feature = "memory")]
pub mod memory;
#[cfg(feature = "nats")]
pub mod nats;

pub use bus::Bus;
pub use config::{
    BusConfig, BusKind, ConsumerConfig, GroupLifetime, KafkaConfig, NatsConfig, NatsStorage, NatsTlsConfig,
    StartPosition, Subscription,
};
pub use delivery::{AckHandle, Delivery};
pub use error::{BoxError, BusError};
pub use inspect::{Backlog, BrokerReport, ConsumerReport, OtherPrefix, StoreReport};
pub use lanes::{Lanes, Shares};
pub use message::{Headers, Message};
pub use selector::{InvalidSelector, Selector};
pub use traits::{Consumer, EventBus, TaskQueue};
