//! The shutdown signal passed into every `run` function.

use tokio_util::sync::CancellationToken;

/// Fires once: on SIGTERM or SIGINT (see [`Shutdown::on_signals`]), or when
/// [`Shutdown::trigger`]ed. Cheap to clone; every clone sees the same signal.
#[derive(Debug, Clone, Default)]
pub struct Shutdown {
    token: CancellationToken,
}

impl Shutdown {
    /// A signal that fires only when triggered.
    pub fn new() -> Self {
        Self::default()
    }

    /// A signal that also fires on SIGTERM or SIGINT (Ctrl-C). The handlers are installed
    /// before this returns, so a signal arriving right after is not missed. Needs a Tokio
    /// runtime.
    pub fn on_signals() -> std::io::Result<Self> {
        let shutdown = Self::new();
        let fired = shutdown.clone();
        let signals = Signals::install()?;
        tokio::spawn(async move {
            let name = signals.recv().await;
            tracing::info!(signal = name, "shutting down");
            fired.trigger();
        });
        Ok(shutdown)
    }

    /// Fires the signal (idempotent).
    pub fn trigger(&self) {
        self.token.cancel();
    }

    /// Whether the signal has fired.
    pub fn is_triggered(&self) -> bool {
        self.token.is_cancelled()
    }

    /// Completes once the signal has fired.
    pub async fn wait(&self) {
        self.token.cancelled().await;
    }

    /// Waits `period` unless the signal fires first; `true` when the whole period passed. The
    /// pause of every periodic loop: `loop { work().await; if !shutdown.sleep(every).await { break } }`.
    pub async fn sleep(&self, period: std::time::Duration) -> bool {
        tokio::select! {
            () = self.wait() => false,
            () = tokio::time::sleep(period) => true,
        }
    }

    /// A signal that fires with this one, and can also be fired alone (one component's stop).
    pub fn child(&self) -> Self {
        Self { token: self.token.child_token() }
    }

    /// The underlying token, for APIs that take a [`CancellationToken`].
    pub fn token(&self) -> &CancellationToken {
        &self.token
    }
}

impl From<CancellationToken> for Shutdown {
    fn from(token: CancellationToken) -> Self {
        Self { token }
    }
}

#[cfg(unix)]
struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

#[cfg(unix)]
impl Signals {
    fn install() -> std::io::Result<Self> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Self { term: signal(SignalKind::terminate())?, int: signal(SignalKind::interrupt())? })
    }

    async fn recv(mut self) -> &'static str {
        tokio::select! {
            _ = self.term.recv() => "SIGTERM",
            _ = self.int.recv() => "SIGINT",
        }
    }
}

#[cfg(not(unix))]
struct Signals;

#[cfg(not(unix))]
impl Signals {
    fn install() -> std::io::Result<Self> {
        Ok(Self)
    }

    async fn recv(self) -> &'static str {
        let _ = tokio::signal::ctrl_c().await;
        "Ctrl-C"
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn every_clone_sees_the_trigger() {
        let shutdown = Shutdown::new();
        let clone = shutdown.clone();
        let waiter = tokio::spawn(async move { clone.wait().await });
        assert!(!shutdown.is_triggered());
        shutdown.trigger();
        tokio::time::timeout(Duration::from_secs(5), waiter).await.unwrap().unwrap();
        assert!(shutdown.is_triggered());
    }

    #[tokio::test]
    async fn a_child_fires_with_its_parent_but_not_the_reverse() {
        let parent = Shutdown::new();
        let child = parent.child();
        let other_child = parent.child();
        other_child.trigger();
        assert!(!parent.is_triggered() && !child.is_triggered());
        parent.trigger();
        assert!(child.is_triggered());
    }

    #[cfg(unix)]
    #[tokio::test]
    async fn sigterm_fires_the_signal() {
        let shutdown = Shutdown::on_signals().unwrap();
        let status = std::process::Command::new("kill")
            .args(["-TERM", &std::process::id().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success());
        tokio::time::timeout(Duration::from_secs(10), shutdown.wait()).await.expect("SIGTERM observed");
    }
}
