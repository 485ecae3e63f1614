//! `imagepipe demo`: the bundled sample photos through the whole pipeline, in one process on a
//! temporary directory, and a table of what came out.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use bytes::Bytes;
use clap::Args;
use comfy_table::{ContentArrangement, Table, presets::UTF8_FULL};
use imagepipe::Pipeline;
use imagepipe::samples::SAMPLES;
use imagepipe_bus::BusConfig;
use imagepipe_contracts::{Step, SubmitTask};
use imagepipe_coordinator::{Task, TaskState};
use imagepipe_runtime::ConfigArgs;
use imagepipe_runtime::config::StoreKind;

use super::print_json;
use super::show::{FILE_LABEL, duration, failure_reason, size, step_ms, tags, top_label};

/// Options of `imagepipe demo`.
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Print the finished tasks as JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Longest time to wait for the photos, in seconds.
    #[arg(long, default_value_t = 300)]
    timeout: u64,
}

/// Runs the demo: exit 0 when every photo completed.
pub async fn run(config: &ConfigArgs, args: DemoArgs) -> anyhow::Result<ExitCode> {
    let mut settings = config.load().context("loading the configuration")?;
    if std::env::var_os("RUST_LOG").is_none() {
        // The demo's tasks have no callbackUrl and it configures no subscriber: the notification
        // worker's warning about unsigned webhooks is about nothing it will send.
        settings.log.filter = "warn,imagepipe_notification_worker=error".into();
    }
    let telemetry = imagepipe_runtime::telemetry::init("imagepipe", &settings.log, &settings.telemetry)?;
    settings.ai.model_dir = tokio::task::spawn_blocking({
        let dir = settings.ai.model_dir.clone();
        move || imagepipe::model::prepare(&dir)
    })
    .await
    .context("preparing the model")??;

    let work = tempfile::tempdir().context("creating a temporary directory")?;
    settings.bus = BusConfig { prefix: settings.bus.prefix.clone(), ..BusConfig::default() };
    settings.store.kind = StoreKind::Embedded;
    settings.store.path = work.path().join("store");
    settings.blob.dir = work.path().join("blobs");
    settings.http.bind = std::net::Ipv4Addr::LOCALHOST.into();
    settings.http.port = 0;

    let pipeline = Pipeline::start(settings).await.context("starting the pipeline")?;
    eprintln!("imagepipe demo: {} photos through download → metadata → ai", SAMPLES.len());
    let outcome = submit_and_wait(&pipeline, Duration::from_secs(args.timeout)).await;
    let stopped = pipeline.stop().await;
    telemetry.shutdown();
    let tasks = outcome?;
    stopped.context("stopping the pipeline")?;

    if args.json {
        print_json(&tasks)?;
    } else {
        outln!("{}", table(&tasks));
    }
    let failed: Vec<_> = tasks.iter().filter(|(_, t)| t.state != TaskState::Completed).collect();
    for (file, task) in &failed {
        eprintln!("imagepipe demo: {file} ({}) {}: {}", task.id, task.state, failure_reason(task));
    }
    Ok(if failed.is_empty() { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

/// Uploads every sample, submits it as a `blob` task and waits for all of them.
async fn submit_and_wait(pipeline: &Pipeline, timeout: Duration) -> anyhow::Result<Vec<(String, Task)>> {
    let run = uuid_like();
    let mut ids = Vec::new();
    for sample in SAMPLES {
        let key = pipeline.blobs().put(Bytes::from_static(sample.bytes)).await.context("storing a sample")?;
        let task_id = format!("tsk_demo_{run}_{}", sample.name.trim_end_matches(".jpg"));
        let submit = SubmitTask {
            task_id: Some(task_id.clone()),
            blob: Some(key.to_string()),
            labels: [(FILE_LABEL.to_owned(), sample.name.to_owned())].into(),
            ..SubmitTask::default()
        };
        pipeline.submit(&submit).await?;
        ids.push(task_id);
    }
    let tasks = pipeline.wait_for(&ids, timeout).await?;
    Ok(SAMPLES.iter().map(|s| s.name.to_owned()).zip(tasks).collect())
}

/// A short id unique to this run (task ids must not repeat within a store).
fn uuid_like() -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    format!("{:x}", nanos & 0xffff_ffff_ffff)
}

fn table(tasks: &[(String, Task)]) -> Table {
    let mut table = Table::new();
    table.load_preset(UTF8_FULL).set_content_arrangement(ContentArrangement::Dynamic).set_header([
        "file",
        "size",
        "dimensions",
        "camera",
        "top label",
        "tags",
        "download",
        "metadata",
        "ai",
    ]);
    for (file, task) in tasks {
        let outputs = &task.outputs;
        let metadata = outputs.metadata.as_ref();
        let camera = metadata
            .and_then(|m| m.exif.as_ref())
            .map(|e| [e.make.as_deref(), e.model.as_deref()].into_iter().flatten().collect::<Vec<_>>().join(" "))
            .filter(|c| !c.is_empty())
            .unwrap_or_else(|| "—".into());
        let analysis = outputs.analysis.as_ref();
        let top = analysis.and_then(top_label).unwrap_or_else(|| failure_reason(task));
        let top_tags = analysis.map(|a| tags(a, 5)).unwrap_or_default();
        let stage = |step| step_ms(task, step).map_or_else(|| "—".into(), duration);
        table.add_row([
            file.clone(),
            outputs.download.as_ref().map_or_else(|| "—".into(), |d| size(d.size)),
            metadata.map_or_else(|| "—".into(), |m| format!("{}×{}", m.width, m.height)),
            camera,
            top,
            top_tags,
            stage(Step::Download),
            stage(Step::Metadata),
            stage(Step::Analyze),
        ]);
    }
    table
}
