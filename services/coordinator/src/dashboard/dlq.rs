//! Dead letters (`/dlq`): the archive, oldest first, with each letter's reason and body, and
//! the buttons that replay one (`POST /v1/dlq/{id}/replay`), replay those a filter selects
//! (`POST /v1/dlq/replay`) or purge one (`DELETE /v1/dlq/{id}`).

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::response::Html;
use imagepipe_runtime::http::Scope;
use maud::html;
use serde::Deserialize;

use super::access::Viewer;
use super::layout::{self, Section};
use super::{Dashboard, format};
use crate::api::DeadLetterListing;

/// Letters per page.
const PAGE: usize = 50;

/// Query of `GET /dlq`.
#[derive(Debug, Default, Deserialize)]
pub struct DlqQuery {
    /// Where the previous page ended.
    #[serde(default)]
    cursor: String,
}

/// `GET /dlq`.
pub async fn page(
    State(dashboard): State<Dashboard>,
    viewer: Viewer,
    query: Result<Query<DlqQuery>, QueryRejection>,
) -> Html<String> {
    let query = query.map(|Query(q)| q).unwrap_or_default();
    let params = {
        let mut params = url::form_urlencoded::Serializer::new(String::new());
        params.append_pair("limit", &PAGE.to_string());
        if !query.cursor.is_empty() {
            params.append_pair("cursor", &query.cursor);
        }
        params.finish()
    };
    let listed = dashboard.api.get::<DeadLetterListing>(format!("/v1/dlq?{params}")).await;
    let now = dashboard.clock.unix_ms();
    let body = html! {
        h1 { "Dead letters" }
        @if viewer.may(Scope::Operate) { section aria-labelledby="replay-h" {
            h2 id="replay-h" { "Replay by filter" }
            form.filters data-replay-filter {
                div {
                    label for="r-queue" { "Queue" }
                    select id="r-queue" name="queue" {
                        option value="" { "any" }
                        @for queue in ["submit", "download", "metadata", "ai", "results"] { option value=(queue) { (queue) } }
                    }
                }
                div { label for="r-reason" { "Reason contains" } input id="r-reason" name="reasonContains" placeholder="timeout"; }
                div.actions { button type="submit" { "Replay matching" } }
            }
        } }
        @match &listed {
            Err(e) => (layout::unavailable("Dead letters", e)),
            Ok(listing) => {
                p data-dead-letters=(listing.total) { (format::count(listing.total, "letter", "letters")) " in the archive" }
                @if listing.page.entries.is_empty() { p { "The archive is empty." } }
                ol.letters {
                    @for letter in &listing.page.entries {
                        li.letter id=(format!("letter-{}", letter.id)) data-letter=(letter.id) {
                            div.letter-head {
                                strong { (letter.reason) }
                                span { " from " code { (letter.source) } " · " (format::count(letter.delivery_count, "delivery", "deliveries")) " · " }
                                span title=(format::at(letter.dead_lettered_at)) { (format::ago(now, letter.dead_lettered_at)) }
                            }
                            details {
                                summary { "Body and headers" }
                                @if !letter.headers.is_empty() {
                                    dl.facts { @for (name, value) in &letter.headers { dt { (name) } dd { code { (value) } } } }
                                }
                                pre { code { (letter.body) } }
                            }
                            div.actions role="group" aria-label=(format!("Dead letter {}", letter.id)) {
                                @if !letter.body_was_cut() && viewer.may(Scope::Operate) {
                                    button type="button" data-api=(format!("/v1/dlq/{}/replay", letter.id)) data-method="POST"
                                        data-remove=(format!("letter-{}", letter.id)) aria-label=(format!("Replay dead letter {}", letter.id)) { "Replay" }
                                }
                                @if viewer.may(Scope::Admin) {
                                    button.danger type="button" data-api=(format!("/v1/dlq/{}", letter.id)) data-method="DELETE"
                                        data-confirm="Purge this letter for good?" data-remove=(format!("letter-{}", letter.id))
                                        aria-label=(format!("Purge dead letter {}", letter.id)) { "Purge" }
                                }
                            }
                        }
                    }
                }
                @if let Some(cursor) = &listing.page.next_cursor {
                    p { a rel="next" href=(format!("/dlq?cursor={}", url::form_urlencoded::byte_serialize(cursor.as_bytes()).collect::<String>())) { "More" } }
                }
            }
        }
    };
    layout::page("Dead letters", &viewer, Section::DeadLetters, None, body)
}
