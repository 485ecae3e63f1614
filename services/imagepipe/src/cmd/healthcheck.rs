//! `imagepipe healthcheck [--url URL]`: probes a service's `/readyz` and exits 0 only on
//! `200 OK`, so a container health check needs no curl in the image.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use imagepipe_runtime::ConfigArgs;
use reqwest::StatusCode;
use reqwest::redirect::Policy;

/// Options of `imagepipe healthcheck`.
#[derive(Debug, Args)]
pub struct HealthcheckArgs {
    /// URL to probe [default: `http://127.0.0.1:<http.port>/readyz` of the effective
    /// configuration].
    #[arg(long)]
    url: Option<String>,
    /// Longest wait for the answer, in seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = 5)]
    timeout: u64,
}

/// What the probed URL answered.
#[derive(Debug, PartialEq, Eq)]
enum Probe {
    /// `200 OK`.
    Ready,
    /// Any other status, with the start of the body (`/readyz` names the failing checks).
    NotReady { status: StatusCode, body: String },
}

/// Longest part of a non-200 body repeated in the message.
const BODY_LIMIT: usize = 500;

/// Probes the URL: exit 0 on `200 OK`, 1 with a one-line reason otherwise.
pub async fn run(config: &ConfigArgs, args: HealthcheckArgs) -> anyhow::Result<ExitCode> {
    let url = match args.url {
        Some(url) => url,
        None => readyz_url(config.load().context("loading the configuration")?.http.port),
    };
    match probe(&url, Duration::from_secs(args.timeout)).await? {
        Probe::Ready => Ok(ExitCode::SUCCESS),
        Probe::NotReady { status, body } => {
            eprintln!("imagepipe healthcheck: GET {url}: {status}: {body}");
            Ok(ExitCode::FAILURE)
        }
    }
}

/// `/readyz` of the service on this host listening on `port`.
fn readyz_url(port: u16) -> String {
    format!("http://127.0.0.1:{port}/readyz")
}

/// One GET without proxies or redirects: only the URL's own `200` counts.
async fn probe(url: &str, timeout: Duration) -> anyhow::Result<Probe> {
    let client = reqwest::Client::builder().timeout(timeout).no_proxy().redirect(Policy::none()).build()?;
    let response = client.get(url).send().await.with_context(|| format!("GET {url}"))?;
    let status = response.status();
    if status == StatusCode::OK {
        return Ok(Probe::Ready);
    }
    let body = response.text().await.unwrap_or_default();
    let body = body.trim().chars().take(BODY_LIMIT).collect();
    Ok(Probe::NotReady { status, body })
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, SocketAddr};

    use axum::Router;
    use axum::http::StatusCode as AxumStatus;
    use axum::response::Redirect;
    use axum::routing::get;

    use super::*;

    /// Serves `/readyz` (200), `/draining` (503 naming a check) and `/moved` (a redirect to
    /// `/readyz`) on a free loopback port; answers its address.
    async fn server() -> SocketAddr {
        let app = Router::new()
            .route("/readyz", get(|| async { "ready\n" }))
            .route("/draining", get(|| async { (AxumStatus::SERVICE_UNAVAILABLE, "not ready: bus\n") }))
            .route("/moved", get(|| async { Redirect::temporary("/readyz") }));
        let listener = tokio::net::TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0))).await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        addr
    }

    #[tokio::test]
    async fn only_the_urls_own_200_is_ready() {
        let addr = server().await;
        let timeout = Duration::from_secs(5);
        assert_eq!(probe(&format!("http://{addr}/readyz"), timeout).await.unwrap(), Probe::Ready);
        assert_eq!(
            probe(&format!("http://{addr}/draining"), timeout).await.unwrap(),
            Probe::NotReady { status: StatusCode::SERVICE_UNAVAILABLE, body: "not ready: bus".into() }
        );
        let moved = probe(&format!("http://{addr}/moved"), timeout).await.unwrap();
        assert!(matches!(moved, Probe::NotReady { status: StatusCode::TEMPORARY_REDIRECT, .. }), "{moved:?}");
    }

    #[tokio::test]
    async fn a_closed_port_is_an_error_naming_the_url() {
        let listener = std::net::TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0))).unwrap();
        let url = format!("http://{}/readyz", listener.local_addr().unwrap());
        drop(listener);
        let err = probe(&url, Duration::from_secs(5)).await.unwrap_err();
        assert!(format!("{err:#}").contains(&url), "{err:#}");
    }

    #[tokio::test]
    async fn without_url_it_probes_readyz_on_the_configured_http_port() {
        let addr = server().await;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("imagepipe.toml");
        std::fs::write(&file, format!("[http]\nport = {}\n", addr.port())).unwrap();
        let config = ConfigArgs { config: Some(file) };

        let code = run(&config, HealthcheckArgs { url: None, timeout: 5 }).await.unwrap();
        assert_eq!(code, ExitCode::SUCCESS);
        let draining = HealthcheckArgs { url: Some(format!("http://{addr}/draining")), timeout: 5 };
        assert_eq!(run(&config, draining).await.unwrap(), ExitCode::FAILURE);
    }
}
