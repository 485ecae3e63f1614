//! The notification subscriber of the in-process pipeline: a finished task's event reaches its
//! `callbackUrl`, signed the Standard Webhooks way with `notification.secret` and carrying its
//! `eventId` as `webhook-id`, for a completed photo and for a URL that fails with 404.

mod common;

use std::time::{Duration, SystemTime};

use bytes::Bytes;
use imagepipe::Pipeline;
use imagepipe::samples::SAMPLES;
use imagepipe_contracts::SubmitTask;
use imagepipe_coordinator::TaskState;
use imagepipe_net::testing::{FixtureServer, Recorded, Route};
use imagepipe_notification_worker::sign::{
    EVENT_TYPE_HEADER, ID_HEADER, SIGNATURE_HEADER, Signed, TIMESTAMP_HEADER, WebhookSecret, verify,
};
use serde_json::Value;

/// `notification.secret`: `whsec_` + base64 of `e2e-webhook-secret`.
const SECRET: &str = "whsec_ZTJlLXdlYmhvb2stc2VjcmV0";
const HOOK: &str = "/hook";

fn header<'a>(request: &'a Recorded, name: &str) -> Option<&'a str> {
    request.headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

/// The webhook the receiver got for `task_id`, once it arrived.
async fn webhook_for(receiver: &FixtureServer, task_id: &str) -> (Recorded, Value) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let delivered = receiver.requests().into_iter().find_map(|request| {
            let body: Value = serde_json::from_slice(&request.body).ok()?;
            (request.target == HOOK && body["taskId"] == task_id).then_some((request, body))
        });
        if let Some(found) = delivered {
            return found;
        }
        assert!(tokio::time::Instant::now() < deadline, "no webhook for {task_id}; received {:?}", receiver.requests());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn assert_signed(request: &Recorded, body: &Value) {
    assert_eq!(request.method, "POST");
    let signed = Signed {
        id: header(request, ID_HEADER).expect("webhook-id"),
        timestamp: header(request, TIMESTAMP_HEADER).expect("webhook-timestamp"),
        signature: header(request, SIGNATURE_HEADER).expect("webhook-signature"),
    };
    assert!(signed.signature.starts_with("v1,"), "{signed:?}");
    let (key, other) = (WebhookSecret::parse(SECRET).unwrap(), WebhookSecret::parse("another secret").unwrap());
    assert_eq!(verify(&key, &signed, &request.body, SystemTime::now()), Ok(()), "{signed:?}");
    assert!(verify(&other, &signed, &request.body, SystemTime::now()).is_err(), "the signature depends on the key");
    assert_eq!(Some(signed.id), body["eventId"].as_str(), "webhook-id is the eventId");
    assert_eq!(header(request, EVENT_TYPE_HEADER), body["eventType"].as_str());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completed_and_failed_tasks_are_posted_to_their_callback_signed() {
    let Some(model_dir) = common::model_dir() else { return };
    let work = tempfile::tempdir().unwrap();
    let mut settings = common::settings(&model_dir, &work);
    settings.notification.secret = vec![WebhookSecret::parse(SECRET).unwrap()];
    let pipeline = Pipeline::start(settings).await.unwrap();
    let receiver = FixtureServer::start([(HOOK, Route::status(204))]).await.unwrap();
    let images = FixtureServer::start([]).await.unwrap();

    let photo = &SAMPLES[0];
    let key = pipeline.blobs().put(Bytes::from_static(photo.bytes)).await.unwrap();
    let submits = [
        SubmitTask {
            task_id: Some("tsk_hook_photo".into()),
            blob: Some(key.to_string()),
            callback_url: Some(receiver.url(HOOK)),
            ..SubmitTask::default()
        },
        SubmitTask {
            task_id: Some("tsk_hook_missing".into()),
            url: Some(images.url("/missing.jpg")),
            callback_url: Some(receiver.url(HOOK)),
            ..SubmitTask::default()
        },
    ];
    for submit in &submits {
        pipeline.submit(submit).await.unwrap();
    }
    let ids: Vec<String> = submits.iter().map(|s| s.task_id.clone().unwrap()).collect();
    let tasks = pipeline.wait_for(&ids, Duration::from_secs(60)).await.unwrap();
    assert_eq!(tasks[0].state, TaskState::Completed, "{:?}", tasks[0].failure);
    assert_eq!(tasks[1].state, TaskState::Failed);

    let (request, body) = webhook_for(&receiver, "tsk_hook_photo").await;
    assert_signed(&request, &body);
    assert_eq!(body["eventType"], "task.completed", "{body}");
    assert_eq!(body["payload"]["callbackUrl"], receiver.url(HOOK), "{body}");

    let (request, body) = webhook_for(&receiver, "tsk_hook_missing").await;
    assert_signed(&request, &body);
    assert_eq!(body["eventType"], "task.failed", "{body}");
    let error = &body["payload"]["error"];
    assert_eq!(error["code"], "http_404", "{body}");
    assert!(error["message"].as_str().is_some_and(|m| m.contains("404")), "{body}");

    let hooks: Vec<Recorded> = receiver.requests().into_iter().filter(|r| r.target == HOOK).collect();
    assert_eq!(hooks.len(), 2, "{hooks:?}");
    pipeline.stop().await.unwrap();
}
