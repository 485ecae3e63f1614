//! The guarded client against a loopback fixture server. Every client here carries a dial check
//! that refuses (and records) any address beyond loopback, so no test can send a packet further.

use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use imagepipe_net::testing::{FixtureServer, LoopbackOnly, Route};
use imagepipe_net::{
    Blocked, FetchError, GuardedClient, Limits, Request, StaticResolver, TimeoutKind, header, redacted_url,
};

const LOOPBACK: &str = "127.0.0.1/32";

fn client(allow: &[&str], resolver: StaticResolver, limits: Limits) -> (GuardedClient, LoopbackOnly) {
    let dial = LoopbackOnly::new();
    let client = GuardedClient::builder()
        .allow(allow.iter().map(|net| net.parse().unwrap()))
        .resolver(resolver)
        .dial_check(dial.clone())
        .limits(limits)
        .build()
        .unwrap();
    (client, dial)
}

fn local(allow_loopback: bool) -> (GuardedClient, LoopbackOnly) {
    let allow: &[&str] = if allow_loopback { &[LOOPBACK] } else { &[] };
    let resolver = StaticResolver::new()
        .with("fixture.test", [IpAddr::V4(Ipv4Addr::LOCALHOST)])
        .with("evil.test", ["169.254.169.254".parse().unwrap()])
        .with("private.test", ["10.0.0.1".parse().unwrap()])
        .with("mixed.test", [IpAddr::V4(Ipv4Addr::LOCALHOST), "10.0.0.1".parse().unwrap()]);
    client(allow, resolver, Limits::default())
}

#[tokio::test]
async fn a_body_is_fetched_from_an_allowed_server() {
    let server =
        FixtureServer::start([("/a.bin", Route::ok("application/octet-stream", &b"hello"[..]))]).await.unwrap();
    let (client, dial) = local(true);
    let response = client.get(&server.url("/a.bin")).await.unwrap();
    assert_eq!(response.status, 200);
    assert_eq!(&response.body[..], b"hello");
    assert_eq!(response.final_url.as_str(), server.url("/a.bin"));
    assert!(dial.violations().is_empty());
}

#[tokio::test]
async fn a_name_is_resolved_through_the_injected_resolver() {
    let server = FixtureServer::start([("/a", Route::ok("text/plain", "via name"))]).await.unwrap();
    let (client, _) = local(true);
    let url = format!("http://fixture.test:{}/a", server.addr().port());
    let response = client.get(&url).await.unwrap();
    assert_eq!(&response.body[..], b"via name");
    assert_eq!(
        server.requests()[0].headers.iter().find(|(k, _)| k == "host").unwrap().1,
        format!("fixture.test:{}", server.addr().port())
    );
}

#[tokio::test]
async fn loopback_is_refused_unless_allowed() {
    let server = FixtureServer::start([("/a", Route::ok("text/plain", "secret"))]).await.unwrap();
    let (client, dial) = local(false);
    let err = client.get(&server.url("/a")).await.unwrap_err();
    assert!(matches!(err, FetchError::Refused { reason: Blocked::Loopback, .. }), "{err:?}");
    let by_name = format!("http://fixture.test:{}/a", server.addr().port());
    let err = client.get(&by_name).await.unwrap_err();
    assert!(matches!(err, FetchError::Refused { reason: Blocked::Loopback, .. }), "{err:?}");
    assert!(server.requests().is_empty(), "nothing reached the server");
    assert!(dial.violations().is_empty());
}

#[tokio::test]
async fn names_resolving_to_refused_addresses_are_refused_before_connecting() {
    let (client, dial) = local(true);
    for (url, reason) in [
        ("http://evil.test/latest/meta-data/", Blocked::Metadata),
        ("https://evil.test/", Blocked::Metadata),
        ("http://private.test:8080/", Blocked::Private),
        ("http://mixed.test/", Blocked::Private),
    ] {
        let err = client.get(url).await.unwrap_err();
        assert!(matches!(&err, FetchError::Refused { reason: r, .. } if *r == reason), "{url}: {err:?}");
        assert!(!err.is_retryable());
    }
    assert!(dial.violations().is_empty(), "the guard refused before the dial check: {:?}", dial.violations());
}

#[tokio::test]
async fn ip_literals_in_every_spelling_are_refused() {
    let (client, dial) = local(false);
    for url in [
        "http://169.254.169.254/latest/meta-data/",
        "http://[::ffff:169.254.169.254]/",
        "http://[fd00:ec2::254]/",
        "http://2852039166/",
        "http://0xa9fea9fe/",
        "http://127.1/",
        "http://[::1]:9/",
        "http://0.0.0.0:9/",
        "http://[64:ff9b::a9fe:a9fe]/",
    ] {
        let err = client.get(url).await.unwrap_err();
        assert!(matches!(err, FetchError::Refused { .. }), "{url}: {err:?}");
    }
    assert!(dial.violations().is_empty());
}

