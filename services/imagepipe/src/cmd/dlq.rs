//! `imagepipe dlq list|show|replay|purge`: dead letters kept by the coordinator.

use std::process::ExitCode;

use clap::{Args, Subcommand};
use imagepipe::ApiClient;
use imagepipe_coordinator::store::DeadLetter;

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
    #[command(flatten)]
    api: ApiArgs,
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
    /// Send dead letters back to their queues.
    Replay {
        /// Dead letter ids.
        #[arg(required = true)]
        ids: Vec<String>,
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
pub async fn run(args: DlqArgs) -> anyhow::Result<ExitCode> {
    let client = args.api.client()?;
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
        DlqAction::Replay { ids } => {
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
