//! One task (`/tasks/{id}`): its stage timeline (durations, attempts, errors), thumbnail and
//! previews, EXIF with the GPS position on a small map, dominant colours, predictions and tags,
//! history, similar images (fetched by the page from `/v1/tasks/{id}/similar`), the trace id
//! (linked to the trace UI when `telemetry.trace_ui_url` is set), and the buttons that cancel,
//! pause, resume and retry it. `/partials/tasks/{id}` is the live part.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};
use imagepipe_contracts::Step;
use imagepipe_contracts::step::{Exif, MetadataOutput};
use maud::{Markup, html};

use super::access::Viewer;
use super::layout::{self, Section};
use super::tasks::state_badge;
use super::{Dashboard, format};
use crate::api::{History, TaskView};
use crate::task::{HistoryEvent, Task, TaskState};

/// `GET /tasks/{id}`.
pub async fn page(State(dashboard): State<Dashboard>, viewer: Viewer, Path(id): Path<String>) -> Response {
    let live = match live(&dashboard, &id).await {
        Ok(live) => live,
        Err((status, message)) => {
            let body = html! { h1 { "Task " code { (id) } } p.notice role="alert" { (message) } };
            return (status, layout::page("Task", &viewer, Section::Tasks, None, body)).into_response();
        }
    };
    let body = html! {
        div id="live" data-partial=(format!("/partials/tasks/{id}")) { (live) }
        section aria-labelledby="similar-h" {
            h2 id="similar-h" { "Similar images" }
            div.grid data-similar=(id) aria-live="polite" { p { "Looking for similar images…" } }
        }
    };
    layout::page(&format!("Task {id}"), &viewer, Section::Tasks, Some(&format!("task:{id}")), body).into_response()
}

/// `GET /partials/tasks/{id}`: the live part of a task's page.
pub async fn partial(State(dashboard): State<Dashboard>, _viewer: Viewer, Path(id): Path<String>) -> Response {
    match live(&dashboard, &id).await {
        Ok(live) => Html(live.into_string()).into_response(),
        Err((status, message)) => (status, message).into_response(),
    }
}

async fn live(dashboard: &Dashboard, id: &str) -> Result<Markup, (StatusCode, String)> {
    let (view, history) = tokio::join!(
        dashboard.api.get::<TaskView>(format!("/v1/tasks/{id}")),
        dashboard.api.get::<History>(format!("/v1/tasks/{id}/history")),
    );
    let view = view.map_err(|e| (StatusCode::from_u16(e.status).unwrap_or(StatusCode::BAD_GATEWAY), e.message))?;
    let task = &view.task;
    let now = dashboard.clock.unix_ms();
    let trace = task.trace_id.to_string();
    Ok(html! {
        header.task-head {
            h1 { "Task " code { (task.id) } }
            (state_badge(task.state))
            (actions(task))
        }
        @if let Some(error) = &view.last_error {
            p.notice role="alert" { strong { "Last error: " } code { (error.code) } " " (error.message) }
        }
        dl.facts {
            dt { "Created" } dd { (format::at(task.created_at)) }
            dt { "Updated" } dd { (format::at(task.updated_at)) " (" (format::ago(now, task.updated_at)) ")" }
            dt { "Source" } dd { (source(task)) }
            @if !task.labels.is_empty() {
                dt { "Labels" } dd.labels { @for (k, v) in &task.labels { span.label { (k) "=" (v) } " " } }
            }
            dt { "Priority" } dd { (format!("{:?}", task.priority).to_lowercase()) }
            @if task.generation > 0 { dt { "Generation" } dd { (task.generation) } }
            dt { "Trace" } dd {
                @match dashboard.telemetry.trace_link(&trace) {
                    Some(link) => a href=(link) rel="noopener" target="_blank" { code { (trace) } },
                    None => code { (trace) },
                }
            }
        }
        (timeline(task, now))
        @if let Some(metadata) = &task.outputs.metadata { (images(task, metadata)) (metadata_facts(metadata)) }
        @if let Some(analysis) = &task.outputs.analysis {
            section aria-labelledby="predictions-h" {
                h2 id="predictions-h" { "Predictions" }
                p { small { "Model " (analysis.model) } }
                (scores("Predictions", &analysis.predictions))
                h3 { "Tags" }
                p.tags { @for tag in &analysis.tags { a.label href=(format!("/search?tag={}", urlencode(&tag.label))) { (tag.label) } " " } }
            }
        }
        section aria-labelledby="history-h" {
            h2 id="history-h" { "History" }
            @match &history {
                Ok(history) => (history_table(history)),
                Err(e) => (layout::unavailable("History", e)),
            }
        }
    })
}

fn urlencode(text: &str) -> String {
    url::form_urlencoded::byte_serialize(text.as_bytes()).collect()
}

fn source(task: &Task) -> Markup {
    let value = serde_json::to_value(&task.source).unwrap_or_default();
    let url = value.get("url").and_then(|u| u.as_str());
    let blob = value.get("blob").and_then(|u| u.as_str());
    html! {
        @if let Some(url) = url { code.url { (url) } }
        @else if let Some(blob) = blob { "uploaded " code { (blob) } }
        @else { code { (value.to_string()) } }
    }
}

