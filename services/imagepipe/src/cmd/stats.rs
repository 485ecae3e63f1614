//! `imagepipe stats`: counters and stage latencies (`GET /v1/stats`, the analytics worker).

use std::process::ExitCode;

use clap::Args;
use serde_json::Value;

use super::print_json;
use crate::ApiArgs;

/// Options of `imagepipe stats`.
#[derive(Debug, Args)]
pub struct StatsArgs {
    /// Print the answer as JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    api: ApiArgs,
}

/// Prints the statistics, one `path value` line per number.
pub async fn run(args: StatsArgs) -> anyhow::Result<ExitCode> {
    let answer: Value = args.api.client()?.get("/v1/stats", &[]).await?;
    if args.json {
        print_json(&answer)?;
    } else {
        let mut lines = Vec::new();
        flatten("", &answer, &mut lines);
        let width = lines.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
        for (key, value) in lines {
            println!("{key:<width$}  {value}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn flatten(prefix: &str, value: &Value, out: &mut Vec<(String, String)>) {
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                let key = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
                flatten(&key, v, out);
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                flatten(&format!("{prefix}[{i}]"), v, out);
            }
        }
        Value::String(s) => out.push((prefix.to_owned(), s.clone())),
        other => out.push((prefix.to_owned(), other.to_string())),
    }
}
