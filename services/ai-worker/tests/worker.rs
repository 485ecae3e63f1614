//! The AI worker end to end on the in-memory bus: commands on `tasks.ai`, images in a local blob
//! store, `image.analyzed` events (with the embedding) and step results (without it) out.

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use bytes::Bytes;
use imagepipe_ai_worker::{AnalysisOptions, Classifier, run};
use imagepipe_blob::{BlobStore, LocalBlobStore};
use imagepipe_bus::{Bus, BusConfig, ConsumerConfig, Message, Selector, Subscription};
use imagepipe_contracts::command::AnalyzeCommand;
use imagepipe_contracts::names::{dead_letter_queue, queues};
use imagepipe_contracts::payload::ImageAnalyzed;
use imagepipe_contracts::step::AnalysisOutput;
use imagepipe_contracts::{Event, EventType, Step, StepOutcome, StepOutput, StepResult, decode, event_id};
use imagepipe_runtime::budget::MemoryBudget;
use imagepipe_runtime::{Settings, Shutdown};

const MISSING_BLOB: &str = "sha256:0000000000000000000000000000000000000000000000000000000000000000";

fn command(task_id: &str, blob_key: &str) -> Message {
    let command = AnalyzeCommand {
        task_id: task_id.into(),
        attempt: 1,
        blob_key: blob_key.into(),
        preview_key: None,
        labels: [("album".to_owned(), "pets".to_owned())].into(),
    };
    Message::new(serde_json::to_vec(&command).unwrap()).with_key(task_id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_analyses_stored_images_and_reports_failures() {
    let (Some(dir), Some(model)) = (common::model_dir(), common::model()) else { return };
    let blob_dir = tempfile::tempdir().unwrap();
    let mut settings = Settings::default();
    settings.blob.dir = blob_dir.path().to_owned();
    settings.worker.concurrency = 4;
    let blobs = LocalBlobStore::new(blob_dir.path());
    let cat = blobs.put(Bytes::from(common::photo(&dir, "chelsea"))).await.unwrap().to_string();
    let text = blobs.put(Bytes::from_static(b"a text file, not an image")).await.unwrap().to_string();

    let bus = Bus::connect(&BusConfig::default()).await.unwrap();
    let events = bus.events.subscribe(Subscription::new("ai-test", Selector::all())).await.unwrap();
    let results = bus.queues.consume(queues::RESULTS, ConsumerConfig::default()).await.unwrap();
    let dead = bus.queues.consume(&dead_letter_queue(queues::AI), ConsumerConfig::default()).await.unwrap();
    let options = AnalysisOptions { top_k: 3, tag_min_score: 0.05, max_pixels: 1 << 26 };
    let classifier_model = model.clone();
    let classifier = Classifier::new(model, options, 2, MemoryBudget::new("ai", settings.ai.memory_budget));
    let shutdown = Shutdown::new();
    let worker = tokio::spawn({
        let (bus, shutdown) = (bus.clone(), shutdown.clone());
        async move { run(bus, &settings, classifier, shutdown).await }
    });

    for (task, key) in [("tsk_cat", cat.as_str()), ("tsk_text", text.as_str()), ("tsk_gone", MISSING_BLOB)] {
        bus.queues.send(queues::AI, command(task, key)).await.unwrap();
    }
    bus.queues.send(queues::AI, Message::new(&b"{\"taskId\": 7}"[..])).await.unwrap();

    let mut outcomes = HashMap::new();
    while outcomes.len() < 3 {
        let batch = results.fetch(3, Duration::from_secs(60)).await.unwrap();
        assert!(!batch.is_empty(), "no step result within 60 s; have {outcomes:?}");
        for delivery in batch {
            let result: StepResult = decode(&delivery.message.payload).unwrap();
            assert_eq!((result.step, result.attempt), (Step::Analyze, 1));
            outcomes.insert(result.task_id.clone(), result.outcome);
            delivery.ack().await.unwrap();
        }
    }

    let StepOutcome::Ok { output: StepOutput::Analyze(analysis) } = &outcomes["tsk_cat"] else {
        panic!("the cat: {:?}", outcomes["tsk_cat"]);
    };
    assert_eq!(analysis.predictions.len(), 3);
    assert_eq!(analysis.embedding, None, "the step result leaves the embedding out");
    assert!(analysis.tags.iter().any(|t| t.label == "cat"), "{:?}", analysis.tags);
    let code = |task: &str| match &outcomes[task] {
        StepOutcome::Permanent { error } => error.code.clone(),
        other => panic!("{task}: {other:?}"),
    };
    assert_eq!(code("tsk_text"), "decode_failed");
    assert_eq!(code("tsk_gone"), "blob_not_found");

    let delivered = events.fetch(5, Duration::from_secs(1)).await.unwrap();
    assert_eq!(delivered.len(), 1, "only the success publishes an event");
    let wire = &delivered[0].message.payload;
    assert!(wire.len() < 4096, "image.analyzed is {} bytes, over 4 KiB", wire.len());
    let event: Event<ImageAnalyzed> = decode(wire).unwrap();
    assert_eq!(event.event_id, event_id("tsk_cat", EventType::ImageAnalyzed, 1));
    assert_eq!(event.source, "ai-worker");
    assert_eq!(event.payload.blob_key, cat);
    let embedding = event.payload.analysis.embedding.as_ref().expect("image.analyzed carries the embedding");
    assert_eq!(Some(embedding.version.as_str()), classifier_model.embedding_version());
    assert_eq!(embedding.dim, 1280);
    let without_embedding = AnalysisOutput { embedding: None, ..event.payload.analysis.clone() };
    assert_eq!(&without_embedding, analysis);
    assert_eq!(event.payload.labels.get("album").map(String::as_str), Some("pets"));

    let rejected = dead.fetch(1, Duration::from_secs(10)).await.unwrap();
    assert_eq!(rejected.len(), 1, "the malformed command is dead-lettered");
    assert_eq!(&rejected[0].message.payload[..], b"{\"taskId\": 7}");

    shutdown.trigger();
    tokio::time::timeout(Duration::from_secs(30), worker).await.unwrap().unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_analysis_waits_for_its_share_of_the_memory_budget_and_gives_it_back() {
    let (Some(dir), Some(model)) = (common::model_dir(), common::model()) else { return };
    let budget = MemoryBudget::new("ai-test", 64 << 20);
    let options = AnalysisOptions { top_k: 3, tag_min_score: 0.05, max_pixels: 1 << 26 };
    let classifier = Classifier::new(model, options, 2, budget.clone());
    let photo = Bytes::from(common::photo(&dir, "chelsea"));

    let everything = budget.acquire(budget.capacity()).await;
    let analysis = tokio::spawn(async move { classifier.analyze(photo).await });
    let asked = Instant::now();
    while budget.waiting() == 0 {
        assert!(asked.elapsed() < Duration::from_secs(10), "the analysis never asked the budget");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(!analysis.is_finished(), "it waits while the budget is taken");
    drop(everything);
    let output = analysis.await.unwrap().unwrap();
    assert_eq!(output.predictions.len(), 3);
    assert_eq!((budget.in_use(), budget.waiting()), (0, 0), "its share is given back");
}
