//! The task list (`/tasks`): newest first, filtered by state, label, tags and creation time,
//! each row with its thumbnail, where its image comes from (the file's name, or the URL without
//! user info or query) and, for a task that failed or was cancelled, why. Rows are refreshed
//! live through `/partials/task-rows?ids=...`. A tag filter asks the tag indexer (`/v1/search`)
//! for the matching tasks, the best 50; the other filters are the store's (`/v1/tasks`).

use std::collections::HashMap;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::response::Html;
use futures::future::join_all;
use imagepipe_runtime::http::{ApiError, Scope};
use imagepipe_tag_indexer_worker::api::SearchResponse;
use maud::{Markup, html};
use serde::Deserialize;

use super::access::Viewer;
use super::layout::{self, Section};
use super::overview::upload_form;
use super::{Dashboard, format};
use crate::api::TaskView;
use crate::describe;
use crate::store::TaskPage;
use crate::task::{Task, TaskState};

/// Rows per page.
const PAGE: usize = 50;

/// Query of `GET /tasks`: the filters, as the form sends them.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct TaskFilter {
    /// A task state, or empty for all.
    #[serde(default)]
    pub state: String,
    /// `key=value`.
    #[serde(default)]
    pub label: String,
    /// Search tags, comma separated (`tags`, as the API and the CLI call it).
    #[serde(default)]
    pub tags: String,
    /// The older name of `tags`, still read when `tags` is not given.
    #[serde(default)]
    pub tag: String,
    /// Created at or after, `datetime-local` in UTC.
    #[serde(default)]
    pub after: String,
    /// Created before, `datetime-local` in UTC.
    #[serde(default)]
    pub before: String,
    /// Where the previous page ended.
    #[serde(default)]
    pub cursor: String,
}

/// `GET /tasks`.
pub async fn page(
    State(dashboard): State<Dashboard>,
    viewer: Viewer,
    filter: Result<Query<TaskFilter>, QueryRejection>,
) -> Html<String> {
    let filter = filter.map(|Query(f)| f.with_tags()).unwrap_or_default();
    let now = dashboard.clock.unix_ms();
    let listed = list(&dashboard, &filter).await;
    let body = html! {
        h1 { "Tasks" }
        (filter_form(&filter))
        @match &listed {
            Err(e) => p.notice role="alert" { (e.message) },
            Ok((tasks, next)) => {
                div.scroll {
                    table.tasks {
                        caption.visually-hidden { "Tasks, newest first" }
                        thead { tr {
                            th scope="col" { span.visually-hidden { "Thumbnail" } } th scope="col" { "Task" } th scope="col" { "Source" }
                            th scope="col" { "State" } th scope="col" { "Failure reason" } th scope="col" { "Labels" }
                            th.when scope="col" { "Created" } th.when scope="col" { "Updated" }
                        } }
                        tbody data-rows data-prepend=[filter_is_empty(&filter).then_some("true")] {
                            @for task in tasks { (row(task, now)) }
                        }
                    }
                }
                @if tasks.is_empty() { p data-empty { "No task matches." } }
                @if let Some(cursor) = next {
                    p { a href=(next_page(&filter, cursor)) rel="next" { "Older tasks" } }
                }
            }
        }
        @if viewer.may(Scope::Submit) { (upload_form()) }
    };
    layout::page("Tasks", &viewer, Section::Tasks, Some("rows"), body)
}

impl TaskFilter {
    /// The filter with the older `tag` read as `tags` when `tags` is not given.
    fn with_tags(mut self) -> Self {
        if self.tags.trim().is_empty() {
            self.tags = std::mem::take(&mut self.tag);
        }
        self
    }
}

fn filter_is_empty(filter: &TaskFilter) -> bool {
    [&filter.state, &filter.label, &filter.tags, &filter.after, &filter.before, &filter.cursor]
        .iter()
        .all(|f| f.is_empty())
}

fn next_page(filter: &TaskFilter, cursor: &str) -> String {
    let mut query = url::form_urlencoded::Serializer::new(String::new());
    for (name, value) in
        [("state", &filter.state), ("label", &filter.label), ("after", &filter.after), ("before", &filter.before)]
    {
        if !value.is_empty() {
            query.append_pair(name, value);
        }
    }
    query.append_pair("cursor", cursor);
    format!("/tasks?{}", query.finish())
}

fn filter_form(filter: &TaskFilter) -> Markup {
    html! {
        form.filters method="get" action="/tasks" role="search" aria-label="Filter tasks" {
            div {
                label for="f-state" { "State" }
                select id="f-state" name="state" {
                    option value="" selected[filter.state.is_empty()] { "any" }
                    @for state in TaskState::ALL {
                        option value=(state.as_str()) selected[filter.state == state.as_str()] { (state.as_str().replace('_', " ")) }
                    }
                }
            }
            div { label for="f-label" { "Label" } input id="f-label" name="label" value=(filter.label) placeholder="key=value"; }
            div { label for="f-tags" { "Tags" } input id="f-tags" name="tags" value=(filter.tags) placeholder="cat, animal"; }
            div { label for="f-after" { "Created after (UTC)" } input id="f-after" name="after" type="datetime-local" value=(filter.after); }
            div { label for="f-before" { "Created before (UTC)" } input id="f-before" name="before" type="datetime-local" value=(filter.before); }
            div.actions { button type="submit" { "Filter" } a href="/tasks" { "Clear" } }
        }
    }
}

