//! Routing an input to its shard's owner: a submission or step result that arrived where its
//! shard's owner does not read it (sent to the queue itself, by a client that does not address
//! partitions, or to the wrong partition) is handed on to the partition of its task's shard
//! before it is acknowledged (docs/design.md, "Shards, leases and routing").

use imagepipe_bus::{Bus, Delivery};
use imagepipe_runtime::worker::Outcome;
use metrics::counter;

use crate::cluster::Ownership;
use crate::metrics as m;

/// Where an input is handled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// Here: this replica owns its shard, or it came through its shard's partition (where
    /// only the owner reads; a replica that lost the shard meanwhile has it redelivered).
    Here,
    /// Handed on to this partition.
    To(u16),
}

/// Where `delivery`, an input of task `task_id`, is handled: always here outside a cluster.
pub fn route(ownership: Option<&Ownership>, delivery: &Delivery, task_id: &str) -> Route {
    let Some(ownership) = ownership else { return Route::Here };
    let shard = ownership.shard_of(task_id);
    if delivery.message.partition == Some(shard) || ownership.owns(shard) { Route::Here } else { Route::To(shard) }
}

/// Sends `delivery` to partition `shard` of the queue (lane) it came from, its body replaced
/// by `body` when given, and says to acknowledge it once the bus took the copy. The copy's
/// message id is the original's with the partition appended: a redelivered original is handed
/// on under the same id, which the bus deduplicates where it can, and it never collides with
/// the original's own.
pub async fn hand_on(bus: &Bus, delivery: &Delivery, shard: u16, body: Option<Vec<u8>>) -> Outcome {
    let mut message = delivery.message.clone();
    message.partition = Some(shard);
    message.id = message.id.map(|id| format!("{id}/p{shard}"));
    if let Some(body) = body {
        message.payload = body.into();
    }
    match bus.queues.send(&delivery.source, message).await {
        Ok(()) => {
            counter!(m::INPUTS_ROUTED, m::QUEUE => imagepipe_contracts::lane_of(&delivery.source).0.to_owned())
                .increment(1);
            Outcome::Ack
        }
        Err(e) => Outcome::retry(format!("handing the input on to partition {shard}: {e}")),
    }
}

/// A submission's body with `taskId` set to `task_id` (the id derived from the message it
/// first arrived in, which its copy would not derive again); `None` when it has one already or
/// is not a JSON object.
pub fn with_task_id(payload: &[u8], task_id: &str) -> Option<Vec<u8>> {
    let mut body: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(payload).ok()?;
    if body.contains_key("taskId") {
        return None;
    }
    body.insert("taskId".to_owned(), serde_json::Value::String(task_id.to_owned()));
    serde_json::to_vec(&body).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_submission_without_id_gets_the_derived_one() {
        let body = with_task_id(br#"{"imageUrl":"https://example.com/a.jpg"}"#, "tsk_x").unwrap();
        let value: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(value["taskId"], "tsk_x");
        assert_eq!(value["imageUrl"], "https://example.com/a.jpg");
        assert_eq!(with_task_id(br#"{"taskId":"a"}"#, "b"), None);
    }
}
