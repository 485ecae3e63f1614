//! The pipeline as seven separate processes over Kafka (Tansu in CI) and Redis, submitting as
//! `kcat -P` would.

use imagepipe_e2e::backend::Backend;
use imagepipe_e2e::scenarios;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_tasks_produced_to_the_submit_topic_complete_across_seven_processes() {
    scenarios::every_task_completes_across_processes(Backend::kafka(), 200).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_hundred_tasks_each_complete_once_while_every_service_is_killed_and_restarted() {
    scenarios::every_task_completes_once_through_kill_9(Backend::kafka(), 500).await;
}
