//! The overview (`/`): every stage queue with its depth, work in flight, rate, oldest wait and a
//! pause/resume button; finished tasks per second and the stage latencies over the last hour
//! and the top failure reasons (the analytics worker's `/v1/stats`); the dead-letter count.
//! `/partials/overview` is the live part, refreshed as events arrive.

use std::fmt::Write as _;

use axum::extract::State;
use axum::response::Html;
use imagepipe_analytics_worker::api::{LastHourView, StatsResponse};
use imagepipe_runtime::http::Scope;
use maud::{Markup, html};

use super::access::Viewer;
use super::layout::{self, Section};
use super::{Dashboard, format};
use crate::api::DeadLetterListing;
use crate::api::queue_control::{QueueView, QueuesView};
use crate::cluster::ClusterView;

/// `GET /`.
pub async fn page(State(dashboard): State<Dashboard>, viewer: Viewer) -> Html<String> {
    let live = live(&dashboard, &viewer).await;
    let body = html! {
        h1 { "Overview" }
        div id="live" data-partial="/partials/overview" { (live) }
        @if viewer.may(Scope::Submit) { (upload_form()) }
    };
    layout::page("Overview", &viewer, Section::Overview, Some("overview"), body)
}

/// `GET /partials/overview`: the live part of the overview.
pub async fn partial(State(dashboard): State<Dashboard>, viewer: Viewer) -> Html<String> {
    Html(live(&dashboard, &viewer).await.into_string())
}

async fn live(dashboard: &Dashboard, viewer: &Viewer) -> Markup {
    let (queues, stats, dead, cluster) = tokio::join!(
        dashboard.api.get::<QueuesView>("/v1/queues"),
        dashboard.api.get::<StatsResponse>("/v1/stats"),
        dashboard.api.get::<DeadLetterListing>("/v1/dlq?limit=1"),
        dashboard.api.get::<ClusterView>("/v1/cluster"),
    );
    html! {
        section aria-labelledby="queues-h" {
            h2 id="queues-h" { "Queues" }
            @match &queues {
                Ok(view) => (queue_table(&view.queues, viewer.may(Scope::Operate))),
                Err(e) => (layout::unavailable("Queues", e)),
            }
        }
        div.columns {
            section aria-labelledby="throughput-h" {
                h2 id="throughput-h" { "Last hour" }
                @match &stats {
                    Ok(stats) => (last_hour(&stats.last_hour)),
                    Err(e) => (layout::unavailable("Statistics", e)),
                }
            }
            section aria-labelledby="failures-h" {
                h2 id="failures-h" { "Failures" }
                @match &dead {
                    Ok(listing) => p {
                        a href="/dlq" data-dead-letters=(listing.total) { (format::count(listing.total, "dead letter", "dead letters")) }
                    },
                    Err(e) => (layout::unavailable("Dead letters", e)),
                }
                @if let Ok(stats) = &stats {
                    (failure_reasons(&stats.last_hour))
                }
            }
        }
        section aria-labelledby="cluster-h" {
            h2 id="cluster-h" { "Coordinators" }
            @match &cluster {
                Ok(view) => (replica_table(view)),
                Err(e) => (layout::unavailable("Coordinators", e)),
            }
        }
    }
}

/// The coordinator replicas with the shards each owns (the balance: `shards / replicas` ± 1
/// once settled) and their work, and the shards nobody owns.
fn replica_table(view: &ClusterView) -> Markup {
    let unowned = view.shards.iter().filter(|s| s.owner.is_none()).count();
    html! {
        div.scroll {
            table.replicas data-shards=(view.shard_count) data-unowned=(unowned) {
                caption { (format::count(view.replicas.len() as u64, "replica", "replicas")) ", " (format::count(u64::from(view.shard_count), "shard", "shards")) }
                thead { tr {
                    th scope="col" { "Replica" } th.num scope="col" { "Shards" } th.num scope="col" { "In flight" }
                    th.num scope="col" { "Queued" }
                } }
                tbody {
                    @for replica in &view.replicas {
                        @let mine = view.shards.iter().filter(|s| s.owner.as_deref() == Some(replica.id.as_str()));
                        @let (in_flight, queued) = mine.fold((0, 0), |(f, q), s| (f + s.in_flight, q + s.queued));
                        tr data-replica=(replica.id) {
                            th scope="row" { (replica.id) @if let Some(address) = &replica.address { br; small { (address) } } }
                            td.num data-owned=(replica.shards) { (replica.shards) }
                            td.num { (in_flight) }
                            td.num { (queued) }
                        }
                    }
                }
            }
        }
        @if unowned > 0 {
            p.warning { (format::count(unowned as u64, "shard has", "shards have")) " no owner right now (a replica stopped; another takes them when their leases run out)." }
        }
    }
}

