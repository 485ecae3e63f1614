//! `imagepipe stats`: counters and stage latencies (`GET /v1/stats`, the analytics worker).

use std::collections::BTreeMap;
use std::process::ExitCode;

use clap::Args;
use comfy_table::{Table, presets::NOTHING};
use imagepipe_analytics_worker::api::StatsResponse;

use super::show::duration;
use super::{print_json, print_table};
use crate::ApiArgs;

/// Options of `imagepipe stats`.
#[derive(Debug, Args)]
pub struct StatsArgs {
    /// Print the answer as JSON.
    #[arg(long)]
    json: bool,
}

/// Prints the counters, then one latency row per stage span.
pub async fn run(api: &ApiArgs, args: StatsArgs) -> anyhow::Result<ExitCode> {
    let answer: StatsResponse = api.client()?.get("/v1/stats", &[]).await?;
    if args.json {
        print_json(&answer)?;
        return Ok(ExitCode::SUCCESS);
    }
    outln!("tasks     {}", counts(&answer.tasks));
    outln!("events    {}", counts(&answer.events));
    outln!("formats   {}", if answer.formats.is_empty() { "-".to_owned() } else { counts(&answer.formats) });
    outln!("bytes     {}", answer.bytes_downloaded);
    outln!();
    let mut table = Table::new();
    table.load_preset(NOTHING).set_header(["span", "from → to", "count", "mean", "p50", "p95", "p99"]);
    for (span, view) in &answer.latencies {
        table.add_row([
            span.clone(),
            format!("{} → {}", view.from, view.to),
            view.count.to_string(),
            ms(view.mean_ms),
            ms(view.p50_ms),
            ms(view.p95_ms),
            ms(view.p99_ms),
        ]);
    }
    print_table(&table);
    Ok(ExitCode::SUCCESS)
}

fn counts(map: &BTreeMap<String, u64>) -> String {
    map.iter().map(|(name, n)| format!("{name}={n}")).collect::<Vec<_>>().join("  ")
}

/// A latency as every command shows durations; `-` without samples.
fn ms(value: Option<f64>) -> String {
    value.map_or_else(|| "-".to_owned(), |v| duration(v.round() as u64))
}
