//! The figures of a run, their medians across runs, and how they are printed.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use super::Stages;
use super::compare::Comparison;
use super::driver::Phase;
use super::idle::IdleRss;
use super::photos::{Stage, StageFigures};
use super::priority::PriorityFigures;
use super::stats::{Percentiles, median};

/// One load phase.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LoadFigures {
    /// Tasks submitted.
    pub tasks: usize,
    /// Tasks that completed.
    pub completed: usize,
    /// Tasks that failed.
    pub failed: usize,
    /// First submit to last end, seconds.
    pub seconds: f64,
    /// Tasks ended per second over that time.
    pub tasks_per_s: f64,
    /// Submit → `task.completed` received.
    pub latency: Percentiles,
}

impl LoadFigures {
    /// The figures of a measured phase.
    pub fn of(phase: &Phase) -> Self {
        let seconds = phase.wall.as_secs_f64();
        let ended = phase.completed + phase.failed;
        Self {
            tasks: phase.submitted,
            completed: phase.completed,
            failed: phase.failed,
            seconds,
            tasks_per_s: if seconds > 0.0 { ended as f64 / seconds } else { 0.0 },
            latency: Percentiles::of(&phase.latencies),
        }
    }

    fn median(runs: &[&Self]) -> Self {
        let counts = |f: fn(&Self) -> usize| median(runs.iter().map(|r| f(r) as f64)) as usize;
        Self {
            tasks: counts(|r| r.tasks),
            completed: counts(|r| r.completed),
            failed: counts(|r| r.failed),
            seconds: median(runs.iter().map(|r| r.seconds)),
            tasks_per_s: median(runs.iter().map(|r| r.tasks_per_s)),
            latency: Percentiles::median(&runs.iter().map(|r| r.latency).collect::<Vec<_>>()),
        }
    }
}

/// Broker messages per task of the full-load phase.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MessageFigures {
    /// Messages per task: the broker's count where it can be asked, else the bus's.
    pub per_task: f64,
    /// `broker` (NATS: stream sequence deltas of the run's prefix) or `bus` (publishes counted
    /// through the bus).
    pub counted_by: String,
    /// The broker's count per stream, per task.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub broker_by_stream: Option<BTreeMap<String, f64>>,
    /// Publishes through the bus per task.
    pub bus_per_task: f64,
    /// Publishes through the bus per task, by queue or event type.
    pub by_destination: BTreeMap<String, f64>,
}

impl MessageFigures {
    fn median(runs: &[&Self]) -> Self {
        let first = runs.first().copied().cloned().unwrap_or_default();
        let broker_by_stream = first.broker_by_stream.as_ref().map(|streams| {
            median_map(streams.keys(), |k| {
                runs.iter().filter_map(|r| r.broker_by_stream.as_ref()?.get(k).copied()).collect()
            })
        });
        Self {
            per_task: median(runs.iter().map(|r| r.per_task)),
            counted_by: first.counted_by,
            broker_by_stream,
            bus_per_task: median(runs.iter().map(|r| r.bus_per_task)),
            by_destination: median_map(first.by_destination.keys(), |k| {
                runs.iter().filter_map(|r| r.by_destination.get(k).copied()).collect()
            }),
        }
    }
}

/// CPU milliseconds per task of the full-load phase, by process (`/proc/<pid>/stat`).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CpuFigures {
    /// This process: the coordinator (unless external), the stage workers and the driver.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub imagepipe: Option<f64>,
    /// The local broker process (nats-server, or a Tansu Kafka broker), when it could be identified.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub broker: Option<f64>,
    /// The local store process (redis-server), when it could be identified.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub store: Option<f64>,
    /// The external coordinator processes together (`--coordinator-pids`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub coordinators: Option<f64>,
}

