//! Connecting what a service needs at start (the bus, a Redis-backed store) the same way:
//! while the other end is unreachable, retry with [`ExponentialBackoff::broker_reconnect`]
//! (jittered), a log line per failed attempt, until it answers or shutdown fires. Readiness
//! stays false meanwhile ([`crate::Service::connect`] adds the check), and the process does not
//! exit: a broker or a Redis that starts after the service is normal in a deployment.

use std::future::Future;

use crate::backoff::ExponentialBackoff;
use crate::shutdown::Shutdown;
use crate::worker::error_chain;

/// Why [`with_retry`] gave up.
#[derive(Debug)]
pub enum Unconnected<E> {
    /// `open` failed with an error the caller does not retry (a bad setting, a corrupt store).
    Failed(E),
    /// Shutdown fired before `open` succeeded.
    Interrupted,
}

/// Runs `open` until it succeeds. A failure `retryable` accepts is logged (naming `what`, the
/// attempt and the delay) and retried after the next delay of `backoff`; any other failure is
/// returned at once. Returns [`Unconnected::Interrupted`] when `shutdown` fires first.
pub async fn with_retry<T, E, F, Fut>(
    what: &str,
    backoff: ExponentialBackoff,
    shutdown: &Shutdown,
    retryable: impl Fn(&E) -> bool,
    mut open: F,
) -> Result<T, Unconnected<E>>
where
    E: std::error::Error + 'static,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let mut attempts = backoff.attempts();
    loop {
        let outcome = tokio::select! {
            () = shutdown.wait() => return Err(Unconnected::Interrupted),
            outcome = open() => outcome,
        };
        match outcome {
            Ok(connected) => {
                if attempts.failures() > 0 {
                    tracing::info!(what, attempts = attempts.failures() + 1, "connected");
                }
                return Ok(connected);
            }
            Err(error) if retryable(&error) => {
                let delay = attempts.next_delay();
                tracing::warn!(what, attempt = attempts.failures(), error = %error_chain(&error), retry_in = ?delay,
                    "unreachable; retrying");
                if !shutdown.sleep(delay).await {
                    return Err(Unconnected::Interrupted);
                }
            }
            Err(error) => return Err(Unconnected::Failed(error)),
        }
    }
}

/// Whether a Redis error means the server could not be reached (refused, reset, timed out, any
/// I/O failure), as opposed to a refusal that retrying will not change.
pub fn redis_unreachable(error: &redis::RedisError) -> bool {
    error.is_io_error() || error.is_connection_refusal() || error.is_timeout() || error.is_connection_dropped()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::Duration;

    use super::*;
    use crate::backoff::Jitter;

    #[derive(Debug, thiserror::Error)]
    #[error("{0}")]
    struct Failed(&'static str);

    fn fast() -> ExponentialBackoff {
        ExponentialBackoff::new(Duration::from_millis(1), Duration::from_millis(5), Jitter::None).unwrap()
    }

    #[tokio::test]
    async fn retries_what_is_retryable_until_it_succeeds() {
        let calls = Arc::new(AtomicU32::new(0));
        let counted = calls.clone();
        let opened = with_retry(
            "test",
            fast(),
            &Shutdown::new(),
            |e: &Failed| e.0 == "down",
            move || {
                let n = counted.fetch_add(1, Ordering::SeqCst);
                async move { if n < 3 { Err(Failed("down")) } else { Ok(n) } }
            },
        )
        .await;
        assert_eq!(opened.ok(), Some(3));
        assert_eq!(calls.load(Ordering::SeqCst), 4);
    }

    #[tokio::test]
    async fn gives_up_at_once_on_what_is_not_retryable() {
        let opened = with_retry(
            "test",
            fast(),
            &Shutdown::new(),
            |e: &Failed| e.0 == "down",
            || async { Err::<(), _>(Failed("bad setting")) },
        )
        .await;
        assert!(matches!(opened, Err(Unconnected::Failed(Failed("bad setting")))));
    }

    #[tokio::test]
    async fn shutdown_ends_the_retries() {
        let shutdown = Shutdown::new();
        let stop = shutdown.clone();
        let calls = Arc::new(AtomicU32::new(0));
        let counted = calls.clone();
        let opened = with_retry(
            "test",
            fast(),
            &shutdown,
            |_: &Failed| true,
            move || {
                if counted.fetch_add(1, Ordering::SeqCst) == 2 {
                    stop.trigger();
                }
                async { Err::<(), _>(Failed("down")) }
            },
        )
        .await;
        assert!(matches!(opened, Err(Unconnected::Interrupted)));
        assert_eq!(calls.load(Ordering::SeqCst), 3);
    }
}