#[tokio::test]
async fn redirects_are_followed_and_each_hop_is_checked() {
    let server = FixtureServer::start([
        ("/start", Route::redirect("/middle")),
        ("/middle", Route::with_headers(307, &[("Location", "/end?x=1")])),
        ("/end", Route::ok("text/plain", "arrived")),
        ("/to-metadata", Route::redirect("http://169.254.169.254/latest/meta-data/iam/")),
        ("/to-evil-name", Route::redirect("http://evil.test/")),
        ("/to-ftp", Route::redirect("ftp://fixture.test/a")),
        ("/no-location", Route::status(302)),
    ])
    .await
    .unwrap();
    let (client, dial) = local(true);
    let response = client.get(&server.url("/start")).await.unwrap();
    assert_eq!((&response.body[..], response.redirects), (&b"arrived"[..], 2));
    assert_eq!(response.final_url.as_str(), server.url("/end?x=1"));

    let err = client.get(&server.url("/to-metadata")).await.unwrap_err();
    assert!(matches!(err, FetchError::Refused { reason: Blocked::Metadata, .. }), "{err:?}");
    let err = client.get(&server.url("/to-evil-name")).await.unwrap_err();
    assert!(matches!(err, FetchError::Refused { reason: Blocked::Metadata, .. }), "{err:?}");
    let err = client.get(&server.url("/to-ftp")).await.unwrap_err();
    assert!(matches!(&err, FetchError::Scheme { scheme, .. } if scheme == "ftp"), "{err:?}");
    let response = client.get(&server.url("/no-location")).await.unwrap();
    assert_eq!(response.status, 302, "a redirect without Location is the final response");
    assert!(dial.violations().is_empty());
}

#[tokio::test]
async fn a_redirect_to_loopback_is_refused_when_loopback_is_not_allowed() {
    let target = FixtureServer::start([("/secret", Route::ok("text/plain", "internal"))]).await.unwrap();
    // The entry server stands for a public host: only its own address is allowed.
    let entry_ip = Ipv4Addr::new(127, 0, 0, 2);
    let entry = FixtureServer::start_on(entry_ip, [("/go", Route::redirect(&target.url("/secret")))]).await.unwrap();
    let (client, dial) = client(&["127.0.0.2/32"], StaticResolver::new(), Limits::default());
    let err = client.get(&entry.url("/go")).await.unwrap_err();
    assert!(
        matches!(&err, FetchError::Refused { reason: Blocked::Loopback, addr, .. } if *addr == Ipv4Addr::LOCALHOST),
        "{err:?}"
    );
    assert_eq!(entry.requests().len(), 1);
    assert!(target.requests().is_empty(), "the redirect target was never contacted");

    let (client, _) = self::client(&["127.0.0.0/30"], StaticResolver::new(), Limits::default());
    assert_eq!(&client.get(&entry.url("/go")).await.unwrap().body[..], b"internal", "reached once allowed");
    assert!(dial.violations().is_empty());
}

#[tokio::test]
async fn the_redirect_limit_holds() {
    let server = FixtureServer::start([("/loop", Route::redirect("/loop"))]).await.unwrap();
    let limits = Limits { max_redirects: 3, ..Limits::default() };
    let (client, _) = client(&[LOOPBACK], StaticResolver::new(), limits);
    let err = client.get(&server.url("/loop")).await.unwrap_err();
    assert!(matches!(err, FetchError::TooManyRedirects { limit: 3, .. }), "{err:?}");
    assert_eq!(server.requests().len(), 4, "the first request and three redirects");
}

#[tokio::test]
async fn a_post_redirected_by_303_becomes_a_get_and_credentials_stay_with_their_origin() {
    let other = FixtureServer::start([("/landing", Route::ok("text/plain", "ok"))]).await.unwrap();
    let server = FixtureServer::start([
        ("/form", Route::with_headers(303, &[("Location", "/landing")])),
        ("/landing", Route::ok("text/plain", "ok")),
        ("/away", Route::with_headers(308, &[("Location", &other.url("/landing"))])),
    ])
    .await
    .unwrap();
    let (client, _) = local(true);
    let secret = header::HeaderValue::from_static("Bearer s3cret");
    let request = Request::post(server.url("/form"), "a=1").header(header::AUTHORIZATION, secret.clone());
    client.send(request).await.unwrap();
    let seen = server.requests();
    assert_eq!((seen[0].method.as_str(), &seen[0].body[..]), ("POST", &b"a=1"[..]));
    assert_eq!((seen[1].method.as_str(), seen[1].body.len()), ("GET", 0));
    assert!(seen[1].headers.iter().any(|(k, _)| k == "authorization"), "same origin keeps credentials");

    client.send(Request::post(server.url("/away"), "b=2").header(header::AUTHORIZATION, secret)).await.unwrap();
    let seen = other.requests();
    assert_eq!((seen[0].method.as_str(), &seen[0].body[..]), ("POST", &b"b=2"[..]), "308 keeps method and body");
    assert!(!seen[0].headers.iter().any(|(k, _)| k == "authorization"), "credentials do not cross origins");
}

