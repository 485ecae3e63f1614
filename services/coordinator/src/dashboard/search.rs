//! Search (`/search`): tags to a grid of thumbnails (the tag indexer's `/v1/search`), and an
//! image dropped on the page (or chosen) to the most similar images (the page posts it to
//! `/v1/search/similar`).

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::response::Html;
use imagepipe_tag_indexer_worker::api::SearchResponse;
use maud::html;
use serde::Deserialize;

use super::Dashboard;
use super::access::Viewer;
use super::layout::{self, Section};

/// Results shown for a tag search.
const RESULTS: usize = 60;

/// Query of `GET /search`.
#[derive(Debug, Default, Deserialize)]
pub struct SearchQuery {
    /// Tags, comma separated.
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
    let tags = query.tag.trim();
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
    let body = html! {
        h1 { "Search" }
        section aria-labelledby="tags-h" {
            h2 id="tags-h" { "By tag" }
            form.filters method="get" action="/search" role="search" aria-label="Search by tag" {
                div { label for="s-tag" { "Tags (comma separated)" } input id="s-tag" name="tag" value=(tags) placeholder="cat, animal" required; }
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
                    p { (found.results.len()) " tasks tagged " (found.tags.join(if mode == "any" { " or " } else { " and " })) }
                    ul.grid {
                        @for hit in &found.results {
                            li {
                                a href=(format!("/tasks/{}", hit.task_id)) {
                                    @match &hit.thumbnail_key {
                                        Some(key) => img src=(format!("/v1/blobs/{key}")) alt=(format!("Task {}", hit.task_id)) loading="lazy" width="128" height="128";,
                                        None => span.no-thumb { "no thumbnail" },
                                    }
                                    span.caption { code { (hit.task_id) } " " (format!("{:.2}", hit.score)) }
                                }
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
            div.grid data-similar-results aria-live="polite" {}
        }
    };
    layout::page("Search", &viewer, Section::Search, None, body)
}