impl CpuFigures {
    fn median(runs: &[&Self]) -> Self {
        let of = |f: fn(&Self) -> Option<f64>| {
            let values: Vec<f64> = runs.iter().filter_map(|r| f(r)).collect();
            (!values.is_empty()).then(|| median(values))
        };
        Self {
            imagepipe: of(|c| c.imagepipe),
            broker: of(|c| c.broker),
            store: of(|c| c.store),
            coordinators: of(|c| c.coordinators),
        }
    }
}

/// Everything one run measured.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RunFigures {
    /// Every task submitted as fast as possible.
    pub full_load: LoadFigures,
    /// One task at a time.
    pub low_load: LoadFigures,
    /// Each step's time from dispatch to result (ms, the coordinator's clock), over the
    /// low-load tasks.
    pub stage_ms: BTreeMap<String, Percentiles>,
    /// Broker messages per task.
    pub messages: MessageFigures,
    /// CPU time per task.
    pub cpu_ms_per_task: CpuFigures,
    /// `VmHWM` of this process over the run: reset as the run starts, read as it ends; `None`
    /// where it cannot be reset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peak_rss_bytes: Option<u64>,
    /// The priority scenario's figures (`--scenario priority`); its backlog is `full_load`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub priority: Option<PriorityFigures>,
}

impl RunFigures {
    /// Each figure's median across `runs`.
    pub fn median(runs: &[RunFigures]) -> Self {
        let all: Vec<&RunFigures> = runs.iter().collect();
        let first = runs.first().cloned().unwrap_or_default();
        let peaks: Vec<f64> = runs.iter().filter_map(|r| r.peak_rss_bytes.map(|b| b as f64)).collect();
        Self {
            full_load: LoadFigures::median(&all.iter().map(|r| &r.full_load).collect::<Vec<_>>()),
            low_load: LoadFigures::median(&all.iter().map(|r| &r.low_load).collect::<Vec<_>>()),
            stage_ms: first
                .stage_ms
                .keys()
                .map(|stage| {
                    let per_run: Vec<Percentiles> =
                        runs.iter().filter_map(|r| r.stage_ms.get(stage).copied()).collect();
                    (stage.clone(), Percentiles::median(&per_run))
                })
                .collect(),
            messages: MessageFigures::median(&all.iter().map(|r| &r.messages).collect::<Vec<_>>()),
            cpu_ms_per_task: CpuFigures::median(&all.iter().map(|r| &r.cpu_ms_per_task).collect::<Vec<_>>()),
            peak_rss_bytes: (!peaks.is_empty()).then(|| median(peaks) as u64),
            priority: PriorityFigures::median(&runs.iter().filter_map(|r| r.priority.as_ref()).collect::<Vec<_>>()),
        }
    }
}

fn median_map<'a>(keys: impl Iterator<Item = &'a String>, values: impl Fn(&str) -> Vec<f64>) -> BTreeMap<String, f64> {
    keys.map(|k| (k.clone(), median(values(k)))).collect()
}

/// The whole report of `imagepipe bench`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// Stage workers.
    pub mode: Stages,
    /// `bus.kind`.
    pub bus: String,
    /// `store.kind`.
    pub store: String,
    /// CPU cores of the machine.
    pub cores: usize,
    /// The coordinator ran in processes of its own (`--external-coordinators`), not in this one:
    /// how many (`--coordinator-pids`; 0 when not listed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub external_coordinators: Option<usize>,
    /// Where the driver sent the submits: `queue` (`tasks.submit`) or `shard` (the partition of
    /// the task's shard).
    pub submit_to: String,
    /// Each figure's median across runs.
    pub median: RunFigures,
    /// Every run.
    pub runs: Vec<RunFigures>,
    /// Idle resident memory of each service binary.
    pub idle_rss: Vec<IdleRss>,
    /// What could not be cleaned up after the runs.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub left_behind: Vec<String>,
    /// The directory of photos of a real-mode run, when not the bundled samples.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub photos: Option<String>,
    /// Each stage on its own, per photo (`--photos`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub stages: Vec<StageFigures>,
    /// Pillow and onnxruntime on the same photos (`--compare`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub comparison: Option<Comparison>,
}

