//! Who is on the other end: the connection's [`Peer`], the client address behind a trusted
//! reverse proxy (`http.trusted_proxies`), and the rule against DNS rebinding on a server
//! without tokens ([`rebound`]).
//!
//! A web page whose own name was pointed at 127.0.0.1 (DNS rebinding) is, to the server, a
//! browser on loopback: the connection's peer is loopback, and only the `Host` header still
//! names the page's site. So without a token, a request from a loopback peer must name a
//! loopback host (`localhost`, `127.0.0.1`, `[::1]`, with any port). A request from another
//! machine (only possible with `http.allow_unauthenticated`) is not held to it: the server
//! cannot know the names it is reached by there.

use std::net::{IpAddr, SocketAddr};

use axum::extract::{ConnectInfo, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use ipnet::IpNet;

use super::ApiError;

/// The connection's peer address, when the request came over this server's socket (requests
/// handled in process have none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer(pub Option<SocketAddr>);

impl Peer {
    /// The peer of a request with these extensions.
    pub fn of(extensions: &axum::http::Extensions) -> Self {
        Self(extensions.get::<ConnectInfo<SocketAddr>>().map(|info| info.0))
    }

    /// The peer's IP address.
    pub fn ip(&self) -> Option<IpAddr> {
        self.0.map(|addr| addr.ip())
    }

    /// Whether the peer is a proxy in `proxies`.
    pub fn is_trusted(&self, proxies: &[IpNet]) -> bool {
        self.ip().is_some_and(|ip| proxies.iter().any(|net| net.contains(&ip)))
    }

    /// The client's address: the peer's, or when the peer is a trusted proxy, the last address
    /// of `X-Forwarded-For` that is not one (proxies append the address they were reached
    /// from, so the ones before can be anything the client wrote).
    pub fn client_ip(&self, headers: &HeaderMap, proxies: &[IpNet]) -> Option<IpAddr> {
        let peer = self.ip()?;
        if !self.is_trusted(proxies) {
            return Some(peer);
        }
        let hops: Vec<&str> = headers
            .get_all("x-forwarded-for")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .collect();
        // From the right: the hops our proxies appended are trusted; the first one that is not
        // is the client as the last proxy saw it. Whatever the client wrote lies further left
        // and is never read, so a garbage entry cannot move its failures to another address.
        for hop in hops.into_iter().rev() {
            match hop.parse::<IpAddr>() {
                Ok(ip) if proxies.iter().any(|net| net.contains(&ip)) => {}
                Ok(ip) => return Some(ip),
                Err(_) => break,
            }
        }
        Some(peer)
    }

    /// Whether the client reached a trusted proxy over HTTPS (`X-Forwarded-Proto: https` from a
    /// peer in `proxies`; anyone else's header says nothing).
    pub fn forwarded_https(&self, headers: &HeaderMap, proxies: &[IpNet]) -> bool {
        self.is_trusted(proxies)
            && headers.get("x-forwarded-proto").is_some_and(|p| p.as_bytes().eq_ignore_ascii_case(b"https"))
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Peer {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(Self::of(&parts.extensions))
    }
}

/// Whether the request's `Host` names this machine: `localhost` or a loopback address, with or
/// without a port.
pub fn host_is_loopback(headers: &HeaderMap) -> bool {
    let Some(host) = headers.get(header::HOST).and_then(|h| h.to_str().ok()) else { return false };
    let name = match host.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or_default(),
        None => {
            host.rsplit_once(':').map_or(host, |(name, port)| if port.parse::<u16>().is_ok() { name } else { host })
        }
    };
    name.eq_ignore_ascii_case("localhost") || name.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// Whether a request to a server without tokens looks rebound (see the module docs): its peer
/// is loopback (or unknown) and its `Host` is not.
pub fn rebound(peer: Peer, headers: &HeaderMap) -> bool {
    peer.ip().is_none_or(|ip| ip.is_loopback() || ip.to_canonical().is_loopback()) && !host_is_loopback(headers)
}

/// Middleware of a server without tokens: a [`rebound`] request is answered `403
/// forbidden_host`, on every path.
pub(super) async fn refuse_rebound(request: Request, next: Next) -> Response {
    if !rebound(Peer::of(request.extensions()), request.headers()) {
        return next.run(request).await;
    }
    let host = request.headers().get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or_default();
    let message = format!(
        "Host {host:?} is not a loopback name: without http.auth_token this server answers \
         http://127.0.0.1:<port> and http://localhost:<port> only (a page whose name points at \
         127.0.0.1 must not read it); set http.auth_token to serve other names"
    );
    ApiError::new(StatusCode::FORBIDDEN, "forbidden_host", message).into_response()
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            headers.append(*name, HeaderValue::from_static(value));
        }
        headers
    }

    #[test]
    fn only_loopback_names_pass() {
        let check = |host: &'static str| host_is_loopback(&headers(&[("host", host)]));
        for host in [
            "localhost",
            "localhost:8080",
            "LOCALHOST:1",
            "127.0.0.1",
            "127.0.0.1:8080",
            "127.9.9.9:80",
            "[::1]:8080",
            "[::1]",
        ] {
            assert!(check(host), "{host}");
        }
        for host in [
            "evil.example",
            "evil.example:8080",
            "10.0.0.1:8080",
            "localhost.evil.example",
            "[::2]:80",
            "127.0.0.1.nip.io",
        ] {
            assert!(!check(host), "{host}");
        }
        assert!(!host_is_loopback(&HeaderMap::new()));
    }

    #[test]
    fn a_loopback_peer_must_name_a_loopback_host() {
        let loopback = Peer(Some(SocketAddr::from(([127, 0, 0, 1], 40_000))));
        let remote = Peer(Some(SocketAddr::from(([192, 0, 2, 1], 40_000))));
        assert!(rebound(loopback, &headers(&[("host", "rebound.example:8080")])));
        assert!(rebound(loopback, &HeaderMap::new()), "no Host");
        assert!(!rebound(loopback, &headers(&[("host", "localhost:8080")])));
        assert!(!rebound(remote, &headers(&[("host", "images.internal:8080")])), "another machine");
        assert!(rebound(Peer(None), &headers(&[("host", "rebound.example")])));
        let mapped = Peer(Some("[::ffff:127.0.0.1]:1".parse().unwrap()));
        assert!(rebound(mapped, &headers(&[("host", "rebound.example")])));
    }

    #[test]
    fn forwarded_headers_count_only_from_trusted_proxies() {
        let proxies: Vec<IpNet> = vec!["10.0.0.0/8".parse().unwrap()];
        let proxy = Peer(Some(SocketAddr::from(([10, 0, 0, 2], 1))));
        let stranger = Peer(Some(SocketAddr::from(([192, 0, 2, 9], 1))));
        let sent =
            headers(&[("x-forwarded-for", "203.0.113.66, 198.51.100.4, 10.0.0.3"), ("x-forwarded-proto", "https")]);
        assert_eq!(proxy.client_ip(&sent, &proxies), Some("198.51.100.4".parse().unwrap()), "the last untrusted hop");
        assert_eq!(stranger.client_ip(&sent, &proxies), Some("192.0.2.9".parse().unwrap()));
        assert_eq!(proxy.client_ip(&HeaderMap::new(), &proxies), Some("10.0.0.2".parse().unwrap()));
        let garbage_first = headers(&[("x-forwarded-for", "not-an-address, 198.51.100.4")]);
        assert_eq!(
            proxy.client_ip(&garbage_first, &proxies),
            Some("198.51.100.4".parse().unwrap()),
            "what the client wrote before the proxy's hop is not read"
        );
        assert!(proxy.forwarded_https(&sent, &proxies));
        assert!(!stranger.forwarded_https(&sent, &proxies));
        assert!(!proxy.forwarded_https(&sent, &[]), "no proxy trusted by default");
    }
}