#[tokio::test]
async fn a_declared_oversize_body_is_refused_before_reading() {
    let server = FixtureServer::start([("/big", Route::ok("image/png", vec![0u8; 2048]))]).await.unwrap();
    let limits = Limits { max_bytes: 1024, ..Limits::default() };
    let (client, _) = client(&[LOOPBACK], StaticResolver::new(), limits);
    let err = client.get(&server.url("/big")).await.unwrap_err();
    assert!(matches!(err, FetchError::TooLarge { limit: 1024, .. }), "{err:?}");
    assert!(!err.is_retryable());
}

#[tokio::test]
async fn an_endless_body_is_cut_off_once_it_passes_the_limit() {
    // No Content-Length and no end: only a limit enforced while streaming can return.
    let server = FixtureServer::start([("/endless", Route::Endless { chunk: vec![7u8; 8192].into() })]).await.unwrap();
    let limits = Limits { max_bytes: 100_000, ..Limits::default() };
    let (client, _) = client(&[LOOPBACK], StaticResolver::new(), limits);
    let err = client.get(&server.url("/endless")).await.unwrap_err();
    assert!(matches!(err, FetchError::TooLarge { limit: 100_000, .. }), "{err:?}");
}

#[tokio::test]
async fn a_slow_drip_runs_into_the_total_timeout() {
    // Every byte comes well within the read timeout: only the total timeout can end it.
    let drip = Route::Drip { declared: 1_000_000, every: Duration::from_millis(20) };
    let server = FixtureServer::start([("/drip", drip)]).await.unwrap();
    let limits = Limits {
        read_timeout: Duration::from_millis(200),
        total_timeout: Duration::from_millis(600),
        ..Limits::default()
    };
    let (client, _) = client(&[LOOPBACK], StaticResolver::new(), limits);
    let started = Instant::now();
    let err = client.get(&server.url("/drip")).await.unwrap_err();
    assert!(matches!(err, FetchError::Timeout { kind: TimeoutKind::Total, .. }), "{err:?}");
    assert!(err.is_retryable());
    let took = started.elapsed();
    assert!((limits.total_timeout..Duration::from_secs(5)).contains(&took), "{took:?}");
}

#[tokio::test]
async fn a_server_that_never_answers_runs_into_the_read_timeout() {
    let server = FixtureServer::start([("/silent", Route::Silent)]).await.unwrap();
    let limits = Limits { read_timeout: Duration::from_millis(300), ..Limits::default() };
    let (client, _) = client(&[LOOPBACK], StaticResolver::new(), limits);
    let started = Instant::now();
    let err = client.get(&server.url("/silent")).await.unwrap_err();
    let took = started.elapsed();
    assert!(
        matches!(err, FetchError::Timeout { kind: TimeoutKind::Read, after, .. } if after == limits.read_timeout),
        "{err:?}"
    );
    assert!(err.is_retryable());
    assert!(
        (limits.read_timeout..Duration::from_secs(5)).contains(&took),
        "{took:?}, total is {:?}",
        limits.total_timeout
    );
    assert_eq!(server.requests().len(), 1, "the request went out; the answer never came");
}

#[tokio::test]
async fn a_body_that_stalls_runs_into_the_read_timeout() {
    // One byte of the body, then nothing for an hour.
    let stall = Route::Drip { declared: 1_000, every: Duration::from_secs(3600) };
    let server = FixtureServer::start([("/stall", stall)]).await.unwrap();
    let limits = Limits { read_timeout: Duration::from_millis(300), ..Limits::default() };
    let (client, _) = client(&[LOOPBACK], StaticResolver::new(), limits);
    let started = Instant::now();
    let err = client.get(&server.url("/stall")).await.unwrap_err();
    assert!(matches!(err, FetchError::Timeout { kind: TimeoutKind::Read, .. }), "{err:?}");
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
}

#[test]
fn the_default_timeouts_nest() {
    let limits = Limits::default();
    assert!(limits.connect_timeout <= limits.total_timeout && limits.read_timeout <= limits.total_timeout);
}