impl Report {
    /// The report as text for a terminal.
    pub fn text(&self) -> String {
        let m = &self.median;
        let unit = if self.mode == Stages::Real { "images" } else { "tasks" };
        let stages = match (self.mode, &self.photos) {
            (Stages::Noop, _) => "no-op stages (orchestration only)".to_owned(),
            (Stages::Real, None) => "real download, metadata and AI workers on the sample photos".to_owned(),
            (Stages::Real, Some(dir)) => format!("real download, metadata and AI workers on the photos of {dir}"),
        };
        let mut out = String::new();
        let _ = writeln!(
            out,
            "imagepipe bench: {stages}; bus {}, store {}; {} core(s); median of {} run(s)",
            self.bus,
            self.store,
            self.cores,
            self.runs.len()
        );
        match self.external_coordinators {
            None => {
                let _ = writeln!(
                    out,
                    "  everything in this process: coordinator, 3 stage workers, driver; broker and store local; \
                     submits to the {}",
                    route_text(&self.submit_to)
                );
            }
            Some(n) => {
                let _ = writeln!(
                    out,
                    "  {} external coordinator process(es); in this process: 3 stage workers, driver; broker and \
                     store local; submits to the {}",
                    if n == 0 { "unlisted".to_owned() } else { n.to_string() },
                    route_text(&self.submit_to)
                );
            }
        }
        if let Some(p) = &m.priority {
            let _ = writeln!(
                out,
                "priority     a high task, submit → task.completed: idle {}; behind {} queued low tasks {}",
                latency(&p.idle),
                p.backlog,
                latency(&p.under_backlog)
            );
            let _ = writeln!(
                out,
                "  p50 ratio {:.2} (target ≤ 3); {} low tasks finished while the {} probes ran, {} still queued after \
                 the last; low tasks {:.0}/s",
                p.ratio_p50, p.low_done_during_probes, p.probes, p.low_left_after_probes, p.low_tasks_per_s
            );
            if p.low_left_after_probes == 0 {
                let _ = writeln!(
                    out,
                    "  the backlog drained before the last probe ended: not every probe ran behind it \
                     (more --tasks, or fewer --low-load-tasks)"
                );
            }
            if self.runs.len() > 1 {
                let each: Vec<String> = self
                    .runs
                    .iter()
                    .filter_map(|r| r.priority.as_ref())
                    .map(|p| {
                        format!("{:.2} ms / {:.2} ms ({:.2}×)", p.idle.p50_ms, p.under_backlog.p50_ms, p.ratio_p50)
                    })
                    .collect();
                let _ = writeln!(out, "  each run idle / under backlog p50: {}", each.join("; "));
            }
        }
        let full = &m.full_load;
        let _ = writeln!(
            out,
            "full load    {} {unit} submitted at once: {:.0} {unit}/s ({:.2} s); submit → task.completed {}",
            full.tasks,
            full.tasks_per_s,
            full.seconds,
            latency(&full.latency)
        );
        let low = &m.low_load;
        let _ = writeln!(
            out,
            "low load     {} {unit}, one at a time: submit → task.completed {}",
            low.tasks,
            latency(&low.latency)
        );
        if !m.stage_ms.is_empty() {
            let stages: Vec<String> = ["download", "metadata", "analyze"]
                .iter()
                .filter_map(|stage| Some((stage, m.stage_ms.get(*stage)?)))
                .map(|(stage, p)| format!("{stage} p50 {:.0} ms / p95 {:.0} ms", p.p50_ms, p.p95_ms))
                .collect();
            let _ = writeln!(out, "stage time   {} (dispatch → result, low load, ms clock)", stages.join(", "));
        }
        let messages = &m.messages;
        let source = match &messages.broker_by_stream {
            Some(streams) => format!(
                "counted by the broker: JetStream stream sequences of the run's prefix, {}",
                streams.iter().map(|(s, n)| format!("{s} {n:.2}")).collect::<Vec<_>>().join(", ")
            ),
            None => "counted as publishes through the bus".to_owned(),
        };
        let _ = writeln!(out, "messages     {:.2} per task ({source})", messages.per_task);
        let destinations: Vec<String> = messages.by_destination.iter().map(|(d, n)| format!("{d} {n:.2}")).collect();
        let _ = writeln!(out, "  through the bus {:.2} per task: {}", messages.bus_per_task, destinations.join(", "));
        let cpu = &m.cpu_ms_per_task;
        let mut processes = vec![format!("imagepipe {}", ms(cpu.imagepipe))];
        if let Some(broker) = cpu.broker {
            processes.push(format!("broker {broker:.3} ms"));
        }
        if let Some(store) = cpu.store {
            processes.push(format!("store {store:.3} ms"));
        }
        if let Some(coordinators) = cpu.coordinators {
            processes.push(format!("coordinators {coordinators:.3} ms"));
        }
        let _ =
            writeln!(out, "CPU per task {} (process CPU time over the full-load phase / tasks)", processes.join(", "));
        let _ = writeln!(
            out,
            "peak RSS     imagepipe {} (VmHWM of this process during a run: coordinator, stages and driver)",
            mb(m.peak_rss_bytes)
        );
        let idle: Vec<String> = self
            .idle_rss
            .iter()
            .map(|i| match (&i.rss_bytes, &i.skipped) {
                (Some(bytes), _) => format!("{} {}", i.binary.trim_start_matches("imagepipe-"), mb(Some(*bytes))),
                (None, Some(why)) => format!("{} skipped: {why}", i.binary.trim_start_matches("imagepipe-")),
                (None, None) => i.binary.clone(),
            })
            .collect();
        if !idle.is_empty() {
            let _ = writeln!(
                out,
                "idle RSS     {} (each real binary on its own over this bus, VmRSS once ready)",
                idle.join(", ")
            );
        }
        if self.runs.len() > 1 {
            let each: Vec<String> = self
                .runs
                .iter()
                .map(|r| {
                    format!(
                        "{:.0}/s, low p50 {:.2} ms p99 {:.2} ms",
                        r.full_load.tasks_per_s, r.low_load.latency.p50_ms, r.low_load.latency.p99_ms
                    )
                })
                .collect();
            let _ = writeln!(out, "each run     {}", each.join("; "));
        }
        for left in &self.left_behind {
            let _ = writeln!(out, "not cleaned  {left}");
        }
        self.write_stages(&mut out);
        out
    }