/// The tasks the filter selects and the cursor of the next page.
async fn list(dashboard: &Dashboard, filter: &TaskFilter) -> Result<(Vec<Task>, Option<String>), ApiError> {
    let after = format::parse_form_time(&filter.after, "Created after").map_err(ApiError::invalid)?;
    let before = format::parse_form_time(&filter.before, "Created before").map_err(ApiError::invalid)?;
    if !filter.state.is_empty() {
        filter.state.parse::<TaskState>().map_err(|e| ApiError::invalid(e.to_string()))?;
    }
    if !filter.tags.trim().is_empty() {
        return by_tag(dashboard, filter, after, before).await.map(|tasks| (tasks, None));
    }
    let query = {
        let mut query = url::form_urlencoded::Serializer::new(String::new());
        query.append_pair("order", "newest").append_pair("limit", &PAGE.to_string());
        let times = [("createdAfter", after), ("createdBefore", before)];
        for (name, value) in [("status", &filter.state), ("label", &filter.label), ("cursor", &filter.cursor)] {
            if !value.trim().is_empty() {
                query.append_pair(name, value.trim());
            }
        }
        for (name, ms) in times {
            if let Some(ms) = ms {
                query.append_pair(name, &ms.to_string());
            }
        }
        query.finish()
    };
    let page: TaskPage = dashboard.api.get(format!("/v1/tasks?{query}")).await?;
    Ok((page.tasks, page.next_cursor))
}

/// The best [`PAGE`] tasks carrying every tag of `filter.tags`, the other filters applied to
/// them.
async fn by_tag(
    dashboard: &Dashboard,
    filter: &TaskFilter,
    after: Option<u64>,
    before: Option<u64>,
) -> Result<Vec<Task>, ApiError> {
    let query = url::form_urlencoded::Serializer::new(String::new())
        .append_pair("tags", filter.tags.trim())
        .append_pair("limit", &PAGE.to_string())
        .finish();
    let found: SearchResponse = dashboard.api.get(format!("/v1/search?{query}")).await?;
    let ids: Vec<&str> = found.results.iter().map(|hit| hit.task_id.as_str()).collect();
    let label = filter.label.trim().split_once('=');
    Ok(fetch(dashboard, &ids)
        .await
        .into_iter()
        .filter(|t| filter.state.is_empty() || t.state.as_str() == filter.state)
        .filter(|t| label.is_none_or(|(k, v)| t.labels.get(k).is_some_and(|have| have == v)))
        .filter(|t| after.is_none_or(|a| t.created_at >= a) && before.is_none_or(|b| t.created_at < b))
        .collect())
}

/// The tasks of `ids` that exist, by id.
pub(super) async fn by_id(dashboard: &Dashboard, ids: impl Iterator<Item = &str>) -> HashMap<String, Task> {
    let ids: Vec<&str> = ids.collect();
    fetch(dashboard, &ids).await.into_iter().map(|task| (task.id.clone(), task)).collect()
}

/// The tasks of `ids` that exist, in that order.
async fn fetch(dashboard: &Dashboard, ids: &[&str]) -> Vec<Task> {
    let found = join_all(ids.iter().map(|id| dashboard.api.get::<TaskView>(format!("/v1/tasks/{id}")))).await;
    found.into_iter().filter_map(Result::ok).map(|view| view.task).collect()
}

/// Query of `GET /partials/task-rows`.
#[derive(Debug, Deserialize)]
pub struct RowsQuery {
    /// Comma-separated task ids, at most [`PAGE`].
    #[serde(default)]
    ids: String,
}

/// `GET /partials/task-rows?ids=a,b`: the rows of those tasks now.
pub async fn rows(State(dashboard): State<Dashboard>, _viewer: Viewer, Query(query): Query<RowsQuery>) -> Html<String> {
    let ids: Vec<&str> =
        query.ids.split(',').filter(|id| imagepipe_contracts::command::is_valid_id(id)).take(PAGE).collect();
    let now = dashboard.clock.unix_ms();
    let tasks = fetch(&dashboard, &ids).await;
    Html(html! { @for task in &tasks { (row(task, now)) } }.into_string())
}

/// One task's row.
pub fn row(task: &Task, now: u64) -> Markup {
    let thumbnail = task.outputs.metadata.as_ref().map(|m| m.thumbnail_key.as_str());
    html! {
        tr id=(format!("task-{}", task.id)) data-task=(task.id) data-state=(task.state.as_str()) {
            td.thumb {
                @match thumbnail {
                    Some(key) => img src=(format!("/v1/blobs/{key}")) alt=(format!("Thumbnail of {}", describe::name(task))) width="48" height="48" loading="lazy";,
                    None => span.no-thumb aria-hidden="true" {},
                }
            }
            td { a href=(format!("/tasks/{}", task.id)) { code { (task.id) } } }
            td.source data-source { (describe::source(task)) }
            td { (state_badge(task.state)) }
            td.reason data-reason {
                @if matches!(task.state, TaskState::Failed | TaskState::Cancelled) { (describe::failure_reason(task)) }
            }
            td.labels { @for (key, value) in &task.labels { span.label { (key) "=" (value) } " " } }
            td.when title=(format::at(task.created_at)) { (format::ago(now, task.created_at)) }
            td.when title=(format::at(task.updated_at)) { (format::ago(now, task.updated_at)) }
        }
    }
}

/// A task state as a coloured badge.
pub fn state_badge(state: TaskState) -> Markup {
    html! { span class=(format!("badge {}", state.as_str())) data-state-badge { (state.as_str().replace('_', " ")) } }
}
