//! `GET /v1/cluster`: the coordinator replicas, who owns each shard until when, each shard's
//! tasks in flight and queued, and the recent handovers ([`crate::cluster::cluster_view`]).

use axum::Json;
use axum::extract::State;
use imagepipe_runtime::http::ApiError;
use imagepipe_runtime::http::Scope::Read;

use super::ApiState;
use super::route::{Operation, Route};
use crate::cluster::{ClusterView, cluster_view};

/// The cluster's route.
pub(super) fn routes() -> Vec<Route<ApiState>> {
    let view = Operation::get("/v1/cluster", Read, "getCluster", "The coordinator replicas and their shards")
        .ok::<ClusterView>(200, "Replicas, shard owners and leases, per-shard work and recent handovers")
        .error(404, "This coordinator is not part of a cluster (an engine without shards)");
    vec![Route::new(view, cluster)]
}

async fn cluster(State(state): State<ApiState>) -> Result<Json<ClusterView>, ApiError> {
    let Some(ownership) = state.engine.ownership() else {
        return Err(ApiError::not_found("this coordinator runs without shards"));
    };
    let now = state.engine.clock().unix_ms();
    Ok(Json(cluster_view(state.engine.store().as_ref(), ownership, now).await?))
}
