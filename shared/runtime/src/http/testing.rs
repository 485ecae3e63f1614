//! Plain HTTP/1.1 requests over a fresh connection, for tests of a service's HTTP edge (health,
//! readiness, metrics, `/v1` routes and their token check) without an HTTP client.

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The answer to one request: status, lowercased head, body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// The status code.
    pub status: u16,
    /// Status line and headers, lowercased.
    pub head: String,
    /// The body.
    pub body: String,
}

/// `GET path` on `addr`.
pub async fn get(addr: SocketAddr, path: &str) -> Answer {
    request(addr, "GET", path, None).await
}

/// `method path` on `addr`, with `Authorization: Bearer <token>` when a token is given.
///
/// # Panics
///
/// When the connection fails or the answer is not HTTP: a test failure.
pub async fn request(addr: SocketAddr, method: &str, path: &str, token: Option<&str>) -> Answer {
    request_with_body(addr, method, path, token, &[]).await
}

/// `method path` on `addr` with `body` (and `Authorization: Bearer <token>` when a token is
/// given).
///
/// # Panics
///
/// When the connection fails or the answer is not HTTP: a test failure.
pub async fn request_with_body(addr: SocketAddr, method: &str, path: &str, token: Option<&str>, body: &[u8]) -> Answer {
    let auth = token.map(|t| format!("Bearer {t}"));
    let headers: Vec<(&str, &str)> = auth.as_deref().map(|a| ("Authorization", a)).into_iter().collect();
    request_with_headers(addr, method, path, &headers, body).await
}

/// `method path` on `addr` with `headers` and `body`; `Host` is `addr` unless `headers` name
/// another.
///
/// # Panics
///
/// When the connection fails or the answer is not HTTP: a test failure.
pub async fn request_with_headers(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Answer {
    let mut stream = TcpStream::connect(addr).await.expect("connecting to the server under test");
    let host = headers.iter().any(|(name, _)| name.eq_ignore_ascii_case("host"));
    let host = if host { String::new() } else { format!("Host: {addr}\r\n") };
    let extra: String = headers.iter().map(|(name, value)| format!("{name}: {value}\r\n")).collect();
    let length = body.len();
    let request =
        format!("{method} {path} HTTP/1.1\r\n{host}{extra}Content-Length: {length}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.expect("sending the request");
    // A server may answer (413) and close before it read the whole body.
    let _ = stream.write_all(body).await;
    // A server that answered before it read the whole body may reset the connection after its
    // answer: what arrived before the reset is the answer.
    let mut response = Vec::new();
    let _ = stream.read_to_end(&mut response).await;
    let response = String::from_utf8_lossy(&response);
    let (head, body) = response.split_once("\r\n\r\n").expect("a full HTTP answer");
    let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).expect("a status line");
    Answer { status, head: head.to_ascii_lowercase(), body: body.to_owned() }
}

/// `GET path` (with `token`) until the answer is `done`, at most 10 s; the last answer. For
/// what a service brings up after it started: its `/v1` routes, its readiness.
pub async fn get_until(addr: SocketAddr, path: &str, token: Option<&str>, done: impl Fn(&Answer) -> bool) -> Answer {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let answer = request(addr, "GET", path, token).await;
        if done(&answer) || tokio::time::Instant::now() >= deadline {
            return answer;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Serves `routes` on a free loopback port the way a service serves its `/v1` routes: behind
/// [`ApiRoutes`](super::ApiRoutes)' checks (Host rule, scopes), with no token, so a test of one
/// service's routes meets the same edge its binary has. The server runs until the test ends.
///
/// # Panics
///
/// When no loopback port can be bound or metrics cannot be installed: a test failure.
pub async fn serve_api(routes: axum::Router) -> SocketAddr {
    let api = super::ApiRoutes::new(None);
    api.add(routes);
    let metrics = crate::metrics::install().expect("metrics for the server under test");
    let bound = super::HealthServer::new(super::Readiness::new(), metrics)
        .api(api)
        .bind(SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, 0)))
        .await
        .expect("binding the server under test");
    let addr = bound.local_addr();
    tokio::spawn(bound.serve(crate::shutdown::Shutdown::new()));
    addr
}
