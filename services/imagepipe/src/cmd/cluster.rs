//! `imagepipe cluster`: the coordinator replicas, the shards each owns and the recent
//! handovers (`GET /v1/cluster`).

use std::process::ExitCode;
use std::time::{SystemTime, UNIX_EPOCH};

use clap::Args;
use comfy_table::{Table, presets::NOTHING};
use imagepipe_coordinator::cluster::ClusterView;

use super::show::duration;
use super::{print_json, print_table};
use crate::ApiArgs;

/// Options of `imagepipe cluster`.
#[derive(Debug, Args)]
pub struct ClusterArgs {
    /// Print the answer as JSON.
    #[arg(long)]
    json: bool,
    /// Also list every shard: owner, lease expiry, tasks in flight and queued.
    #[arg(long)]
    shards: bool,
}

/// Prints one row per replica (shards owned, work in flight and queued, last heartbeat), then
/// the newest handovers; with `--shards`, one row per shard.
pub async fn run(api: &ApiArgs, args: ClusterArgs) -> anyhow::Result<ExitCode> {
    let view: ClusterView = api.client()?.get("/v1/cluster", &[]).await?;
    if args.json {
        print_json(&view)?;
        return Ok(ExitCode::SUCCESS);
    }
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
    let ago = |at: u64| if at == 0 { "-".to_owned() } else { format!("{} ago", duration(now.saturating_sub(at))) };
    let owned = view.shards.iter().filter(|s| s.owner.is_some()).count();
    outln!(
        "{} shards, {owned} owned, {} replicas (answered by {})",
        view.shard_count,
        view.replicas.len(),
        view.replica
    );
    let mut table = Table::new();
    table.load_preset(NOTHING).set_header([
        "replica",
        "address",
        "shards",
        "in flight",
        "queued",
        "started",
        "heartbeat",
    ]);
    for replica in &view.replicas {
        let mine = view.shards.iter().filter(|s| s.owner.as_deref() == Some(replica.id.as_str()));
        let (in_flight, queued) = mine.fold((0, 0), |(f, q), s| (f + s.in_flight, q + s.queued));
        table.add_row([
            replica.id.clone(),
            replica.address.clone().unwrap_or_else(|| "-".to_owned()),
            replica.shards.to_string(),
            in_flight.to_string(),
            queued.to_string(),
            ago(replica.started_at),
            ago(replica.heartbeat_at),
        ]);
    }
    print_table(&table);
    if args.shards {
        outln!();
        let mut table = Table::new();
        table.load_preset(NOTHING).set_header(["shard", "owner", "token", "lease ends", "in flight", "queued"]);
        for shard in &view.shards {
            let ends =
                if shard.expires_at > now { format!("in {}", duration(shard.expires_at - now)) } else { "-".into() };
            table.add_row([
                shard.shard.to_string(),
                shard.owner.clone().unwrap_or_else(|| "-".to_owned()),
                shard.token.to_string(),
                ends,
                shard.in_flight.to_string(),
                shard.queued.to_string(),
            ]);
        }
        print_table(&table);
    }
    if !view.handovers.is_empty() {
        outln!();
        let mut table = Table::new();
        table.load_preset(NOTHING).set_header(["when", "shard", "from", "to", "reason"]);
        for handover in view.handovers.iter().take(20) {
            table.add_row([
                ago(handover.at),
                handover.shard.to_string(),
                handover.from.clone().unwrap_or_else(|| "-".to_owned()),
                handover.to.clone().unwrap_or_else(|| "-".to_owned()),
                handover.reason.clone(),
            ]);
        }
        print_table(&table);
    }
    if view.counts_partial {
        outln!("(per-shard counts stopped at {} tasks of a state)", imagepipe_coordinator::cluster::COUNT_LIMIT);
    }
    Ok(ExitCode::SUCCESS)
}
