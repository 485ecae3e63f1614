//! `imagepipe similar <task-id|file>`, `imagepipe duplicates` and `imagepipe similarity rebuild`:
//! the similarity indexer's routes (`GET /v1/tasks/{id}/similar`, `POST /v1/search/similar`,
//! `GET /v1/duplicates`, `POST|GET /v1/similarity/rebuild`), through the coordinator.

use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use bytes::Bytes;
use clap::{Args, Subcommand};
use serde_json::Value;

use comfy_table::{Table, presets::NOTHING};

use super::found::describe;
use super::{print_json, print_table};
use crate::ApiArgs;

/// How often `similarity rebuild --wait` asks how the rebuild goes.
const REBUILD_POLL: Duration = Duration::from_millis(500);

/// Options of `imagepipe similar`.
#[derive(Debug, Args)]
pub struct SimilarArgs {
    /// A task id (compared by its stored embedding), or an image file (the model runs on it).
    target: String,
    /// Most results (1-100).
    #[arg(long, default_value_t = 10)]
    limit: usize,
    /// Print the answer as JSON.
    #[arg(long)]
    json: bool,
}

/// Options of `imagepipe duplicates`.
#[derive(Debug, Args)]
pub struct DuplicatesArgs {
    /// Cosine a pair needs (default: the indexer's `similarity.duplicate_threshold`); a pair whose
    /// perceptual hashes are within `similarity.phash_max_distance` counts too.
    #[arg(long)]
    threshold: Option<f64>,
    /// Most groups, largest first (1-1000).
    #[arg(long, default_value_t = 100)]
    limit: usize,
    /// Print the answer as JSON.
    #[arg(long)]
    json: bool,
}

/// Options of `imagepipe similarity`.
#[derive(Debug, Args)]
pub struct SimilarityArgs {
    #[command(subcommand)]
    action: SimilarityAction,
}

/// What `imagepipe similarity` does.
#[derive(Debug, Subcommand)]
enum SimilarityAction {
    /// Regenerate the similarity index from the retained event stream (a new subscriber group
    /// from the beginning); near-duplicates are not announced again.
    Rebuild {
        /// Wait until the rebuild is done and print its figures.
        #[arg(long)]
        wait: bool,
        /// Print the answer as JSON.
        #[arg(long)]
        json: bool,
    },
}

/// Prints the images most similar to a task's or a file's, best first.
pub async fn run_similar(api: &ApiArgs, args: SimilarArgs) -> anyhow::Result<ExitCode> {
    anyhow::ensure!((1..=100).contains(&args.limit), "--limit must be 1-100");
    let client = api.client()?;
    let path = Path::new(&args.target);
    let answer: Value = if path.is_file() {
        let bytes = std::fs::read(path).map_err(|e| anyhow::anyhow!("reading {}: {e}", path.display()))?;
        client.search_similar(Bytes::from(bytes), args.limit).await?
    } else {
        client.similar_to(&args.target, args.limit).await?
    };
    if args.json {
        print_json(&answer)?;
        return Ok(ExitCode::SUCCESS);
    }
    let Some(results) = answer["results"].as_array() else {
        anyhow::bail!("unexpected answer from the similarity indexer (use --json to see it)");
    };
    if results.is_empty() {
        outln!("nothing similar indexed yet (embedding version {})", answer["version"].as_str().unwrap_or("-"));
        return Ok(ExitCode::SUCCESS);
    }
    let ids: Vec<&str> = results.iter().filter_map(|hit| hit["taskId"].as_str()).collect();
    let sources = describe(&client, &ids).await?;
    let mut table = Table::new();
    table.load_preset(NOTHING).set_header(["task", "cosine", "phash", "source"]);
    for hit in results {
        let id = hit["taskId"].as_str().unwrap_or("-");
        let cosine = hit["cosine"].as_f64().map_or_else(|| "-".into(), |c| format!("{c:.3}"));
        let phash = hit["phashDistance"].as_u64().map_or_else(|| "-".into(), |d| d.to_string());
        table.add_row([id.to_owned(), cosine, phash, sources.get(id).cloned().unwrap_or_else(|| "-".into())]);
    }
    print_table(&table);
    Ok(ExitCode::SUCCESS)
}

/// Prints the groups of near-duplicates, largest first.
pub async fn run_duplicates(api: &ApiArgs, args: DuplicatesArgs) -> anyhow::Result<ExitCode> {
    let mut query = vec![("limit", args.limit.to_string())];
    if let Some(threshold) = args.threshold {
        query.push(("threshold", threshold.to_string()));
    }
    let client = api.client()?;
    let answer: Value = client.get("/v1/duplicates", &query).await?;
    if args.json {
        print_json(&answer)?;
        return Ok(ExitCode::SUCCESS);
    }
    let Some(groups) = answer["groups"].as_array() else {
        anyhow::bail!("unexpected answer from /v1/duplicates (use --json to see it)");
    };
    let indexed = answer["index"]["vectors"].as_u64().unwrap_or(0);
    let total = answer["total"].as_u64().unwrap_or(groups.len() as u64);
    outln!("{total} group(s) of near-duplicates among {indexed} indexed image(s), cosine ≥ {}", answer["threshold"]);
    if groups.is_empty() {
        return Ok(ExitCode::SUCCESS);
    }
    let members = |group: &'_ Value| -> Vec<String> {
        group["tasks"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|t| t["taskId"].as_str().map(str::to_owned))
            .collect()
    };
    let ids: Vec<String> = groups.iter().flat_map(members).collect();
    let sources = describe(&client, &ids.iter().map(String::as_str).collect::<Vec<_>>()).await?;
    let mut table = Table::new();
    table.load_preset(NOTHING).set_header(["group", "task", "source"]);
    for (n, group) in groups.iter().enumerate() {
        for id in members(group) {
            let source = sources.get(&id).cloned().unwrap_or_else(|| "-".into());
            table.add_row([(n + 1).to_string(), id, source]);
        }
    }
    print_table(&table);
    Ok(ExitCode::SUCCESS)
}

/// Starts a rebuild of the index (and with `--wait` follows it to the end).
pub async fn run_similarity(api: &ApiArgs, args: SimilarityArgs) -> anyhow::Result<ExitCode> {
    let SimilarityAction::Rebuild { wait, json } = args.action;
    let client = api.client()?;
    let mut status: Value = client.post::<(), Value>("/v1/similarity/rebuild", None).await?;
    while wait && status["state"] == "running" {
        tokio::time::sleep(REBUILD_POLL).await;
        status = client.get("/v1/similarity/rebuild", &[]).await?;
    }
    if json {
        print_json(&status)?;
    } else {
        let events = status["events"].as_u64().unwrap_or(0);
        match status["state"].as_str() {
            Some("done") => outln!(
                "rebuilt from {events} event(s) in {} ms ({} skipped)",
                status["durationMs"].as_u64().unwrap_or(0),
                status["skipped"].as_u64().unwrap_or(0)
            ),
            Some("failed") => anyhow::bail!("the rebuild failed: {}", status["error"].as_str().unwrap_or("?")),
            _ => outln!("rebuild started (group {}); follow it with --wait", status["group"].as_str().unwrap_or("-")),
        }
    }
    Ok(ExitCode::SUCCESS)
}
