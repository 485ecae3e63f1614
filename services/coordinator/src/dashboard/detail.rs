//! One task (`/tasks/{id}`): its stage timeline (durations, attempts, errors), thumbnail and
//! previews, EXIF with the GPS position on a small map, dominant colours, predictions and tags,
//! history, similar images, the trace id (linked to the trace UI when `telemetry.trace_ui_url`
//! is set), and the buttons that cancel, pause, resume and retry it. `/partials/tasks/{id}` is
//! the live part; `/partials/tasks/{id}/similar` the similar images (the similarity indexer's
//! `/v1/tasks/{id}/similar`, those at a cosine of at least [`SIMILAR_FLOOR`]), which the page
//! fetches once it is shown.

use std::collections::HashMap;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};
use imagepipe_contracts::ImageSource;
use imagepipe_contracts::command::{MAX_ID_LEN, is_valid_id};
use imagepipe_contracts::step::{Exif, MetadataOutput};
use imagepipe_runtime::http::{ApiError, Scope};
use maud::{Markup, html};
use serde::Deserialize;

use super::access::Viewer;
use super::layout::{self, Section};
use super::search::image_card;
use super::tasks::{self, state_badge};
use super::{Dashboard, format};
use crate::api::{History, TaskView};
use crate::describe;
use crate::task::{HistoryEvent, Task, TaskState};

/// `GET /tasks/{id}`.
pub async fn page(State(dashboard): State<Dashboard>, viewer: Viewer, Path(id): Path<String>) -> Response {
    let live = match live(&dashboard, &id, &viewer).await {
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
            div data-similar=(id) aria-live="polite" { p { "Looking for similar images…" } }
        }
    };
    layout::page(&format!("Task {id}"), &viewer, Section::Tasks, Some(&format!("task:{id}")), body).into_response()
}

/// `GET /partials/tasks/{id}`: the live part of a task's page.
pub async fn partial(State(dashboard): State<Dashboard>, viewer: Viewer, Path(id): Path<String>) -> Response {
    match live(&dashboard, &id, &viewer).await {
        Ok(live) => Html(live.into_string()).into_response(),
        Err((status, message)) => (status, message).into_response(),
    }
}

/// Least cosine between two images' embeddings for the dashboard to call them similar (a task's
/// page, and the search page's image drop). Unrelated photos score about 0.1 (a cat and an
/// espresso: 0.09), and listing those as "similar images" misleads; near-duplicates score above
/// 0.85 (`similarity.duplicate_threshold`); 0.5 keeps images that merely share a subject.
pub const SIMILAR_FLOOR: f64 = 0.5;

/// How many similar images the task's page asks the similarity indexer for.
const SIMILAR_ASKED: usize = 8;

/// The answer of `/v1/tasks/{id}/similar`, as far as the page reads it.
#[derive(Debug, Deserialize)]
struct SimilarAnswer {
    results: Vec<SimilarImage>,
}

/// One image of a [`SimilarAnswer`].
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
struct SimilarImage {
    task_id: String,
    cosine: f64,
    #[serde(default)]
    phash_distance: Option<u32>,
    #[serde(default)]
    thumbnail_key: Option<String>,
}

/// `GET /partials/tasks/{id}/similar`: the images similar to the task's, those below
/// [`SIMILAR_FLOOR`] left out (and counted). While the task has no embedding yet, or the
/// similarity indexer does not answer, the fragment is marked `data-similar-pending` and the
/// page asks again later.
pub async fn similar(State(dashboard): State<Dashboard>, _viewer: Viewer, Path(id): Path<String>) -> Response {
    if !is_valid_id(&id) {
        return (StatusCode::NOT_FOUND, format!("no task {id:?}")).into_response();
    }
    let answer = dashboard
        .api
        .get::<SimilarAnswer>(format!("/v1/tasks/{id}/similar?limit={SIMILAR_ASKED}"))
        .await
        .map(|answer| above_floor(answer.results));
    let names = match &answer {
        Ok((shown, _)) => tasks::by_id(&dashboard, shown.iter().map(|image| image.task_id.as_str())).await,
        Err(_) => HashMap::new(),
    };
    Html(similar_images(&answer, &names).into_string()).into_response()
}

/// The images at [`SIMILAR_FLOOR`] or above, in their order, and how many were below it.
fn above_floor(images: Vec<SimilarImage>) -> (Vec<SimilarImage>, usize) {
    let total = images.len();
    let shown: Vec<SimilarImage> = images.into_iter().filter(|image| image.cosine >= SIMILAR_FLOOR).collect();
    let hidden = total - shown.len();
    (shown, hidden)
}