    /// The per-photo stage figures and the comparison, when measured.
    fn write_stages(&self, out: &mut String) {
        if self.stages.is_empty() {
            return;
        }
        let _ = writeln!(
            out,
            "per photo    each stage alone in a process of its own, one image at a time, its CPU time per image:"
        );
        let compare = self.comparison.as_ref();
        for stage in &self.stages {
            let (name, theirs) = match stage.stage {
                Stage::Metadata => ("metadata", compare.and_then(|c| c.pillow_draft_derivatives_ms)),
                Stage::Ai => ("ai", None),
            };
            let mut line = format!(
                "  {name:<9} p50 {:.1} ms, p95 {:.1} ms per image ({} photos); peak RSS {}",
                stage.cpu_ms.p50_ms,
                stage.cpu_ms.p95_ms,
                stage.images,
                mb(stage.peak_rss_bytes)
            );
            if let Some(inference) = stage.inference_ms {
                let _ = write!(line, "; the model alone p50 {:.2} ms", inference.p50_ms);
            }
            let _ = writeln!(out, "{line}");
            if let (Some(theirs), Some(c)) = (theirs, compare) {
                let _ = writeln!(
                    out,
                    "    Pillow {} draft decode + the same derivatives: p50 {:.1} ms; ratio {:.2}×",
                    c.pillow,
                    theirs.p50_ms,
                    stage.cpu_ms.p50_ms / theirs.p50_ms
                );
            }
            if let (Stage::Metadata, Some(c)) = (stage.stage, compare)
                && let Some(theirs) = c.heif_convert_ms
            {
                let _ = writeln!(
                    out,
                    "    heif-convert (libheif {}) of the HEIC/AVIF photos to JPEG: p50 {:.1} ms; ratio {:.2}×",
                    c.libheif.as_deref().unwrap_or("?"),
                    theirs.p50_ms,
                    stage.cpu_ms.p50_ms / theirs.p50_ms
                );
            }
            if let (Some(inference), Some(c)) = (stage.inference_ms, compare) {
                let theirs = c.onnxruntime_inference_ms.p50_ms;
                let _ = writeln!(
                    out,
                    "    onnxruntime {} from Python, one thread: p50 {theirs:.2} ms; ratio {:.2}×",
                    c.onnxruntime,
                    inference.p50_ms / theirs
                );
            }
        }
        if let Some(thumbnail) = compare.and_then(|c| c.pillow_draft_thumbnail_ms) {
            let _ = writeln!(out, "  (Pillow draft decode to the thumbnail alone: p50 {:.1} ms)", thumbnail.p50_ms);
        }
        if self.median.full_load.tasks > 0 {
            let _ = writeln!(
                out,
                "  full load: {:.1} images/s through the whole pipeline on {} core(s)",
                self.median.full_load.tasks_per_s, self.cores
            );
        }
    }
}