/// The queues, with their pause/resume buttons when `controls` (the viewer may operate).
fn queue_table(queues: &[QueueView], controls: bool) -> Markup {
    html! {
        div.scroll {
            table.queues {
                caption.visually-hidden { "Stage queues" }
                thead { tr {
                    th scope="col" { "Queue" } th.num scope="col" { "Waiting" } th.num scope="col" { "In flight" }
                    th.num scope="col" { "Rate" } th.num scope="col" { "Oldest wait" } th.num scope="col" { "Workers" }
                    th scope="col" { "State" } th scope="col" { span.visually-hidden { "Action" } }
                } }
                tbody {
                    @for queue in queues {
                        tr data-queue=(queue.name) {
                            th scope="row" { (queue.name) br; small { (queue.queue) } }
                            td.num { @match queue.depth { Some(depth) => (depth), None => "–" } }
                            td.num { (queue.in_flight) }
                            td.num { (format!("{:.1}/s", queue.rate_per_sec)) }
                            td.num { @match queue.oldest_wait_ms { Some(ms) => (format::duration_ms(ms as f64)), None => "–" } }
                            td.num { (queue.consumers) }
                            td {
                                @if queue.pausing { span.badge.pausing title="a worker has not stopped taking messages yet" { "pausing" } }
                                @else if queue.paused { span.badge.paused { "paused" } }
                                @else { span.badge.running { "running" } }
                            }
                            td {
                                @let (verb, label) = if queue.paused { ("resume", "Resume") } else { ("pause", "Pause") };
                                @if controls {
                                    button type="button" data-api=(format!("/v1/queues/{}/{verb}", queue.name)) data-method="POST"
                                        aria-label=(format!("{label} the {} queue", queue.name)) { (label) }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

fn last_hour(window: &LastHourView) -> Markup {
    html! {
        div.cards {
            div.card { span.big { (format!("{:.2}", window.tasks_per_second)) } span { "tasks/s" } }
            div.card { span.big { (window.tasks.completed) } span { "completed" } }
            div.card { span.big { (window.tasks.failed) } span { "failed" } }
            div.card { span.big { (window.tasks.cancelled) } span { "cancelled" } }
        }
        (sparkline(window))
        div.scroll { table.latencies {
            caption { "Stage latency, last hour" }
            thead { tr { th scope="col" { "Span" } th.num scope="col" { "p50" } th.num scope="col" { "p95" } th.num scope="col" { "Samples" } } }
            tbody {
                @for (span, latency) in &window.latencies {
                    tr {
                        th scope="row" { (span.replace('_', " ")) }
                        td.num { @match latency.p50_ms { Some(ms) => (format::duration_ms(ms)), None => "–" } }
                        td.num { @match latency.p95_ms { Some(ms) => (format::duration_ms(ms)), None => "–" } }
                        td.num { (latency.count) }
                    }
                }
            }
        } }
    }
}

/// Finished tasks per minute as bars (completed, failed on top), with a text alternative.
fn sparkline(window: &LastHourView) -> Markup {
    let (width, height) = (240.0, 48.0);
    let minutes = window.per_minute.len().max(1) as f64;
    let most = window.per_minute.iter().map(|m| m.completed + m.failed + m.cancelled).max().unwrap_or(0).max(1) as f64;
    let bar = width / minutes;
    let mut completed = String::new();
    let mut failed = String::new();
    for (i, minute) in window.per_minute.iter().enumerate() {
        let x = i as f64 * bar;
        let ok = minute.completed as f64 / most * height;
        let bad = (minute.failed + minute.cancelled) as f64 / most * height;
        if ok > 0.0 {
            let _ = write!(completed, "M{x:.1} {:.1}h{:.1}v{ok:.1}h-{:.1}z", height - ok, bar * 0.8, bar * 0.8);
        }
        if bad > 0.0 {
            let _ = write!(failed, "M{x:.1} {:.1}h{:.1}v{bad:.1}h-{:.1}z", height - ok - bad, bar * 0.8, bar * 0.8);
        }
    }
    let total: u64 = window.per_minute.iter().map(|m| m.completed + m.failed + m.cancelled).sum();
    let label = format!(
        "{} finished in the last {}, at most {most} in one minute",
        format::count(total, "task", "tasks"),
        format::count(window.per_minute.len() as u64, "minute", "minutes")
    );
    html! {
        svg.sparkline viewBox=(format!("0 0 {width} {height}")) role="img" aria-label=(label) preserveAspectRatio="none" {
            path.ok d=(completed) {}
            path.bad d=(failed) {}
        }
    }
}

fn failure_reasons(window: &LastHourView) -> Markup {
    html! {
        @if window.failure_reasons.is_empty() {
            p { "No task failed in the last hour." }
        } @else {
            table.reasons {
                caption { "Top failure reasons, last hour" }
                thead { tr { th scope="col" { "Code" } th.num scope="col" { "Tasks" } } }
                tbody {
                    @for reason in &window.failure_reasons {
                        tr { th scope="row" { code { (reason.code) } } td.num { (reason.count) } }
                    }
                }
            }
        }
    }
}

/// The form that submits a photo from the browser: uploaded to `/v1/blobs`, then submitted as a
/// task with the labels given and the file's name as its `file` label
/// ([`crate::describe::FILE_LABEL`]) unless the labels name one.
pub fn upload_form() -> Markup {
    html! {
        section aria-labelledby="upload-h" {
            h2 id="upload-h" { "Submit a photo" }
            form.upload data-upload {
                div.field.file {
                    label for="upload-file" { "Image file" }
                    input id="upload-file" type="file" name="file" accept="image/*" required;
                }
                div.field {
                    label for="upload-labels" { "Labels (key=value, comma separated)" }
                    input id="upload-labels" type="text" name="labels" placeholder="album=holidays";
                }
                div.field.narrow {
                    label for="upload-priority" { "Priority" }
                    select id="upload-priority" name="priority" {
                        option value="normal" selected { "normal" } option value="high" { "high" } option value="low" { "low" }
                    }
                }
                div.actions { button type="submit" { "Submit" } output data-upload-result {} }
            }
        }
    }
}