/// The buttons the task's state allows.
fn actions(task: &Task) -> Markup {
    let id = &task.id;
    let running = !task.state.is_terminal();
    let paused = task.state == TaskState::Paused || task.pause_requested.is_some();
    let retryable = matches!(task.state, TaskState::Failed | TaskState::Cancelled);
    html! {
        div.actions role="group" aria-label="Task actions" {
            @if running && !paused {
                button type="button" data-api=(format!("/v1/tasks/{id}/pause")) data-method="POST" { "Pause" }
            }
            @if running && paused {
                button type="button" data-api=(format!("/v1/tasks/{id}/resume")) data-method="POST" { "Resume" }
            }
            @if running {
                button.danger type="button" data-api=(format!("/v1/tasks/{id}/cancel")) data-method="POST"
                    data-confirm="Cancel this task?" { "Cancel" }
            }
            @if retryable {
                button type="button" data-api=(format!("/v1/tasks/{id}/retry")) data-method="POST" { "Retry" }
            }
        }
    }
}

/// Each step's bar on one time axis from submission to the last change (now while running),
/// with a table of the same figures.
fn timeline(task: &Task, now: u64) -> Markup {
    let start = task.created_at;
    let end = if task.state.is_terminal() { task.updated_at } else { now }.max(start + 1);
    let span = (end - start) as f64;
    let width = 600.0;
    let x = |at: u64| (at.saturating_sub(start)) as f64 / span * width;
    html! {
        section aria-labelledby="timeline-h" {
            h2 id="timeline-h" { "Timeline" }
            svg.timeline viewBox=(format!("0 0 {width} 84")) preserveAspectRatio="xMinYMid meet" role="img"
                aria-label=(format!("Stage timeline over {}", format::duration_ms(span))) {
                @for (row, step) in Step::ALL.into_iter().enumerate() {
                    @let record = task.steps.get(step);
                    @let y = 4.0 + row as f64 * 26.0;
                    text x="0" y=(y + 15.0) { (step.to_string()) }
                    @if let Some(started) = record.started_at {
                        @let finished = record.finished_at.unwrap_or(end);
                        @let left = 80.0 + x(started) * (width - 80.0) / width;
                        @let bar = ((x(finished) - x(started)) * (width - 80.0) / width).max(2.0);
                        rect class=(if record.finished_at.is_some() { "done" } else if record.last_error.is_some() { "failing" } else { "running" })
                            x=(format!("{left:.1}")) y=(y) width=(format!("{bar:.1}")) height="18" rx="3" {}
                    }
                }
            }
            table.steps {
                caption.visually-hidden { "Steps" }
                thead { tr { th scope="col" { "Step" } th.num scope="col" { "Attempts" } th.num scope="col" { "Waited" } th.num scope="col" { "Took" } th scope="col" { "Last error" } } }
                tbody {
                    @for (i, step) in Step::ALL.into_iter().enumerate() {
                        @let record = task.steps.get(step);
                        @let ready = if i == 0 { Some(task.created_at) } else { task.steps.get(Step::ALL[i - 1]).finished_at };
                        tr {
                            th scope="row" { (step.to_string()) }
                            td.num { (record.attempts) }
                            td.num { @match (ready, record.started_at) { (Some(r), Some(s)) => (format::duration_ms(s.saturating_sub(r) as f64)), _ => "–" } }
                            td.num { @match (record.started_at, record.finished_at) {
                                (Some(s), Some(f)) => (format::duration_ms(f.saturating_sub(s) as f64)),
                                (Some(_), None) if !task.state.is_terminal() && task.state.step() == Some(step) => "running",
                                _ => "–",
                            } }
                            td { @if let Some(error) = &record.last_error { code { (error.code) } " " (error.message) } }
                        }
                    }
                }
            }
        }
    }
}

fn images(task: &Task, metadata: &MetadataOutput) -> Markup {
    let thumbnail = metadata.thumbnails.iter().find(|t| t.key == metadata.thumbnail_key);
    html! {
        section aria-labelledby="images-h" {
            h2 id="images-h" { "Images" }
            div.images {
                figure {
                    img data-thumbnail src=(format!("/v1/blobs/{}", metadata.thumbnail_key))
                        alt=(format!("Thumbnail of task {}", task.id))
                        width=[thumbnail.map(|t| t.width)] height=[thumbnail.map(|t| t.height)];
                    figcaption { "thumbnail" @if let Some(t) = thumbnail { " · " (t.width) "×" (t.height) " " (t.format) } }
                }
                @for derivative in metadata.thumbnails.iter().filter(|t| t.key != metadata.thumbnail_key) {
                    figure {
                        a href=(format!("/v1/blobs/{}", derivative.key)) {
                            img.preview src=(format!("/v1/blobs/{}", derivative.key)) loading="lazy"
                                alt=(format!("{} of task {}", derivative.name, task.id)) width=(derivative.width) height=(derivative.height);
                        }
                        figcaption { (derivative.name) " · " (derivative.width) "×" (derivative.height) " " (derivative.format) }
                    }
                }
            }
        }
    }
}