fn latency(p: &Percentiles) -> String {
    format!("p50 {:.2} ms, p95 {:.2} ms, p99 {:.2} ms", p.p50_ms, p.p95_ms, p.p99_ms)
}

fn ms(value: Option<f64>) -> String {
    value.map_or_else(|| "n/a".into(), |v| format!("{v:.3} ms"))
}

fn route_text(route: &str) -> &'static str {
    if route == "shard" { "partition of the task's shard" } else { "queue tasks.submit" }
}

fn mb(bytes: Option<u64>) -> String {
    bytes.map_or_else(|| "n/a".into(), |b| format!("{:.1} MB", b as f64 / 1e6))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(tps: f64, p50: f64) -> RunFigures {
        RunFigures {
            full_load: LoadFigures { tasks: 10, completed: 10, tasks_per_s: tps, ..LoadFigures::default() },
            low_load: LoadFigures {
                latency: Percentiles { p50_ms: p50, p95_ms: p50 * 2.0, p99_ms: p50 * 3.0 },
                ..LoadFigures::default()
            },
            messages: MessageFigures {
                per_task: 12.0,
                counted_by: "bus".into(),
                by_destination: [("tasks.submit".to_owned(), 1.0)].into(),
                ..MessageFigures::default()
            },
            cpu_ms_per_task: CpuFigures { imagepipe: Some(tps / 1000.0), ..CpuFigures::default() },
            peak_rss_bytes: Some(tps as u64),
            ..RunFigures::default()
        }
    }

    #[test]
    fn the_median_run_takes_each_figure_s_median() {
        let m = RunFigures::median(&[run(100.0, 3.0), run(300.0, 1.0), run(200.0, 2.0)]);
        assert_eq!(m.full_load.tasks_per_s, 200.0);
        assert_eq!(m.low_load.latency, Percentiles { p50_ms: 2.0, p95_ms: 4.0, p99_ms: 6.0 });
        assert_eq!(m.messages.by_destination["tasks.submit"], 1.0);
        assert_eq!(m.cpu_ms_per_task.imagepipe, Some(0.2));
        assert_eq!(m.cpu_ms_per_task.broker, None);
        assert_eq!(m.peak_rss_bytes, Some(200));
    }
}
