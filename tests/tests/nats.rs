//! The pipeline as seven separate processes over NATS JetStream and Redis.

use imagepipe_e2e::backend::Backend;
use imagepipe_e2e::scenarios;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_tasks_published_to_the_submit_subject_complete_across_seven_processes() {
    scenarios::every_task_completes_across_processes(Backend::nats(), 200).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_hundred_tasks_each_complete_once_while_every_service_is_killed_and_restarted() {
    scenarios::every_task_completes_once_through_kill_9(Backend::nats(), 500).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_complete_with_every_blob_in_s3_on_seaweedfs() {
    scenarios::every_task_completes_with_blobs_in_s3(Backend::nats(), 12).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_complete_and_no_blob_is_lost_when_seaweedfs_is_killed_mid_run() {
    scenarios::every_task_completes_through_a_seaweedfs_crash(Backend::nats(), 24).await;
}
