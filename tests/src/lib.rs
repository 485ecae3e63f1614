//! End-to-end tests across imagepipe services against real brokers.
//!
//! The library holds what the tests in `tests/` share: [`cluster`] runs the seven service
//! binaries as separate OS processes, [`backend`] names the broker they meet on and publishes
//! raw submit commands the way a user would, [`observe`] records every event of a run, and
//! [`fixtures`] serves photos and receives webhooks on loopback; [`scenarios`] are the tests' bodies,
//! run on every broker; [`otlp`] receives the services' spans; [`sharding`] runs several
//! coordinator replicas with the no-op stages and reads their shards, leases and handovers;
//! [`s3`] points the services' blob store at the tests' S3-compatible server; [`redis_cluster`]
//! runs a Redis Cluster of a test's own, to fail over.

pub mod backend;
pub mod cluster;
pub mod fixtures;
pub mod observe;
pub mod otlp;
pub mod redis_cluster;
pub mod s3;
pub mod scenarios;
pub mod sharding;
