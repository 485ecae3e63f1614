//! Test helpers: a fixture HTTP server on loopback and a dial check that refuses anything else.
//!
//! The server speaks just enough HTTP/1.1 for a client under test: one request per connection,
//! answered by the [`Route`] registered for its path (404 otherwise), then closed.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use crate::guard::DialCheck;

/// Largest request head the fixture server reads.
const MAX_HEAD: usize = 64 * 1024;

/// A dial check allowing only loopback addresses and recording every other address it was asked
/// about; a test asserts [`LoopbackOnly::violations`] is empty.
#[derive(Debug, Clone, Default)]
pub struct LoopbackOnly {
    violations: Arc<Mutex<Vec<IpAddr>>>,
}

impl LoopbackOnly {
    /// A check with no violations yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Every non-loopback address the client tried to dial.
    pub fn violations(&self) -> Vec<IpAddr> {
        self.violations.lock().expect("violations lock").clone()
    }
}

impl DialCheck for LoopbackOnly {
    fn allow(&self, addr: IpAddr) -> bool {
        if addr.to_canonical().is_loopback() {
            return true;
        }
        self.violations.lock().expect("violations lock").push(addr);
        false
    }
}

/// How the fixture server answers one path.
#[derive(Debug, Clone)]
pub enum Route {
    /// A complete response with `Content-Length`.
    Respond {
        /// Status code.
        status: u16,
        /// Extra headers.
        headers: Vec<(String, String)>,
        /// Body.
        body: Bytes,
    },
    /// Declares `declared` bytes, then sends one byte every `every`, forever.
    Drip {
        /// The declared `Content-Length`.
        declared: u64,
        /// Time between bytes.
        every: Duration,
    },
    /// A 200 without `Content-Length` whose body repeats `chunk` until the client hangs up.
    Endless {
        /// The repeated bytes.
        chunk: Bytes,
    },
    /// Reads the request and never answers, holding the connection open until the client
    /// hangs up.
    Silent,
}

impl Route {
    /// `200 OK` with `content_type` and `body`.
    pub fn ok(content_type: &str, body: impl Into<Bytes>) -> Self {
        Self::Respond { status: 200, headers: vec![("Content-Type".into(), content_type.into())], body: body.into() }
    }

    /// `status` with an empty body.
    pub fn status(status: u16) -> Self {
        Self::Respond { status, headers: Vec::new(), body: Bytes::new() }
    }

    /// `status` with `headers` and an empty body.
    pub fn with_headers(status: u16, headers: &[(&str, &str)]) -> Self {
        let headers = headers.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        Self::Respond { status, headers, body: Bytes::new() }
    }

    /// `302 Found` to `location`.
    pub fn redirect(location: &str) -> Self {
        Self::with_headers(302, &[("Location", location)])
    }
}

/// A request the fixture server received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    /// Method.
    pub method: String,
    /// Path and query.
    pub target: String,
    /// Headers, names lowercased.
    pub headers: Vec<(String, String)>,
    /// Body (read by `Content-Length`).
    pub body: Bytes,
}

/// A fixture HTTP server on a loopback address and a free port, stopped on drop.
#[derive(Debug)]
pub struct FixtureServer {
    addr: SocketAddr,
    recorded: Arc<Mutex<Vec<Recorded>>>,
    accept: JoinHandle<()>,
}

impl FixtureServer {
    /// Starts serving `routes` (path without query → route) on `127.0.0.1`.
    pub async fn start(routes: impl IntoIterator<Item = (&'static str, Route)>) -> std::io::Result<Self> {
        Self::start_on(Ipv4Addr::LOCALHOST, routes).await
    }

    /// Starts serving `routes` on another loopback address (`127.0.0.2`, ...), so a test can
    /// allow one local server and not another.
    pub async fn start_on(
        ip: Ipv4Addr,
        routes: impl IntoIterator<Item = (&'static str, Route)>,
    ) -> std::io::Result<Self> {
        assert!(ip.is_loopback(), "fixture servers stay on loopback");
        let listener = TcpListener::bind((ip, 0)).await?;
        let addr = listener.local_addr()?;
        let routes: Arc<HashMap<String, Route>> =
            Arc::new(routes.into_iter().map(|(path, route)| (path.to_owned(), route)).collect());
        let recorded = Arc::new(Mutex::new(Vec::new()));
        let log = recorded.clone();
        let accept = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve(stream, routes.clone(), log.clone()));
            }
        });
        Ok(Self { addr, recorded, accept })
    }

    /// The server's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://<address>:<port><path>`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Every request received so far.
    pub fn requests(&self) -> Vec<Recorded> {
        self.recorded.lock().expect("recorded lock").clone()
    }
}

impl Drop for FixtureServer {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

async fn serve(mut stream: TcpStream, routes: Arc<HashMap<String, Route>>, log: Arc<Mutex<Vec<Recorded>>>) {
    let Some(request) = read_request(&mut stream).await else { return };
    let path = request.target.split('?').next().unwrap_or_default().to_owned();
    log.lock().expect("recorded lock").push(request);
    let route = routes.get(&path).cloned().unwrap_or_else(|| Route::status(404));
    let _ = respond(&mut stream, route).await;
}

async fn read_request(stream: &mut TcpStream) -> Option<Recorded> {
    let mut buffer = Vec::new();
    let head_end = loop {
        if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            break end;
        }
        if buffer.len() > MAX_HEAD {
            return None;
        }
        let mut chunk = [0u8; 4096];
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buffer.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buffer[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let mut request_line = lines.next()?.split(' ');
    let (method, target) = (request_line.next()?.to_owned(), request_line.next()?.to_owned());
    let headers: Vec<(String, String)> = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let length = headers.iter().find(|(k, _)| k == "content-length").and_then(|(_, v)| v.parse().ok()).unwrap_or(0);
    let mut body = buffer[head_end + 4..].to_vec();
    while body.len() < length {
        let mut chunk = [0u8; 4096];
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        body.extend_from_slice(&chunk[..n]);
    }
    body.truncate(length);
    Some(Recorded { method, target, headers, body: body.into() })
}

async fn respond(stream: &mut TcpStream, route: Route) -> std::io::Result<()> {
    match route {
        Route::Respond { status, headers, body } => {
            let mut head = format!("HTTP/1.1 {status} {}\r\nContent-Length: {}\r\n", reason(status), body.len());
            for (name, value) in headers {
                head.push_str(&format!("{name}: {value}\r\n"));
            }
            head.push_str("Connection: close\r\n\r\n");
            stream.write_all(head.as_bytes()).await?;
            stream.write_all(&body).await
        }
        Route::Drip { declared, every } => {
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: image/jpeg\r\nContent-Length: {declared}\r\nConnection: close\r\n\r\n"
            );
            stream.write_all(head.as_bytes()).await?;
            loop {
                stream.write_all(b"\xff").await?;
                tokio::time::sleep(every).await;
            }
        }
        Route::Endless { chunk } => {
            let head = "HTTP/1.1 200 OK\r\nContent-Type: image/jpeg\r\nConnection: close\r\n\r\n";
            stream.write_all(head.as_bytes()).await?;
            loop {
                stream.write_all(&chunk).await?;
            }
        }
        Route::Silent => {
            let mut byte = [0u8; 1];
            while stream.read(&mut byte).await? > 0 {}
            Ok(())
        }
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        301 => "Moved Permanently",
        302 => "Found",
        303 => "See Other",
        307 => "Temporary Redirect",
        308 => "Permanent Redirect",
        403 => "Forbidden",
        404 => "Not Found",
        410 => "Gone",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Status",
    }
}