fn metadata_facts(metadata: &MetadataOutput) -> Markup {
    html! {
        section aria-labelledby="metadata-h" {
            h2 id="metadata-h" { "Metadata" }
            div.columns {
                dl.facts {
                    dt { "Format" } dd { (metadata.format) }
                    dt { "Size" } dd { (metadata.width) " × " (metadata.height) " px, " (metadata.color_type) }
                    dt { "Brightness" } dd { (format!("{:.0} %", metadata.mean_brightness * 100.0)) }
                    dt { "Perceptual hash" } dd { code { (metadata.phash) } }
                    @if let Some(exif) = &metadata.exif { (exif_facts(exif)) }
                }
                div {
                    h3 { "Dominant colours" }
                    ul.swatches {
                        @for colour in &metadata.dominant_colors {
                            li {
                                svg width="20" height="20" aria-hidden="true" { rect width="20" height="20" rx="4" fill=(colour.hex) {} }
                                code { (colour.hex) } " " (format!("{:.0} %", colour.share * 100.0))
                            }
                        }
                    }
                    @if let Some(exif) = &metadata.exif
                        && let (Some(lat), Some(lon)) = (exif.gps_latitude, exif.gps_longitude) { (map(lat, lon)) }
                }
            }
        }
    }
}

fn exif_facts(exif: &Exif) -> Markup {
    let camera = [exif.make.as_deref(), exif.model.as_deref()].into_iter().flatten().collect::<Vec<_>>().join(" ");
    html! {
        @if !camera.is_empty() { dt { "Camera" } dd { (camera) } }
        @if let Some(lens) = &exif.lens { dt { "Lens" } dd { (lens) } }
        @if let Some(time) = &exif.date_time_original { dt { "Taken" } dd { (time) } }
        @if let Some(exposure) = &exif.exposure_time { dt { "Exposure" } dd { (exposure) " s" } }
        @if let Some(iso) = exif.iso { dt { "ISO" } dd { (iso) } }
        @if let Some(focal) = exif.focal_length_mm { dt { "Focal length" } dd { (format!("{focal:.0} mm")) } }
        @if let (Some(lat), Some(lon)) = (exif.gps_latitude, exif.gps_longitude) {
            dt { "Position" } dd data-gps { (format!("{lat:.5}, {lon:.5}")) }
        }
    }
}

/// The position on a small equirectangular map of meridians and parallels (no tiles: nothing
/// is fetched from elsewhere).
fn map(lat: f64, lon: f64) -> Markup {
    let (x, y) = ((lon + 180.0) / 360.0 * 180.0, (90.0 - lat) / 180.0 * 90.0);
    html! {
        h3 { "Where" }
        svg.map viewBox="0 0 180 90" width="180" height="90" role="img" aria-label=(format!("Taken at latitude {lat:.4}, longitude {lon:.4}")) {
            rect width="180" height="90" class="sea" {}
            @for i in 1..6 { line x1=(i * 30) y1="0" x2=(i * 30) y2="90" {} }
            @for i in 1..3 { line x1="0" y1=(i * 30) x2="180" y2=(i * 30) {} }
            line.equator x1="0" y1="45" x2="180" y2="45" {}
            circle cx=(format!("{x:.2}")) cy=(format!("{y:.2}")) r="3.5" {}
        }
    }
}

fn scores(caption: &str, predictions: &[imagepipe_contracts::step::Prediction]) -> Markup {
    html! {
        table.scores {
            caption.visually-hidden { (caption) }
            tbody {
                @for p in predictions {
                    tr {
                        th scope="row" data-prediction { (p.label) }
                        td { meter min="0" max="1" value=(format!("{:.3}", p.score)) aria-label=(format!("{} score", p.label)) {} }
                        td.num { (format!("{:.1} %", p.score * 100.0)) }
                    }
                }
            }
        }
    }
}

fn event_name(event: HistoryEvent) -> String {
    serde_json::to_value(event).ok().and_then(|v| v.as_str().map(|s| s.replace('_', " "))).unwrap_or_default()
}

fn history_table(history: &History) -> Markup {
    html! {
        div.scroll {
            table.history {
                caption.visually-hidden { "Every transition, oldest first" }
                thead { tr { th scope="col" { "When" } th scope="col" { "What" } th scope="col" { "State" } th scope="col" { "Step" } th scope="col" { "Detail" } } }
                tbody {
                    @for entry in &history.entries {
                        tr {
                            td { (format::at(entry.at)) }
                            td { (event_name(entry.event)) }
                            td { (entry.to.as_str().replace('_', " ")) }
                            td { @if let Some(step) = entry.step { (step.to_string()) @if let Some(a) = entry.attempt { " #" (a) } } }
                            td { @if let Some(detail) = &entry.detail { (detail) } }
                        }
                    }
                }
            }
        }
    }
}
