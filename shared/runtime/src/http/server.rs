//! Serving one bound listener with the doors closed: at most `max_connections` connections at
//! once (a [`Semaphore`] taken before each accept, so more wait in the kernel's backlog), a
//! request head must arrive within `header_read_timeout`, and a connection on which nothing
//! moved for `idle_timeout` is closed. On shutdown the listener closes, requests in progress
//! finish, and open connections end.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::time::{Instant, Sleep};
use tower::ServiceExt as _;

use crate::shutdown::Shutdown;

/// The limits a server holds every connection to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Most connections served at once.
    pub max_connections: usize,
    /// Longest wait for a whole request head.
    pub header_read_timeout: Duration,
    /// Longest time without a byte moving either way.
    pub idle_timeout: Duration,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        crate::config::HttpConfig::default().limits()
    }
}

impl crate::config::HttpConfig {
    /// The connection limits of the `http` section.
    pub fn limits(&self) -> ConnectionLimits {
        ConnectionLimits {
            max_connections: self.max_connections.max(1),
            header_read_timeout: self.header_read_timeout,
            idle_timeout: self.idle_timeout,
        }
    }
}

/// `router` with the connection's peer address in every request's extensions, where axum's
/// [`ConnectInfo`] extractor finds it.
fn with_peer(
    router: Router,
    peer: std::net::SocketAddr,
) -> impl tower::Service<
    hyper::Request<hyper::body::Incoming>,
    Response = axum::response::Response,
    Error = std::convert::Infallible,
    Future: Send,
> + Clone {
    router.map_request(move |mut request: hyper::Request<hyper::body::Incoming>| {
        request.extensions_mut().insert(ConnectInfo(peer));
        request
    })
}

/// Accepts on `listener` and serves `router` under `limits` until `shutdown` (see the module
/// docs).
pub(super) async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ConnectionLimits,
    shutdown: Shutdown,
) -> io::Result<()> {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let graceful = GracefulShutdown::new();
    let mut accept_failures = 0u32;
    loop {
        let slot = tokio::select! {
            () = shutdown.wait() => break,
            slot = slots.clone().acquire_owned() => slot.expect("the connection semaphore is never closed"),
        };
        let (stream, peer) = tokio::select! {
            () = shutdown.wait() => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    accept_failures = (accept_failures + 1).min(6);
                    tracing::warn!(%error, "accepting an HTTP connection failed");
                    tokio::time::sleep(Duration::from_millis(10 << accept_failures)).await;
                    continue;
                }
            },
        };
        accept_failures = 0;
        let _ = stream.set_nodelay(true);
        let io = TokioIo::new(IdleTimeout::new(stream, limits.idle_timeout));
        let connection = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(limits.header_read_timeout)
            .serve_connection(io, TowerToHyperService::new(with_peer(router.clone(), peer)));
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(%peer, %error, "HTTP connection ended with an error");
            }
            drop(slot);
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

/// A stream that fails with [`io::ErrorKind::TimedOut`] once no byte moved either way for its
/// idle timeout.
struct IdleTimeout<S> {
    inner: S,
    idle: Duration,
    deadline: Pin<Box<Sleep>>,
}

impl<S> IdleTimeout<S> {
    fn new(inner: S, idle: Duration) -> Self {
        Self { inner, idle, deadline: Box::pin(tokio::time::sleep(idle)) }
    }

    fn moved(&mut self) {
        self.deadline.as_mut().reset(Instant::now() + self.idle);
    }

