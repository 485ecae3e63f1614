//! The sharded coordinator as separate processes (issue 32): several coordinator replicas and
//! the no-op stages (`imagepipe noop-stages`) on a real broker and Redis, through a kill -9,
//! a replica joining and a replica paused past its lease.

use imagepipe_e2e::backend::Backend;
use imagepipe_e2e::sharding::scenarios;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_nats_every_task_completes_once_when_one_of_three_coordinators_is_killed_and_its_shards_expire_to_the_others()
 {
    scenarios::failover_after_kill_9(Backend::nats(), 2_000).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_current_nats_with_one_consumer_per_group_every_task_completes_once_when_one_of_three_coordinators_is_killed()
 {
    let Some(nats) = Backend::nats_latest() else { return };
    scenarios::failover_after_kill_9(nats, 2_000).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_kafka_every_task_completes_once_when_one_of_three_coordinators_is_killed_and_its_shards_expire_to_the_others()
 {
    scenarios::failover_after_kill_9(Backend::kafka(), 2_000).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_nats_shards_are_balanced_a_joining_replica_takes_its_share_and_a_paused_one_is_fenced() {
    scenarios::balance_join_and_fencing(Backend::nats(), 1_000).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_current_nats_with_one_consumer_per_group_shards_are_balanced_a_joining_replica_takes_its_share_and_a_paused_one_is_fenced()
 {
    let Some(nats) = Backend::nats_latest() else { return };
    scenarios::balance_join_and_fencing(nats, 1_000).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_nats_on_a_redis_cluster_every_task_completes_once_and_nothing_relayed_is_lost_when_a_primary_is_killed() {
    scenarios::redis_failover(Backend::nats(), 2_000).await;
}
