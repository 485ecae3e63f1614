//! What a test does when its environment is missing (a server's URL, a prepared model): it
//! fails with the reason, so a plain `cargo nextest run` never counts a test that tested
//! nothing as passed. With `IMAGEPIPE_TEST_ALLOW_SKIP=1` it prints `SKIPPED <test>: <reason>`
//! to stderr instead and returns early. `scripts/test.sh` provides every test's environment
//! and never allows a skip.

/// The variable that lets tests whose environment is missing skip (`1`) instead of failing.
pub const ALLOW_SKIP_ENV: &str = "IMAGEPIPE_TEST_ALLOW_SKIP";

/// Whether `IMAGEPIPE_TEST_ALLOW_SKIP=1` is set.
pub fn skipping_allowed() -> bool {
    std::env::var(ALLOW_SKIP_ENV).is_ok_and(|value| value == "1")
}

/// The calling test's environment is missing, for `reason` (which says how to provide it):
/// panics with it, or, when skipping is allowed, prints `SKIPPED <test>: <reason>` and returns
/// so that the caller can skip what it cannot test.
#[track_caller]
pub fn environment_missing(reason: &str) {
    if !skipping_allowed() {
        panic!("{reason}\n(scripts/test.sh provides it; {ALLOW_SKIP_ENV}=1 skips such tests instead of failing them)");
    }
    let thread = std::thread::current();
    eprintln!("SKIPPED {}: {reason}", thread.name().unwrap_or("a test"));
}

/// The variable naming the single Redis server of the tests (default `redis://127.0.0.1:6379`,
/// which scripts/redis.sh starts).
pub const REDIS_URL_ENV: &str = "IMAGEPIPE_TEST_REDIS_URL";

/// The variable naming the Redis Cluster of the tests (scripts/redis-cluster.sh starts one and
/// sets it to `redis+cluster://127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003`).
pub const REDIS_CLUSTER_URL_ENV: &str = "IMAGEPIPE_TEST_REDIS_CLUSTER_URL";

/// The single Redis server of the tests: `IMAGEPIPE_TEST_REDIS_URL`, else `redis://127.0.0.1:6379`.
pub fn redis_url() -> String {
    std::env::var(REDIS_URL_ENV).unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

/// The Redis deployments a test of a Redis backend runs on, named (`"redis"`, `"cluster"`):
/// the single server ([`redis_url`]) and the cluster of `IMAGEPIPE_TEST_REDIS_CLUSTER_URL`.
/// Without that variable the cluster is missing ([`environment_missing`]: the test fails, or
/// with skipping allowed runs on the single server only).
#[track_caller]
pub fn redis_urls() -> Vec<(&'static str, String)> {
    let mut urls = vec![("redis", redis_url())];
    match std::env::var(REDIS_CLUSTER_URL_ENV) {
        Ok(url) => urls.push(("cluster", url)),
        Err(_) => environment_missing(&format!(
            "the Redis Cluster is not running: {REDIS_CLUSTER_URL_ENV} is not set \
             (source scripts/redis-cluster.sh; ensure_redis_cluster)"
        )),
    }
    urls
}

/// The variable naming the Python of the contract tools' venv (the CloudEvents SDK and
/// jsonschema), which `scripts/contract-tools.sh` (`ensure_contract_tools`) sets up and exports.
pub const CONTRACT_PYTHON_ENV: &str = "IMAGEPIPE_TEST_CONTRACT_PYTHON";

/// The Python of the contract tools ([`CONTRACT_PYTHON_ENV`]); `None` after
/// [`environment_missing`] when it is not set (the test fails, or skips when allowed).
#[track_caller]
pub fn contract_python() -> Option<std::path::PathBuf> {
    match std::env::var_os(CONTRACT_PYTHON_ENV) {
        Some(python) => Some(python.into()),
        None => {
            environment_missing(&format!(
                "the contract tools are not installed: {CONTRACT_PYTHON_ENV} is not set \
                 (source scripts/contract-tools.sh; ensure_contract_tools)"
            ));
            None
        }
    }
}

/// Runs `scripts/contract_check.py` (from the workspace root `root`) with the contract tools'
/// `python` and `args`; panics with its output when a check fails.
#[track_caller]
pub fn run_contract_check(python: &std::path::Path, root: &std::path::Path, args: &[&std::ffi::OsStr]) {
    let script = root.join("scripts").join("contract_check.py");
    let output = std::process::Command::new(python)
        .arg(&script)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running {} {}: {e}", python.display(), script.display()));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{} failed ({}):\n{stdout}{stderr}", script.display(), output.status);
    eprint!("{stdout}");
}

/// The loopback ports [`spare_port`] picks from: below Linux's ephemeral range (32768–60999 by
/// default), so no outgoing connection of any process takes one between the pick and the bind,
/// and above SeaweedFS's gRPC ports (its HTTP ports + 10000).
const SPARE_PORTS: std::ops::Range<u16> = 20_000..32_768;

/// A loopback port nothing listens on now, for a process a test starts to bind: a random one
/// below the ephemeral range. A port the OS hands out for `:0` is an ephemeral one, and another
/// process's outgoing connection can take it before the child binds it (CI saw a coordinator
/// fail with "Address already in use" on one).
pub fn spare_port() -> std::io::Result<u16> {
    use std::hash::{BuildHasher, Hasher};
    let span = u64::from(SPARE_PORTS.end - SPARE_PORTS.start);
    let mut last_error = None;
    for attempt in 0u64..64 {
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        hasher.write_u64(attempt);
        let port = SPARE_PORTS.start + (hasher.finish() % span) as u16;
        match std::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, port)) {
            Ok(_) => return Ok(port),
            Err(e) => last_error = Some(e),
        }
    }
    Err(last_error.expect("64 attempts"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spare_port_is_below_the_ephemeral_range_and_free() {
        for _ in 0..20 {
            let port = spare_port().unwrap();
            assert!(SPARE_PORTS.contains(&port), "{port}");
            std::net::TcpListener::bind(("127.0.0.1", port)).expect("free to bind");
        }
    }
}