    /// Ready with an error once the deadline passed (while the inner stream is pending).
    fn poll_idle(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        ready!(self.deadline.as_mut().poll(cx));
        Poll::Ready(io::Error::new(io::ErrorKind::TimedOut, format!("no byte moved for {:?}", self.idle)))
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for IdleTimeout<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        match Pin::new(&mut self.inner).poll_read(cx, buf) {
            Poll::Ready(result) => {
                if buf.filled().len() > before {
                    self.moved();
                }
                Poll::Ready(result)
            }
            Poll::Pending => self.poll_idle(cx).map(Err),
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for IdleTimeout<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        match Pin::new(&mut self.inner).poll_write(cx, data) {
            Poll::Ready(Ok(written)) => {
                if written > 0 {
                    self.moved();
                }
                Poll::Ready(Ok(written))
            }
            Poll::Ready(Err(error)) => Poll::Ready(Err(error)),
            Poll::Pending => self.poll_idle(cx).map(Err),
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, SocketAddr};

    use axum::routing::get;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    use super::*;

    const REQUEST: &[u8] = b"GET /ok HTTP/1.1\r\nHost: test\r\n\r\n";

    async fn start(limits: ConnectionLimits) -> (SocketAddr, Shutdown) {
        let listener = TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0))).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let router = Router::new().route("/ok", get(|| async { "ok" }));
        let shutdown = Shutdown::new();
        tokio::spawn(serve(listener, router, limits, shutdown.clone()));
        (addr, shutdown)
    }

    fn limits(header_read_ms: u64, idle_ms: u64, max_connections: usize) -> ConnectionLimits {
        ConnectionLimits {
            max_connections,
            header_read_timeout: Duration::from_millis(header_read_ms),
            idle_timeout: Duration::from_millis(idle_ms),
        }
    }

    /// Reads until the server closes the connection, at most `within`; what was read.
    async fn read_until_closed(stream: &mut TcpStream, within: Duration) -> Option<String> {
        let mut read = Vec::new();
        match tokio::time::timeout(within, stream.read_to_end(&mut read)).await {
            Ok(_) => Some(String::from_utf8_lossy(&read).into_owned()),
            Err(_) => None,
        }
    }

    #[tokio::test]
    async fn a_request_head_that_never_ends_is_cut_off() {
        let (addr, _shutdown) = start(limits(200, 60_000, 8)).await;
        let mut slow = TcpStream::connect(addr).await.unwrap();
        slow.write_all(b"GET /ok HTTP/1.1\r\nHost: te").await.unwrap();
        let answer = read_until_closed(&mut slow, Duration::from_secs(5)).await;
        assert!(answer.is_some_and(|a| !a.contains("200 OK")), "closed without an answer");
    }

    #[tokio::test]
    async fn a_connection_on_which_nothing_moves_is_closed() {
        let (addr, _shutdown) = start(limits(60_000, 300, 8)).await;
        let mut client = TcpStream::connect(addr).await.unwrap();
        client.write_all(REQUEST).await.unwrap();
        let answer = read_until_closed(&mut client, Duration::from_secs(5)).await.expect("closed once idle");
        assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer}");
    }

    #[tokio::test]
    async fn connections_beyond_the_cap_wait_for_a_free_slot() {
        let (addr, _shutdown) = start(limits(60_000, 60_000, 1)).await;
        let mut holder = TcpStream::connect(addr).await.unwrap();
        holder.write_all(b"GET /ok HTTP/1.1\r\nHost: test\r\n").await.unwrap();
        let mut waiting = TcpStream::connect(addr).await.unwrap();
        waiting.write_all(b"GET /ok HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n").await.unwrap();
        let mut first = [0u8; 1];
        let early = tokio::time::timeout(Duration::from_millis(300), waiting.read(&mut first)).await;
        assert!(early.is_err(), "no answer while the only slot is taken");
        drop(holder);
        let answer =
            read_until_closed(&mut waiting, Duration::from_secs(5)).await.expect("served once the slot is free");
        assert!(format!("{}{answer}", first[0] as char).contains("200 OK") || answer.contains("200 OK"), "{answer}");
    }

    #[tokio::test]
    async fn shutdown_closes_the_listener() {
        let (addr, shutdown) = start(limits(60_000, 60_000, 8)).await;
        let mut client = TcpStream::connect(addr).await.unwrap();
        client.write_all(b"GET /ok HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n").await.unwrap();
        assert!(read_until_closed(&mut client, Duration::from_secs(5)).await.unwrap().contains("200 OK"));
        shutdown.trigger();
        let closed = async {
            while TcpStream::connect(addr).await.is_ok() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(5), closed).await.expect("the listener closes on shutdown");
    }
}
