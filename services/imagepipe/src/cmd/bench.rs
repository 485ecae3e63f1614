//! `imagepipe bench`: throughput, latency, broker messages, CPU and memory of the pipeline on a
//! chosen bus and store (see `imagepipe::bench`).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, ValueEnum};
use imagepipe::bench::photos::{self, Stage};
use imagepipe::bench::{self, BenchOptions, Scenario, Stages, compare, idle};
use imagepipe_bus::BusKind;
use imagepipe_runtime::ConfigArgs;
use imagepipe_runtime::config::StoreKind;

use super::print_json;

/// Options of `imagepipe bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Bus backend (default: `bus.kind` of the config).
    #[arg(long, value_enum)]
    bus: Option<BusArg>,
    /// Task store (default: `store.kind` of the config).
    #[arg(long, value_enum)]
    store: Option<StoreArg>,
    /// `throughput`: full load, then low load; `priority`: a high task's latency idle and behind
    /// `--tasks` queued low tasks (`--low-load-tasks` high tasks timed in each phase);
    /// `similarity`: the similarity index at `--tasks` images (default 100000) with
    /// `--low-load-tasks` queries (default 1000), and a rebuild of `--rebuild-images` from the
    /// event stream.
    #[arg(long, value_enum, default_value_t = ScenarioArg::Throughput)]
    scenario: ScenarioArg,
    /// `noop`: stages that answer at once (orchestration only); `real`: the real download,
    /// metadata and AI workers on the sample photos.
    #[arg(long, value_enum, default_value_t = ModeArg::Noop)]
    mode: ModeArg,
    /// Tasks submitted at once in the full-load phase (default 5000; 200 in real mode).
    #[arg(long)]
    tasks: Option<usize>,
    /// Tasks submitted one at a time in the low-load phase (default 500; 20 in real mode).
    #[arg(long)]
    low_load_tasks: Option<usize>,
    /// Similarity scenario: images replayed by the rebuild from the event stream.
    #[arg(long, default_value_t = 10_000)]
    rebuild_images: usize,
    /// Runs; figures are the medians.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..))]
    runs: u64,
    /// Longest time one phase may take, in seconds.
    #[arg(long, default_value_t = 600)]
    timeout: u64,
    /// Skip starting each service binary to measure its idle memory.
    #[arg(long)]
    no_idle_rss: bool,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
    /// Real mode: submit the photos of this directory instead of the bundled samples, and
    /// measure each stage on them on its own (CPU per image, peak RSS).
    #[arg(long, value_name = "DIR")]
    photos: Option<PathBuf>,
    /// With `--photos`: run Pillow's draft decode and onnxruntime (from the Python environment
    /// of scripts/prepare-model.sh) on the same photos and print the ratios.
    #[arg(long, requires = "photos")]
    compare: bool,
    /// Internal: measure one stage on `--photos` in this process and print its figures as JSON.
    #[arg(long, value_enum, hide = true, requires = "photos", requires = "previews")]
    probe: Option<Stage>,
    /// Internal: where the metadata probe writes the previews the AI probe reads.
    #[arg(long, hide = true)]
    previews: Option<PathBuf>,
    /// Run no coordinator in this process: coordinator processes started beforehand (for
    /// instance by scripts/bench-shards.sh) on the same bus and Redis under the configured
    /// `bus.prefix` (`IMAGEPIPE_BUS__PREFIX`) do the coordination; this process runs the no-op
    /// stages and the driver. The prefix's streams and keys are left for `--clean-up-prefix`
    /// once those coordinators stopped. Needs NATS or Kafka and Redis.
    #[arg(long)]
    external_coordinators: bool,
    /// With `--external-coordinators`: the coordinators' pids (comma-separated), whose CPU time
    /// per task is reported.
    #[arg(long, value_delimiter = ',', requires = "external_coordinators")]
    coordinator_pids: Vec<u32>,
    /// Where the driver sends each submit: `queue` (`tasks.submit`, as a client that knows
    /// nothing of shards; a replica that does not own the task's shard hands it on) or `shard`
    /// (the partition of the task's shard, read by its owner: docs/contracts.md, "Shards").
    #[arg(long, value_enum, default_value_t = SubmitToArg::Queue)]
    submit_to: SubmitToArg,
    /// Delete the streams, topics and Redis keys of the configured `bus.prefix` (what runs
    /// with `--external-coordinators` leave behind) and exit; run it once the coordinators of
    /// that prefix stopped.
    #[arg(long)]
    clean_up_prefix: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum SubmitToArg {
    Queue,
    Shard,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum BusArg {
    Memory,
    Nats,
    Kafka,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum StoreArg {
    Embedded,
    Redis,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum ScenarioArg {
    Throughput,
    Priority,
    Similarity,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum ModeArg {
    Noop,
    Real,
}

/// Runs the benchmark and prints its report.
pub async fn run(config: &ConfigArgs, args: BenchArgs) -> anyhow::Result<ExitCode> {
    let mut settings = config.load().context("loading the configuration")?;
    if std::env::var_os("RUST_LOG").is_none() {
        settings.log.filter = "warn".into();
    }
    let telemetry = imagepipe_runtime::telemetry::init("imagepipe", &settings.log, &settings.telemetry)?;
    imagepipe_runtime::metrics::install()?;
    if let Some(bus) = args.bus {
        settings.bus.kind = match bus {
            BusArg::Memory => BusKind::Memory,
            BusArg::Nats => BusKind::Nats,
            BusArg::Kafka => BusKind::Kafka,
        };
    }
    if let Some(store) = args.store {
        settings.store.kind = match store {
            StoreArg::Embedded => StoreKind::Embedded,
            StoreArg::Redis => StoreKind::Redis,
        };
    }
    if args.clean_up_prefix {
        let left = bench::clean_up_prefix(&settings).await;
        telemetry.shutdown();
        let left = left.context("cleaning up the prefix")?;
        for what in &left {
            eprintln!("imagepipe bench: left behind: {what}");
        }
        return Ok(if left.is_empty() { ExitCode::SUCCESS } else { ExitCode::FAILURE });
    }
    if args.external_coordinators && (settings.bus.kind == BusKind::Memory || settings.store.kind != StoreKind::Redis) {
        anyhow::bail!(
            "--external-coordinators needs a bus and a store other processes share: --bus nats|kafka --store redis"
        );
    }
    let mode = if args.mode == ModeArg::Real { Stages::Real } else { Stages::Noop };
    if args.photos.is_some() && mode != Stages::Real {
        anyhow::bail!("--photos measures the real stages: add --mode real");
    }
    let model_dir = if mode == Stages::Real {
        let dir = settings.ai.model_dir.clone();
        let prepared = tokio::task::spawn_blocking(move || imagepipe::model::prepare(&dir)).await;
        settings.ai.model_dir = prepared.context("preparing the model")??;
        Some(settings.ai.model_dir.clone())
    } else {
        imagepipe::model::is_prepared(&settings.ai.model_dir)
            .then(|| std::path::absolute(&settings.ai.model_dir).unwrap_or_else(|_| settings.ai.model_dir.clone()))
    };
    if let (Some(stage), Some(photos), Some(previews)) = (args.probe, &args.photos, &args.previews) {
        let figures = photos::probe(stage, &settings, photos, previews).await?;
        telemetry.shutdown();
        print_json(&figures)?;
        return Ok(ExitCode::SUCCESS);
    }
    let scenario = match args.scenario {
        ScenarioArg::Throughput => Scenario::Throughput,
        ScenarioArg::Priority => Scenario::Priority,
        ScenarioArg::Similarity => {
            let outcome = similarity(&settings, &args).await;
            telemetry.shutdown();
            return outcome;
        }
    };
    let options = BenchOptions {
        scenario,
        mode,
        tasks: args.tasks.unwrap_or(if mode == Stages::Real { 200 } else { 5_000 }),
        low_load_tasks: args.low_load_tasks.unwrap_or(if mode == Stages::Real { 20 } else { 500 }),
        runs: usize::try_from(args.runs).unwrap_or(usize::MAX),
        timeout: Duration::from_secs(args.timeout),
        photos: args.photos.clone(),
    };
    let work = tempfile::tempdir().context("creating a work directory")?;
    let launch = if args.no_idle_rss {
        None
    } else {
        let exe = std::env::current_exe().context("locating the imagepipe executable")?;
        Some(idle::Launch {
            dir: exe.parent().map(ToOwned::to_owned).unwrap_or_default(),
            config_file: config.config.clone(),
            env: Vec::new(),
            work: work.path().to_owned(),
            model_dir,
        })
    };
    eprintln!(
        "imagepipe bench: {} run(s) of {} + {} tasks, {mode:?} stages, bus {:?}, store {:?}",
        options.runs, options.tasks, options.low_load_tasks, settings.bus.kind, settings.store.kind
    );
    let stages = match &args.photos {
        Some(photos) => {
            let exe = std::env::current_exe().context("locating the imagepipe executable")?;
            eprintln!("imagepipe bench: each stage on its own on the photos of {}", photos.display());
            photos::measure(&exe, config.config.as_deref(), photos, work.path()).await?
        }
        None => Vec::new(),
    };
    let comparison = match &args.photos {
        Some(photos) if args.compare => {
            let largest = settings.metadata.largest_thumbnail();
            let smallest = settings.metadata.thumbnails.iter().map(|t| t.size).min().unwrap_or(largest);
            eprintln!("imagepipe bench: Pillow and onnxruntime on the same photos");
            Some(compare::run(photos, &settings.ai.model_dir, largest, smallest).await?)
        }
        _ => None,
    };
    let setup = bench::Setup {
        external: args.external_coordinators.then(|| bench::External { pids: args.coordinator_pids.clone() }),
        route: match args.submit_to {
            SubmitToArg::Queue => bench::driver::SubmitRoute::Queue,
            SubmitToArg::Shard => bench::driver::SubmitRoute::Shard(settings.coordinator.shards),
        },
    };
    if let Some(external) = &setup.external {
        eprintln!(
            "imagepipe bench: external coordinators ({} pid(s) given) under prefix {}",
            external.pids.len(),
            settings.bus.prefix
        );
    }
    let report = bench::report_with(&settings, &options, &setup, launch).await;
    telemetry.shutdown();
    let mut report = report.context("running the benchmark")?;
    report.stages = stages;
    report.comparison = comparison;
    if args.json {
        print_json(&report)?;
    } else {
        out!("{}", report.text());
    }
    Ok(ExitCode::SUCCESS)
}

/// `--scenario similarity`: the similarity index at `--tasks` images, and a rebuild from the
/// event stream.
async fn similarity(settings: &imagepipe_runtime::Settings, args: &BenchArgs) -> anyhow::Result<ExitCode> {
    let (images, queries) = (args.tasks.unwrap_or(100_000), args.low_load_tasks.unwrap_or(1_000));
    eprintln!(
        "imagepipe bench: the similarity index at {images} images ({queries} queries, exact up to {}), \
         a rebuild of {} from the event stream",
        settings.similarity.exact_limit, args.rebuild_images
    );
    let (scale, rebuilt) = bench::similarity::run(settings, images, queries, args.rebuild_images).await?;
    if args.json {
        print_json(&serde_json::json!({ "index": scale.to_string(), "rebuild": rebuilt }))?;
    } else {
        outln!("{scale}");
        outln!("{rebuilt}");
    }
    Ok(ExitCode::SUCCESS)
}
