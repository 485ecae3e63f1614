//! [`conformance_suite!`](crate::conformance_suite): one test per case, for one backend.

/// Expands to `mod $backend` with one `#[tokio::test]` per case in
/// [`conformance::cases`](crate::conformance::cases), each on a fresh bus of `$harness` (an
/// expression of a type implementing [`Harness`](crate::conformance::Harness), evaluated per
/// test in a child module of the caller).
///
/// `skip { case: "reason", ... }` marks cases the backend cannot pass yet as
/// `#[ignore = "reason"]`; naming a case that does not exist fails to compile.
///
/// The test crate needs `tokio` with the `macros` and `rt-multi-thread` features.
#[macro_export]
macro_rules! conformance_suite {
    ($backend:ident, $harness:expr $(,)?) => {
        $crate::conformance_suite!($backend, $harness, skip {});
    };
    ($backend:ident, $harness:expr, skip { $($case:ident : $reason:literal),* $(,)? } $(,)?) => {
        $crate::__conformance_suite!(($) $backend, $harness, { $($case : $reason),* });
    };
}

/// The body of [`conformance_suite!`]; `$d` is a `$` for the inner macro's own variables.
#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_suite {
    (($d:tt) $backend:ident, $harness:expr, { $($skipped:ident : $reason:literal),* }) => {
        mod $backend {
            #[allow(unused_imports)]
            use super::*;

            macro_rules! case {
                $( ($skipped) => { $crate::__conformance_test!($skipped, $harness, #[ignore = $reason]); }; )*
                ($d name:ident) => { $crate::__conformance_test!($d name, $harness,); };
            }

            $( const _: () = { let _ = $crate::conformance::cases::$skipped; }; )*

            // Task queues.
            case!(send_fetch_delivers_payload_key_id);
            case!(headers_round_trip);
            case!(fetch_waits_then_returns_empty);
            case!(fetch_returns_as_soon_as_a_message_arrives);
            case!(a_fetch_dropped_while_waiting_loses_nothing);
            case!(fetch_returns_at_most_max);
            case!(ack_removes_for_good);
            case!(nack_with_delay);
            case!(redelivery_after_ack_deadline);
            case!(progress_extends_deadline);
            case!(delivery_count_increments);
            case!(competing_consumers_share_queue);
            case!(per_key_order);
            case!(send_batch);
            case!(publish_dedup_by_message_id_queue);
            case!(invalid_names_are_rejected);
            case!(messages_over_the_size_limit_are_refused);
            // Partitioned queues.
            case!(partition_messages_reach_only_their_partition);
            case!(one_consumer_reads_several_partitions);
            case!(partition_deliveries_retry_and_dead_letter);
            case!(dropped_partition_consumer_hands_over_at_once);
            case!(many_partitions_open_quickly_and_deliver_from_any);
            // Dead letters.
            case!(max_deliveries_dead_letters);
            case!(expired_last_delivery_dead_letters);
            case!(terminate_dead_letters_immediately);
            case!(group_dead_letters_go_to_group_dlq);
            // Event topics.
            case!(broadcast_to_every_group);
            case!(group_members_compete);
            case!(groups_settle_independently);
            case!(selector_alternatives);
            case!(selector_wildcard);
            case!(start_new_only);
            case!(start_from_beginning);
            case!(start_since_timestamp);
            case!(durable_group_resumes);
            case!(publish_dedup_by_message_id_topic);
            case!(event_type_header_added);
            // Everything at once.
            case!(concurrent_stress);
        }
    };
}

/// One test of [`conformance_suite!`].
#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_test {
    ($name:ident, $harness:expr, $(#[$attr:meta])*) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        $(#[$attr])*
        async fn $name() {
            let harness = $harness;
            $crate::conformance::run(&harness, stringify!($name), $crate::conformance::cases::$name(&harness)).await;
        }
    };
}
