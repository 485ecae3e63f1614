//! `imagepipe dlq list|show|replay|purge`: dead letters kept by the coordinator. `replay` takes
//! ids, or filters (`POST /v1/dlq/replay`): a dry run first says how many match, then the
//! replay runs once confirmed (`--yes`, or an answer on a terminal).

use std::io::{BufRead, IsTerminal, Write};
use std::process::ExitCode;

use clap::{Args, Subcommand};
use imagepipe::ApiClient;
use imagepipe_coordinator::api::dlq_replay::{MAX_REPLAY, ReplayFilter, ReplayReport};
use imagepipe_coordinator::store::DeadLetter;

use super::list::parse_since;
use super::print_json;
use super::show::time;
use crate::ApiArgs;

/// Largest page the API serves.
const PAGE: usize = 500;

/// Options of `imagepipe dlq`.
#[derive(Debug, Args)]
pub struct DlqArgs {
    #[command(subcommand)]
    action: DlqAction,
}

#[derive(Debug, Subcommand)]
enum DlqAction {
    /// List dead letters, oldest first.
    List {
        /// Most entries.
        #[arg(long, default_value_t = 50)]
        limit: usize,
        /// Print them as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show one dead letter with its body and headers.
    Show {
        /// Dead letter id.
        id: String,
        /// Print it as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Send dead letters back to their queues: the ones named, or every one the filters match.
    /// With filters, a dry run first prints how many match; the replay then runs with --yes, or
    /// once confirmed on a terminal (without a terminal and without --yes nothing is replayed).
    Replay {
        /// Dead letter ids.
        #[arg(
            required_unless_present_any = ["queue", "reason", "since", "until", "all"],
            conflicts_with_all = ["queue", "reason", "since", "until", "all", "max", "dry_run", "yes"]
        )]
        ids: Vec<String>,
        /// Only dead letters taken from this queue: submit, download, metadata, ai, results, or a
        /// full name (tasks.download); a queue includes its priority lanes (tasks.download.high),
        /// a lane named in full only itself.
        #[arg(long)]
        queue: Option<String>,
        /// Only dead letters whose reason contains this text (ignoring case).
        #[arg(long)]
        reason: Option<String>,
        /// Only dead letters since: a duration ago (`30m`, `1h`, `2d`) or an RFC 3339 time in UTC
        /// (`2026-11-24T19:00:00Z`).
        #[arg(long, value_parser = parse_since)]
        since: Option<u64>,
        /// Only dead letters from before: a duration ago or an RFC 3339 time, as --since.
        #[arg(long, value_parser = parse_since)]
        until: Option<u64>,
        /// Every dead letter (needed when no other filter is given).
        #[arg(long)]
        all: bool,
        /// Most dead letters replayed, oldest first (at most 10000 per run).
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..=MAX_REPLAY as u64))]
        max: Option<u64>,
        /// Only say how many dead letters match, and the first ones.
        #[arg(long)]
        dry_run: bool,
        /// Replay without asking.
        #[arg(long, short)]
        yes: bool,
    },
    /// Delete dead letters.
    Purge {
        /// Dead letter ids.
        #[arg(required_unless_present = "all")]
        ids: Vec<String>,
        /// Delete every dead letter.
        #[arg(long, conflicts_with = "ids")]
        all: bool,
    },
}