#[tokio::test]
async fn error_statuses_come_back_with_their_headers_and_no_body() {
    let server = FixtureServer::start([(
        "/busy",
        Route::Respond { status: 503, headers: vec![("Retry-After".into(), "7".into())], body: "try later".into() },
    )])
    .await
    .unwrap();
    let (client, _) = local(true);
    let response = client.get(&server.url("/busy")).await.unwrap();
    assert_eq!(response.status, 503);
    assert_eq!(response.retry_after(std::time::SystemTime::now()), Some(Duration::from_secs(7)));
    assert!(response.body.is_empty());
    assert_eq!(client.get(&server.url("/missing")).await.unwrap().status, 404);
}

#[tokio::test]
async fn connection_and_resolution_failures_are_retryable() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let closed = listener.local_addr().unwrap();
    drop(listener);
    let (client, _) = local(true);
    let err = client.get(&format!("http://{closed}/")).await.unwrap_err();
    assert!(matches!(err, FetchError::Connect { .. }), "{err:?}");
    assert!(err.is_retryable());
    let err = client.get("http://unknown.test/").await.unwrap_err();
    assert!(matches!(err, FetchError::Resolve { .. }), "{err:?}");
    assert!(err.is_retryable());
}

#[tokio::test]
async fn unusable_urls_are_refused_and_passwords_never_shown() {
    let (client, _) = local(true);
    for url in ["not a url", "file:///etc/passwd", "gopher://fixture.test/"] {
        let err = client.get(url).await.unwrap_err();
        assert!(matches!(err, FetchError::InvalidUrl { .. } | FetchError::Scheme { .. }), "{url}: {err:?}");
    }
    let err = client.get("http://user:hunter2@evil.test/").await.unwrap_err();
    assert!(!err.to_string().contains("hunter2"), "{err}");
}

#[tokio::test]
async fn urls_in_errors_keep_only_scheme_host_and_path() {
    let (client, _) = local(true);
    let err = client.get("http://alice:hunter2@evil.test/latest/x.jpg?X-Amz-Signature=s3cr3t#frag").await.unwrap_err();
    let message = err.to_string();
    assert!(message.starts_with("http://evil.test/latest/x.jpg: "), "{message}");
    let err = client.get("http://alice:hunter2@exa mple.test/x.jpg?token=s3cr3t").await.unwrap_err();
    assert!(matches!(err, FetchError::InvalidUrl { .. }), "{err:?}");
    for message in [message, err.to_string()] {
        for secret in ["alice", "hunter2", "s3cr3t", "Signature", "token", "frag"] {
            assert!(!message.contains(secret), "{secret} in {message}");
        }
    }
    let url = "https://bob:pw@images.test:8443/a/b.png?sig=1#top".parse().unwrap();
    assert_eq!(redacted_url(&url), "https://images.test:8443/a/b.png");
}

#[tokio::test]
async fn a_refusal_names_the_setting_that_allows_the_address() {
    let setting = "download.allow_cidrs (IMAGEPIPE_DOWNLOAD__ALLOW_CIDRS)";
    let resolver = StaticResolver::new().with("intranet.test", ["10.1.2.3".parse().unwrap()]);
    let client = GuardedClient::builder()
        .resolver(resolver)
        .dial_check(LoopbackOnly::new())
        .allowlist_setting(setting)
        .build()
        .unwrap();
    for (url, entry) in [("http://intranet.test/a.jpg", "10.1.2.3/32"), ("http://[::1]/a.jpg", "::1/128")] {
        let err = client.get(url).await.unwrap_err();
        assert!(matches!(&err, FetchError::Refused { allowlist_setting: Some(s), .. } if s == setting), "{err:?}");
        assert!(err.to_string().ends_with(&format!("; to reach it anyway, add {entry} to {setting}")), "{err}");
    }
    let (plain, _) = local(false);
    let err = plain.get("http://127.0.0.1/").await.unwrap_err();
    assert!(err.to_string().ends_with("which is not allowed"), "no setting, no hint: {err}");
}

#[tokio::test]
async fn the_dial_check_is_the_last_word() {
    // A client whose allowlist wrongly admits a remote range still never dials it in tests.
    let resolver = StaticResolver::new().with("remote.test", ["93.184.216.34".parse().unwrap()]);
    let (client, dial) = client(&[], resolver, Limits::default());
    let err = client.get("http://remote.test/").await.unwrap_err();
    assert!(matches!(err, FetchError::DialRefused { .. }), "{err:?}");
    let err = client.get("https://93.184.216.35/").await.unwrap_err();
    assert!(matches!(err, FetchError::DialRefused { .. }), "an IP literal passes the dial check too: {err:?}");
    let expected: Vec<IpAddr> = ["93.184.216.34".parse().unwrap(), "93.184.216.35".parse().unwrap()].into();
    assert_eq!(dial.violations(), expected);
}