/// The similar images as a grid, each named by its image's file or URL; `names` holds the
/// tasks of those that still exist.
fn similar_images(answer: &Result<(Vec<SimilarImage>, usize), ApiError>, names: &HashMap<String, Task>) -> Markup {
    html! {
        @match answer {
            Err(e) if e.status == StatusCode::NOT_FOUND.as_u16() => p data-similar-pending { "No similar images yet: " (e.message) "." },
            Err(e) => p data-similar-pending { "Similar images unavailable: " (e.message) },
            Ok((shown, hidden)) => {
                @if shown.is_empty() {
                    p { "No similar image: none is at a cosine of " (SIMILAR_FLOOR) " or more." }
                } @else {
                    ul.grid {
                        @for image in shown {
                            li data-similar-task=(image.task_id) {
                                (image_card(&image.task_id, names.get(&image.task_id), image.thumbnail_key.as_deref(), html! {
                                    "cosine " (format!("{:.3}", image.cosine))
                                    @if let Some(distance) = image.phash_distance { " · pHash " (distance) }
                                }))
                            }
                        }
                    }
                }
                @if *hidden > 0 {
                    p { small data-similar-hidden=(hidden) {
                        (format::count(*hidden as u64, "less similar image", "less similar images"))
                        " (cosine below " (SIMILAR_FLOOR) ") not shown."
                    } }
                }
            }
        }
    }
}

async fn live(dashboard: &Dashboard, id: &str, viewer: &Viewer) -> Result<Markup, (StatusCode, String)> {
    if !is_valid_id(id) {
        return Err((
            StatusCode::NOT_FOUND,
            format!("no task {id:?}: a task id is 1 to {MAX_ID_LEN} characters of [A-Za-z0-9_.-]"),
        ));
    }
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
            @if viewer.may(Scope::Operate) { (actions(task)) }
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
                p.tags { @for tag in &analysis.tags { a.label href=(format!("/search?tags={}", urlencode(&tag.label))) { (tag.label) } " " } }
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

/// Where the image comes from ([`describe::source`]), an upload's whole blob key under it.
fn source(task: &Task) -> Markup {
    html! {
        span data-source { (describe::source(task)) }
        @if let ImageSource::Blob(key) = &task.source { br; small { code { (key) } } }
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
    let steps = task.shown_steps();
    let height = 6 + 26 * steps.len();
    html! {
        section aria-labelledby="timeline-h" {
            h2 id="timeline-h" { "Timeline" }
            svg.timeline viewBox=(format!("0 0 {width} {height}")) preserveAspectRatio="xMinYMid meet" role="img"
                aria-label=(format!("Stage timeline over {}", format::duration_ms(span))) {
                @for (row, step) in steps.iter().copied().enumerate() {
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
                    @for (i, step) in steps.iter().copied().enumerate() {
                        @let record = task.steps.get(step);
                        @let ready = if i == 0 { Some(task.created_at) } else { task.steps.get(steps[i - 1]).finished_at };
                        tr {
                            th scope="row" { (step.to_string()) }
                            td.num { (record.attempts) }
                            td.num { @match (ready, record.started_at) { (Some(r), Some(s)) => (format::duration_ms(s.saturating_sub(r) as f64)), _ => "–" } }
                            td.num { @match (record.started_at, record.finished_at) {
                                (Some(s), Some(f)) => (format::duration_ms(f.saturating_sub(s) as f64)),
                                (Some(_), None) if !task.state.is_terminal() && task.current_step() == Some(step) => "running",
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

#[cfg(test)]
mod tests {
    use super::*;

    fn image(task_id: &str, cosine: f64) -> SimilarImage {
        SimilarImage { task_id: task_id.into(), cosine, phash_distance: None, thumbnail_key: None }
    }

    #[test]
    fn images_below_the_similarity_floor_are_left_out_and_counted() {
        let found = vec![image("near", 0.93), image("floor", SIMILAR_FLOOR), image("unrelated", 0.12)];
        let (shown, hidden) = above_floor(found);
        let ids: Vec<&str> = shown.iter().map(|i| i.task_id.as_str()).collect();
        assert_eq!(ids, ["near", "floor"], "at or above the floor, in the indexer's order");
        assert_eq!(hidden, 1);
    }

    #[test]
    fn the_similar_grid_names_only_the_images_above_the_floor() {
        let answer = Ok(above_floor(vec![image("tsk_near", 0.91), image("tsk_far", 0.12), image("tsk_farther", 0.05)]));
        let page = similar_images(&answer, &HashMap::new()).into_string();
        assert!(page.contains(r#"data-similar-task="tsk_near""#), "{page}");
        assert!(!page.contains("tsk_far"), "an image at cosine 0.12 is not called similar: {page}");
        assert!(page.contains("2 less similar images (cosine below 0.5) not shown."), "{page}");

        let none = Ok(above_floor(vec![image("tsk_far", 0.12)]));
        let page = similar_images(&none, &HashMap::new()).into_string();
        assert!(page.contains("No similar image: none is at a cosine of 0.5 or more."), "{page}");
        assert!(page.contains("1 less similar image (cosine"), "{page}");
    }
}
