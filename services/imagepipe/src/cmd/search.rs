//! `imagepipe search TAGS`: tasks by tag (`GET /v1/search`, the tag indexer), best first, each
//! with its score and which image it is.

use std::process::ExitCode;

use clap::{Args, ValueEnum};
use serde_json::Value;

use comfy_table::{Table, presets::NOTHING};

use super::found::describe;
use super::{print_json, print_table};
use crate::ApiArgs;

/// How tags combine.
#[derive(Debug, Clone, Copy, ValueEnum)]
enum MatchArg {
    /// Tasks with every tag.
    All,
    /// Tasks with any of the tags.
    Any,
}

/// Options of `imagepipe search`.
#[derive(Debug, Args)]
pub struct SearchArgs {
    /// Tags, a comma-separated list (`cat,animal`; separate arguments work too).
    #[arg(required = true, value_delimiter = ',')]
    tags: Vec<String>,
    /// Whether a task needs all tags or any.
    #[arg(long, value_enum, default_value = "all")]
    mode: MatchArg,
    /// Most results.
    #[arg(long, default_value_t = 20)]
    limit: usize,
    /// Print the answer as JSON.
    #[arg(long)]
    json: bool,
}

/// Prints the matching tasks, best first.
pub async fn run(api: &ApiArgs, args: SearchArgs) -> anyhow::Result<ExitCode> {
    let tags: Vec<&str> = args.tags.iter().map(|t| t.trim()).filter(|t| !t.is_empty()).collect();
    anyhow::ensure!(!tags.is_empty(), "no tags given");
    let mode = match args.mode {
        MatchArg::All => "all",
        MatchArg::Any => "any",
    };
    let query = [("tags", tags.join(",")), ("mode", mode.to_owned()), ("limit", args.limit.to_string())];
    let client = api.client()?;
    let answer: Value = client.get("/v1/search", &query).await?;
    if args.json {
        print_json(&answer)?;
        return Ok(ExitCode::SUCCESS);
    }
    let hits = answer.get("results").or_else(|| answer.get("tasks")).unwrap_or(&answer);
    let Some(hits) = hits.as_array() else {
        anyhow::bail!("unexpected answer from /v1/search (use --json to see it)");
    };
    if hits.is_empty() {
        outln!("no task has {}", tags.join(if mode == "all" { " and " } else { " or " }));
        return Ok(ExitCode::SUCCESS);
    }
    let ids: Vec<&str> = hits.iter().filter_map(|hit| hit["taskId"].as_str()).collect();
    let sources = describe(&client, &ids).await?;
    let mut table = Table::new();
    table.load_preset(NOTHING).set_header(["task", "score", "source"]);
    for hit in hits {
        let id = hit["taskId"].as_str().unwrap_or("-");
        let score = hit["score"].as_f64().map_or_else(|| "-".into(), |s| format!("{s:.3}"));
        table.add_row([id.to_owned(), score, sources.get(id).cloned().unwrap_or_else(|| "-".into())]);
    }
    print_table(&table);
    Ok(ExitCode::SUCCESS)
}
