//! Search (`/search?tags=cat,animal`): tags to a grid of thumbnails (the tag indexer's
//! `/v1/search`), each named by its image's file or URL, and an image dropped on the page (or
//! chosen) to the most similar images (the page posts it to `/v1/search/similar` and shows
//! those at a cosine of at least [`detail::SIMILAR_FLOOR`]).

use std::collections::HashMap;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::response::Html;
use imagepipe_tag_indexer_worker::api::SearchResponse;
use maud::{Markup, html};
use serde::Deserialize;

use super::access::Viewer;
use super::layout::{self, Section};
use super::{Dashboard, detail, format, tasks};
use crate::describe;
use crate::task::Task;

/// Results shown for a tag search.
const RESULTS: usize = 60;

/// Query of `GET /search`.
#[derive(Debug, Default, Deserialize)]
pub struct SearchQuery {
    /// Tags, comma separated (`tags`, as the API and the CLI call it).
    #[serde(default)]
    tags: String,
    /// The older name of `tags`, still read when `tags` is not given (links to `?tag=` exist).
    #[serde(default)]
    tag: String,
    /// `all` (default) or `any`.
    #[serde(default)]
    mode: String,
}

/// `GET /search`.
pub async fn page(
    State(dashboard): State<Dashboard>,
    viewer: Viewer,
    query: Result<Query<SearchQuery>, QueryRejection>,
) -> Html<String> {
    let query = query.map(|Query(q)| q).unwrap_or_default();
    let tags = if query.tags.trim().is_empty() { query.tag.trim() } else { query.tags.trim() };
    let mode = if query.mode == "any" { "any" } else { "all" };
    let found = if tags.is_empty() {
        None
    } else {
        let params = url::form_urlencoded::Serializer::new(String::new())
            .append_pair("tags", tags)
            .append_pair("mode", mode)
            .append_pair("limit", &RESULTS.to_string())
            .finish();
        Some(dashboard.api.get::<SearchResponse>(format!("/v1/search?{params}")).await)
    };
    let named = match &found {
        Some(Ok(found)) => tasks::by_id(&dashboard, found.results.iter().map(|hit| hit.task_id.as_str())).await,
        _ => HashMap::new(),
    };
    let body = html! {
        h1 { "Search" }
        section aria-labelledby="tags-h" {
            h2 id="tags-h" { "By tag" }
            form.filters method="get" action="/search" role="search" aria-label="Search by tag" {
                div { label for="s-tag" { "Tags (comma separated)" } input id="s-tag" name="tags" value=(tags) placeholder="cat, animal" required; }
                div {
                    label for="s-mode" { "Match" }
                    select id="s-mode" name="mode" {
                        option value="all" selected[mode == "all"] { "all tags" }
                        option value="any" selected[mode == "any"] { "any tag" }
                    }
                }
                div.actions { button type="submit" { "Search" } }
            }
            @match &found {
                None => {},
                Some(Err(e)) => (layout::unavailable("Search", e)),
                Some(Ok(found)) if found.results.is_empty() => p { "No task carries " (found.tags.join(", ")) "." },
                Some(Ok(found)) => {
                    p { (format::count(found.results.len() as u64, "task", "tasks")) " tagged " (found.tags.join(if mode == "any" { " or " } else { " and " })) }
                    ul.grid {
                        @for hit in &found.results {
                            li data-hit=(hit.task_id) {
                                (image_card(&hit.task_id, named.get(&hit.task_id), hit.thumbnail_key.as_deref(), html! {
                                    code { (hit.task_id) } " · score " (format!("{:.2}", hit.score))
                                }))
                            }
                        }
                    }
                }
            }
        }
        section aria-labelledby="similar-h" {
            h2 id="similar-h" { "Similar to an image" }
            form.dropzone data-similar-upload {
                p { "Drop an image here, or choose one: the model looks at it and the closest images are shown." }
                label for="similar-file" { "Image file" }
                input id="similar-file" type="file" accept="image/*" name="file";
            }
            div data-similar-results data-min-cosine=(detail::SIMILAR_FLOOR) aria-live="polite" {}
        }
    };
    layout::page("Search", &viewer, Section::Search, None, body)
}

/// One image of a result grid: its thumbnail, linked to its task, over its name (the uploaded
/// file's, or the URL: [`describe::name`]; the whole [`describe::source`] on hover) and
/// `detail`. `task` is `None` for a task that no longer exists.
pub(super) fn image_card(task_id: &str, task: Option<&Task>, thumbnail_key: Option<&str>, detail: Markup) -> Markup {
    let name = task.map_or_else(|| format!("task {task_id}"), describe::name);
    html! {
        a href=(format!("/tasks/{task_id}")) title=[task.map(describe::source)] {
            @match thumbnail_key {
                Some(key) => img src=(format!("/v1/blobs/{key}")) alt=(name) loading="lazy" width="128" height="128";,
                None => span.no-thumb { "no thumbnail" },
            }
            span.caption { span.name data-name { (name) } (detail) }
        }
    }
}