/// Runs `imagepipe dlq ACTION`.
pub async fn run(api: &ApiArgs, args: DlqArgs) -> anyhow::Result<ExitCode> {
    let client = api.client()?;
    match args.action {
        DlqAction::List { limit, json } => {
            let letters = collect(&client, limit).await?;
            if json {
                print_json(&letters)?;
            } else if letters.is_empty() {
                outln!("no dead letters");
            } else {
                for l in &letters {
                    outln!(
                        "{}  {}  {:<16} x{}  {}",
                        l.id,
                        time(l.dead_lettered_at),
                        l.source,
                        l.delivery_count,
                        one_line(&l.reason)
                    );
                }
            }
        }
        DlqAction::Show { id, json } => {
            let Some(letter) = collect(&client, usize::MAX).await?.into_iter().find(|l| l.id == id) else {
                anyhow::bail!("no dead letter {id}");
            };
            if json {
                print_json(&letter)?;
            } else {
                outln!("id          {}", letter.id);
                outln!("source      {}", letter.source);
                outln!("dlq         {}", letter.dlq);
                outln!("reason      {}", letter.reason);
                outln!("deliveries  {}", letter.delivery_count);
                outln!("at          {}", time(letter.dead_lettered_at));
                if let Some(key) = &letter.key {
                    outln!("key         {key}");
                }
                for (name, value) in &letter.headers {
                    outln!("header      {name}: {value}");
                }
                outln!("body\n{}", letter.body);
            }
        }
        DlqAction::Replay { ids, queue, reason, since, until, all, max, dry_run, yes } => {
            if ids.is_empty() {
                let max = max.map(|m| usize::try_from(m).unwrap_or(MAX_REPLAY));
                let filter = ReplayFilter { queue, reason_contains: reason, since, until, max, dry_run: true, all };
                return replay_matching(&client, filter, dry_run, yes).await;
            }
            for id in ids {
                let replayed = client.replay(&id).await?;
                outln!("{} replayed to {}", replayed.id, replayed.queue);
            }
        }
        DlqAction::Purge { ids, all } => {
            let ids = if all { collect(&client, usize::MAX).await?.into_iter().map(|l| l.id).collect() } else { ids };
            for id in &ids {
                client.purge(id).await?;
            }
            outln!("purged {} dead letter(s)", ids.len());
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `dlq replay` with filters: a dry run, then (unless `dry_run`) the replay of what it matched,
/// once confirmed.
async fn replay_matching(
    client: &ApiClient,
    mut filter: ReplayFilter,
    dry_run: bool,
    yes: bool,
) -> anyhow::Result<ExitCode> {
    let counted = client.replay_matching(&filter).await?;
    let matched = counted.matched;
    let more = if counted.more {
        ", and more (a run takes at most --max, 10000, of them: run again for the rest)"
    } else {
        ""
    };
    outln!("{matched} dead letter{} match{more}", if matched == 1 { "" } else { "s" });
    if let Some(sample) = counted.sample.as_ref().filter(|s| !s.is_empty()) {
        let rest = if matched > sample.len() { ", ..." } else { "" };
        outln!("  {}{rest}", sample.join(", "));
    }
    print_skipped(&counted);
    if dry_run || matched == 0 {
        return Ok(ExitCode::SUCCESS);
    }
    if !yes {
        if !(std::io::stdin().is_terminal() && std::io::stderr().is_terminal()) {
            eprintln!("imagepipe dlq replay: nothing replayed: pass --yes to replay them (no terminal to ask on)");
            return Ok(ExitCode::FAILURE);
        }
        if !confirm(&format!("Replay {matched} dead letter{}? [y/N] ", if matched == 1 { "" } else { "s" }))? {
            outln!("nothing replayed");
            return Ok(ExitCode::SUCCESS);
        }
    }
    // No more than were counted and confirmed, oldest first.
    filter.dry_run = false;
    filter.max = Some(matched);
    let report = client.replay_matching(&filter).await?;
    let replayed = report.replayed.unwrap_or_default();
    outln!("replayed {replayed} of {} dead letter{}", report.matched, if report.matched == 1 { "" } else { "s" });
    let failed = report.failed.unwrap_or_default();
    for failure in &failed {
        eprintln!("imagepipe dlq replay: {}: not replayed: {}", failure.id, failure.error);
    }
    Ok(if failed.is_empty() { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

/// The matching dead letters that can never be replayed, and why.
fn print_skipped(report: &ReplayReport) {
    if report.skipped == 0 {
        return;
    }
    outln!("{} more match but cannot be replayed (they stay in the archive):", report.skipped);
    for skipped in &report.skipped_details {
        outln!("  {}: {}", skipped.id, one_line(&skipped.reason));
    }
    if report.skipped > report.skipped_details.len() {
        outln!("  ...");
    }
}

/// Asks `question` on the terminal; whether the answer is yes.
fn confirm(question: &str) -> anyhow::Result<bool> {
    let mut stderr = std::io::stderr();
    stderr.write_all(question.as_bytes())?;
    stderr.flush()?;
    let mut answer = String::new();
    std::io::stdin().lock().read_line(&mut answer)?;
    Ok(matches!(answer.trim().to_lowercase().as_str(), "y" | "yes"))
}

/// Up to `limit` dead letters, following pages.
async fn collect(client: &ApiClient, limit: usize) -> anyhow::Result<Vec<DeadLetter>> {
    let mut letters = Vec::new();
    let mut cursor = None;
    while letters.len() < limit {
        let page = client.dead_letters((limit - letters.len()).clamp(1, PAGE), cursor.as_deref()).await?;
        letters.extend(page.entries);
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    Ok(letters)
}

fn one_line(s: &str) -> String {
    let line = s.lines().next().unwrap_or_default();
    if line.chars().count() > 100 {
        format!("{}…", line.chars().take(100).collect::<String>())
    } else {
        line.to_owned()
    }
}
