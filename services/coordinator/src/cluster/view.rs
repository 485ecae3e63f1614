//! What `GET /v1/cluster` shows: the replicas, who owns each shard until when, what each
//! shard has in flight and queued, and the recent handovers.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::Ownership;
use crate::store::{Handover, ListQuery, StoreError, TaskStore};
use crate::task::TaskState;

/// Most tasks of one state read to count them per shard: a count that reached it is partial.
pub const COUNT_LIMIT: usize = 10_000;

/// How many handovers the view lists.
pub const HANDOVERS_SHOWN: usize = 50;

/// The cluster as one replica sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterView {
    /// The replica that answered.
    pub replica: String,
    /// How many shards there are.
    pub shard_count: u16,
    /// The live replicas, by id.
    pub replicas: Vec<ReplicaView>,
    /// Every shard, in order.
    pub shards: Vec<ShardView>,
    /// Whether a per-shard count stopped at [`COUNT_LIMIT`] tasks of a state.
    pub counts_partial: bool,
    /// The newest handovers, newest first.
    pub handovers: Vec<Handover>,
}

/// A live replica.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReplicaView {
    /// Its id.
    pub id: String,
    /// Where its API is reached.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// When it started, Unix ms.
    pub started_at: u64,
    /// Its last heartbeat, Unix ms.
    pub heartbeat_at: u64,
    /// How many shards it holds a current lease on.
    pub shards: usize,
}

/// One shard.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ShardView {
    /// The shard.
    pub shard: u16,
    /// The replica holding a current lease on it (none: free, or its lease ran out).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// The lease's fencing token.
    pub token: u64,
    /// When the lease runs out unless renewed, Unix ms (0: none).
    pub expires_at: u64,
    /// Its tasks started and unfinished.
    pub in_flight: u64,
    /// Its tasks queued (waiting for room under the in-flight cap).
    pub queued: u64,
}

/// The cluster as `ownership`'s replica sees it at `now`, read from `store`.
pub async fn cluster_view(store: &dyn TaskStore, ownership: &Ownership, now: u64) -> Result<ClusterView, StoreError> {
    let replicas = store.replicas(now).await?;
    let leases: BTreeMap<u16, _> = store.leases().await?.into_iter().map(|l| (l.shard, l)).collect();
    let mut shards: Vec<ShardView> = (0..ownership.shard_count())
        .map(|shard| {
            let lease = leases.get(&shard);
            ShardView {
                shard,
                owner: lease.filter(|l| l.is_held(now)).map(|l| l.owner.clone()),
                token: lease.map_or(0, |l| l.token),
                expires_at: lease.map_or(0, |l| l.expires_at),
                in_flight: 0,
                queued: 0,
            }
        })
        .collect();
    let mut counts_partial = false;
    for state in [TaskState::Downloading, TaskState::ExtractingMetadata, TaskState::Analyzing, TaskState::Queued] {
        let page = store.list(&ListQuery { state: Some(state), limit: COUNT_LIMIT, ..ListQuery::default() }).await?;
        counts_partial |= page.next_cursor.is_some();
        for task in page.tasks.iter().filter(|t| t.state == state) {
            let view = &mut shards[usize::from(ownership.shard_of(&task.id))];
            if state == TaskState::Queued {
                view.queued += 1;
            } else {
                view.in_flight += 1;
            }
        }
    }
    let replicas = replicas
        .into_iter()
        .map(|r| ReplicaView {
            shards: shards.iter().filter(|s| s.owner.as_deref() == Some(r.id.as_str())).count(),
            id: r.id,
            address: r.address,
            started_at: r.started_at,
            heartbeat_at: r.heartbeat_at,
        })
        .collect();
    let handovers = store.handovers(HANDOVERS_SHOWN).await?;
    Ok(ClusterView {
        replica: ownership.replica().to_owned(),
        shard_count: ownership.shard_count(),
        replicas,
        shards,
        counts_partial,
        handovers,
    })
}
