//! Which image each task of a search, similarity or duplicates answer is: those answers name
//! tasks by id (and thumbnail key) only, so the commands look each task up and show its source
//! (the uploaded file's name or the URL, redacted) and, for a task that did not complete, why.

use std::collections::HashMap;

use futures::{StreamExt, TryStreamExt};
use imagepipe::ApiClient;
use imagepipe_coordinator::TaskState;
use reqwest::StatusCode;

use super::show::{failure_reason, source};

/// How many tasks are looked up at once.
const LOOKUPS: usize = 8;

/// What each of `ids` is, by id: `coffee.jpg (uploaded, sha256:…)`,
/// `https://example.com/cat.jpg (failed at download after 5 attempts: http_500: …)`, or
/// `(task no longer stored)` for a task the API does not have any more.
pub async fn describe(client: &ApiClient, ids: &[&str]) -> anyhow::Result<HashMap<String, String>> {
    let mut unique: Vec<&str> = ids.to_vec();
    unique.sort_unstable();
    unique.dedup();
    futures::stream::iter(unique)
        .map(|id| async move {
            let text = match client.task(id).await {
                Ok(view) if view.task.state == TaskState::Completed => source(&view.task),
                Ok(view) => format!("{} ({})", source(&view.task), failure_reason(&view.task)),
                Err(e) if e.status() == Some(StatusCode::NOT_FOUND) => "(task no longer stored)".to_owned(),
                Err(e) => return Err(e),
            };
            Ok((id.to_owned(), text))
        })
        .buffer_unordered(LOOKUPS)
        .try_collect()
        .await
        .map_err(Into::into)
}
