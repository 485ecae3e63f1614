//! The one connection every Redis user of imagepipe holds: [`RedisConnection`], a single server
//! (a [`ConnectionManager`], which reconnects) or a Redis Cluster (a [`ClusterConnection`],
//! which follows `MOVED`/`ASK` redirections and retries through a failover), opened from the
//! URL of `store.redis.url` by [`RedisConnection::open`]:
//!
//! - `redis://[[user]:password@]host[:port][/db]` (or `rediss://` for TLS): one server;
//! - `redis+cluster://[[user]:password@]host:port[,host:port...]` (or `rediss+cluster://`): a
//!   cluster, reached through the seed nodes listed (one is enough, the client discovers the
//!   rest; list several so that one being down does not stop a start).
//!
//! Both run every command and pipeline through [`ConnectionLike`], so callers do not care
//! which it is, with one rule: in a cluster a command's keys, a script's `KEYS` and an atomic
//! pipeline's (`MULTI`) keys must share one hash slot (keys with the same `{tag}`). A
//! non-atomic pipeline may span slots: [`RedisConnection`] splits it per slot (the cluster
//! client refuses it whole), runs the commands without one slot first, then the parts per
//! slot concurrently, and puts the replies back in order: only commands of the same slot keep
//! their relative order. Commands that span nodes (`KEYS`,
//! `SCRIPT LOAD`, a `DEL` of several slots) are sent to every node they concern by the cluster
//! client; `SCAN` is not, so [`RedisConnection::scan_match`] iterates every primary.
//!
//! A cluster connection whose request times out in all ([`CLUSTER_OVERALL_TIMEOUT`]) is
//! replaced by a new one, built from the seed nodes in the background ([`ClusterLink`]): the
//! cluster client can wedge after a failover (seen: one of three coordinators whose every
//! request timed out for minutes after its primary was killed, while the other two, on the
//! same cluster, carried on), and a client that never recovers is worse than a reconnection.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use futures::future::try_join_all;
use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, Slot, SlotAddr};
use redis::{Cmd, ErrorKind, Pipeline, RedisError, RedisFuture, RedisResult, Value};

/// How many times the cluster client retries a command that met a redirection, a node that
/// failed or a cluster that is failing over (with [`CLUSTER_MAX_RETRY_WAIT`] between the last
/// ones): about 15 s in all, longer than a failover takes with the default `cluster-node-timeout`
/// of 15 s minus the detection already elapsed. A transition retried after it was applied is a
/// no-op (its compare-and-set fails), so retrying is safe.
pub const CLUSTER_RETRIES: u32 = 12;

/// The longest wait between two retries of the cluster client, in milliseconds (the first
/// waits are shorter: 20 ms, doubling).
pub const CLUSTER_MAX_RETRY_WAIT: u64 = 2_000;

/// How long the cluster client waits for a node to accept a connection.
pub const CLUSTER_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// How long the cluster client waits for one node's answer to one attempt. Without it, a
/// request sent while a node fails over can wait for ever (seen: a coordinator whose every
/// store call hung after its primary was killed and started again as a replica); with it,
/// the attempt fails and is retried like any other failure.
pub const CLUSTER_RESPONSE_TIMEOUT: Duration = Duration::from_secs(5);

/// How long one request may take in all, retries, reconnections and redirections included:
/// longer than the retries take ([`CLUSTER_RETRIES`]), so that a failover is ridden out.
pub const CLUSTER_OVERALL_TIMEOUT: Duration = Duration::from_secs(30);

/// The URL schemes that name a cluster, each with the scheme of its nodes.
const CLUSTER_SCHEMES: [(&str, &str); 2] = [("redis+cluster://", "redis://"), ("rediss+cluster://", "rediss://")];

/// A connection to a Redis server or a Redis Cluster (the module's docs). Cloning is cheap and
/// shares the connection.
#[derive(Clone)]
pub enum RedisConnection {
    /// One server (`redis://`, `rediss://`).
    Single(ConnectionManager),
    /// A cluster (`redis+cluster://`, `rediss+cluster://`).
    Cluster(ClusterLink),
}

/// A cluster connection that replaces itself when a request times out in all (the module's
/// docs): requests run on the current connection; the first to time out on it starts one
/// rebuild in the background, and the requests after it run on the new connection. Cloning is
/// cheap and shares the connection.
#[derive(Clone)]
pub struct ClusterLink(Arc<LinkState>);

struct LinkState {
    client: ClusterClient,
    /// The connection and its generation (how many times it was rebuilt).
    current: RwLock<(u64, ClusterConnection)>,
    /// Held by the one rebuild running.
    rebuilding: tokio::sync::Mutex<()>,
}

impl ClusterLink {
    async fn open(client: ClusterClient) -> RedisResult<Self> {
        let conn = client.get_async_connection().await?;
        Ok(Self(Arc::new(LinkState {
            client,
            current: RwLock::new((0, conn)),
            rebuilding: tokio::sync::Mutex::new(()),
        })))
    }

    /// The connection now, and its generation.
    fn current(&self) -> (u64, ClusterConnection) {
        let current = self.0.current.read().unwrap_or_else(std::sync::PoisonError::into_inner);
        (current.0, current.1.clone())
    }

    /// How many times the connection was rebuilt.
    #[must_use]
    pub fn generation(&self) -> u64 {
        self.current().0
    }

    /// Runs `request` on the current connection; when it times out, rebuilds the connection
    /// in the background (once per generation) and returns the error.
    async fn run<T, F, Fut>(&self, request: F) -> RedisResult<T>
    where
        F: FnOnce(ClusterConnection) -> Fut,
        Fut: Future<Output = RedisResult<T>>,
    {
        let (generation, conn) = self.current();
        let result = request(conn).await;
        if let Err(e) = &result
            && e.is_timeout()
        {
            let link = self.clone();
            tokio::spawn(async move { link.rebuild(generation).await });
        }
        result
    }

    /// Replaces generation `generation` of the connection with a new one from the seed nodes,
    /// unless a rebuild is running or another one already did; a rebuild that fails leaves the
    /// connection as it is (the next timeout tries again).
    async fn rebuild(&self, generation: u64) {
        let Ok(_one) = self.0.rebuilding.try_lock() else { return };
        if self.generation() != generation {
            return;
        }
        match tokio::time::timeout(CLUSTER_OVERALL_TIMEOUT, self.0.client.get_async_connection()).await {
            Ok(Ok(conn)) => {
                let mut current = self.0.current.write().unwrap_or_else(std::sync::PoisonError::into_inner);
                *current = (generation + 1, conn);
                tracing::warn!(
                    generation = generation + 1,
                    "Redis Cluster connection rebuilt after a request timed out"
                );
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "Redis Cluster connection not rebuilt; trying again at the next timeout")
            }
            Err(_) => tracing::warn!("Redis Cluster connection not rebuilt in time; trying again at the next timeout"),
        }
    }
}

impl RedisConnection {
    /// Connects to `url` (the forms in the module's docs). Fails when the URL is malformed or
    /// no server (no seed node) answers.
    pub async fn open(url: &str) -> RedisResult<Self> {
        match cluster_nodes(url)? {
            None => {
                let client = redis::Client::open(url)?;
                Ok(Self::Single(ConnectionManager::new(client).await?))
            }
            Some(nodes) => {
                let client = ClusterClientBuilder::new(nodes)
                    .retries(CLUSTER_RETRIES)
                    .max_retry_wait(CLUSTER_MAX_RETRY_WAIT)
                    .connection_timeout(CLUSTER_CONNECT_TIMEOUT)
                    .response_timeout(CLUSTER_RESPONSE_TIMEOUT)
                    .overall_response_timeout(Some(CLUSTER_OVERALL_TIMEOUT))
                    .build()?;
                Ok(Self::Cluster(ClusterLink::open(client).await?))
            }
        }
    }

    /// Whether this is a cluster connection.
    #[must_use]
    pub fn is_cluster(&self) -> bool {
        matches!(self, Self::Cluster(_))
    }

    /// Waits until `replicas` replicas acknowledged every write this connection sent to the
    /// server, in a cluster to the primary of each of `keys`' slots (one `WAIT` per primary,
    /// concurrently), at most `timeout` each. Returns the fewest replicas that acknowledged,
    /// so less than `replicas` when the timeout ran out first. With `keys` empty or `replicas`
    /// 0 it returns `replicas` without asking.
    pub async fn wait_replicas(&self, keys: &[&str], replicas: u32, timeout: Duration) -> RedisResult<u32> {
        if replicas == 0 || keys.is_empty() {
            return Ok(replicas);
        }
        let mut wait = redis::cmd("WAIT");
        wait.arg(replicas).arg(timeout.as_millis() as u64);
        match self {
            Self::Single(conn) => wait.query_async(&mut conn.clone()).await,
            Self::Cluster(link) => {
                let slots: HashSet<Slot> = keys.iter().map(Slot::for_key).collect();
                let acks = try_join_all(slots.into_iter().map(|slot| {
                    let wait = wait.clone();
                    link.run(async move |mut conn| {
                        let route = SingleNodeRoutingInfo::SpecificNode(Route::with_slot(slot, SlotAddr::Master));
                        let acked = conn.route_command(wait, RoutingInfo::SingleNode(route)).await?;
                        redis::from_redis_value::<u32>(acked).map_err(RedisError::from)
                    })
                }))
                .await?;
                Ok(acks.into_iter().min().unwrap_or(replicas))
            }
        }
    }

    /// Every key matching `pattern` (`SCAN ... MATCH`), on every primary of a cluster. Keys
    /// written or deleted during the scan may or may not be listed; none is listed twice by
    /// one node.
    pub async fn scan_match(&self, pattern: &str, count: usize) -> RedisResult<Vec<String>> {
        match self {
            Self::Single(conn) => {
                scan_node(pattern, count, |cmd| {
                    let mut conn = conn.clone();
                    async move { cmd.query_async(&mut conn).await }
                })
                .await
            }
            Self::Cluster(link) => {
                let mut keys = Vec::new();
                for (host, port) in link.run(async |conn| primaries(&conn).await).await? {
                    let node = scan_node(pattern, count, |cmd| {
                        let route = SingleNodeRoutingInfo::ByAddress { host: host.clone(), port };
                        link.run(async move |mut conn| {
                            redis::from_redis_value(conn.route_command(cmd, RoutingInfo::SingleNode(route)).await?)
                                .map_err(RedisError::from)
                        })
                    })
                    .await?;
                    keys.extend(node);
                }
                Ok(keys)
            }
        }
    }
}

/// `SCAN`s one node to the end: `send` runs each `SCAN` command on it.
async fn scan_node<F, Fut>(pattern: &str, count: usize, send: F) -> RedisResult<Vec<String>>
where
    F: Fn(Cmd) -> Fut,
    Fut: Future<Output = RedisResult<(u64, Vec<String>)>>,
{
    let mut keys = Vec::new();
    let mut cursor = 0u64;
    loop {
        let mut scan = redis::cmd("SCAN");
        scan.arg(cursor).arg("MATCH").arg(pattern).arg("COUNT").arg(count);
        let (next, batch) = send(scan).await?;
        keys.extend(batch);
        if next == 0 {
            return Ok(keys);
        }
        cursor = next;
    }
}

/// The address of every primary of the cluster, from `CLUSTER NODES` (lines
/// `<id> <ip:port@cport[,hostname]> <flags> ...`; a primary's flags hold `master`, a failed
/// one's `fail`).
async fn primaries(conn: &ClusterConnection) -> RedisResult<Vec<(String, u16)>> {
    let nodes: String = redis::cmd("CLUSTER").arg("NODES").query_async(&mut conn.clone()).await?;
    let mut found = Vec::new();
    for line in nodes.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (Some(address), Some(flags)) = (fields.get(1), fields.get(2)) else { continue };
        let flags: Vec<&str> = flags.split(',').collect();
        if !flags.contains(&"master") || flags.iter().any(|f| f.starts_with("fail")) {
            continue;
        }
        let address = address.split(['@', ',']).next().unwrap_or_default();
        let parsed = address.rsplit_once(':').and_then(|(host, port)| Some((host.to_owned(), port.parse().ok()?)));
        let Some((host, port)) = parsed else {
            return Err(invalid(format!("CLUSTER NODES lists a node at {address:?}, not host:port")));
        };
        found.push((host, port));
    }
    if found.is_empty() {
        return Err(invalid("CLUSTER NODES lists no primary that is up".into()));
    }
    Ok(found)
}

/// The node URLs of a cluster URL (`redis+cluster://`), or `None` for any other URL. The
/// credentials and path of the cluster URL apply to every node.
fn cluster_nodes(url: &str) -> RedisResult<Option<Vec<String>>> {
    let Some((rest, node_scheme)) = CLUSTER_SCHEMES.iter().find_map(|(s, n)| Some((url.strip_prefix(s)?, *n))) else {
        return Ok(None);
    };
    let (authority, path) = rest.split_once(['/', '?']).map_or((rest, ""), |(a, _)| (a, &rest[a.len()..]));
    let (credentials, hosts) = authority.rsplit_once('@').map_or(("", authority), |(c, h)| (c, h));
    let nodes: Vec<String> = hosts
        .split(',')
        .map(str::trim)
        .filter(|h| !h.is_empty())
        .map(|host| {
            let at = if credentials.is_empty() { String::new() } else { format!("{credentials}@") };
            format!("{node_scheme}{at}{host}{path}")
        })
        .collect();
    if nodes.is_empty() {
        return Err(invalid(format!(
            "the cluster URL names no node (expected {node_scheme}+cluster://host:port[,host:port...])"
        )));
    }
    Ok(Some(nodes))
}

fn invalid(message: String) -> RedisError {
    RedisError::from((ErrorKind::InvalidClientConfig, "invalid Redis cluster", message))
}

/// The key a command is routed by (its first key), or `None` for a command without keys or
/// with keys in several slots (sent alone, the cluster client routes it).
fn routing_key(cmd: &Cmd) -> Option<&[u8]> {
    let args: Vec<&[u8]> = cmd
        .args_iter()
        .map(|a| match a {
            redis::Arg::Simple(bytes) => bytes,
            _ => b"0".as_slice(),
        })
        .collect();
    let name = args.first()?.to_ascii_uppercase();
    let numkeys = |at: usize| std::str::from_utf8(args.get(at)?).ok()?.parse::<usize>().ok();
    match name.as_slice() {
        b"EVAL" | b"EVALSHA" | b"EVAL_RO" | b"EVALSHA_RO" | b"FCALL" | b"FCALL_RO" => {
            (numkeys(2)? > 0).then(|| args.get(3).copied()).flatten()
        }
        b"XREAD" | b"XREADGROUP" => {
            let streams = args.iter().position(|a| a.eq_ignore_ascii_case(b"STREAMS"))?;
            args.get(streams + 1).copied()
        }
        b"DEL" | b"UNLINK" | b"EXISTS" | b"TOUCH" | b"MGET" if args.len() > 2 => None,
        b"MSET" | b"MSETNX" if args.len() > 3 => None,
        b"SCRIPT" | b"WAIT" | b"PING" | b"INFO" | b"CLUSTER" | b"CONFIG" | b"CLIENT" | b"SCAN" | b"KEYS"
        | b"DBSIZE" | b"FLUSHDB" | b"FLUSHALL" | b"TIME" | b"MULTI" | b"EXEC" => None,
        _ => args.get(1).copied(),
    }
}

/// Whether `cmd` is the command `name` (upper case).
fn is_named(cmd: &Cmd, name: &[u8]) -> bool {
    matches!(cmd.args_iter().next(), Some(redis::Arg::Simple(first)) if first.eq_ignore_ascii_case(name))
}

/// Runs a non-atomic `pipeline` on a cluster: first the commands without a single slot (a
/// `SCRIPT LOAD`, a `DEL` over several slots), concurrently, then one pipeline per slot,
/// concurrently (a `MULTI` ... `EXEC` block in it whole, in the slot of its first key); the
/// replies in the pipeline's order.
async fn split_pipeline(conn: &ClusterConnection, pipeline: &Pipeline) -> RedisResult<Vec<Value>> {
    let mut parts: HashMap<Slot, (Pipeline, Vec<usize>)> = HashMap::new();
    let mut alone: Vec<usize> = Vec::new();
    let commands: Vec<&Cmd> = pipeline.cmd_iter().collect();
    let mut at = 0;
    while at < commands.len() {
        // A `MULTI` ... `EXEC` block inside the pipeline goes whole to the slot of its first key.
        let end = if is_named(commands[at], b"MULTI") {
            commands[at..].iter().position(|c| is_named(c, b"EXEC")).map_or(at, |exec| at + exec)
        } else {
            at
        };
        match commands[at..=end].iter().find_map(|cmd| routing_key(cmd)) {
            Some(key) => {
                let (part, places) = parts.entry(Slot::for_key(key)).or_insert_with(|| (Pipeline::new(), Vec::new()));
                for (place, cmd) in commands.iter().enumerate().take(end + 1).skip(at) {
                    part.add_command((*cmd).clone());
                    places.push(place);
                }
            }
            None => alone.extend(at..=end),
        }
        at = end + 1;
    }
    if alone.is_empty() && parts.len() == 1 {
        return conn.clone().req_packed_commands(pipeline, 0, pipeline.len()).await;
    }
    let grouped = try_join_all(parts.into_values().map(|(part, places)| {
        let mut conn = conn.clone();
        async move { Ok::<_, RedisError>((conn.req_packed_commands(&part, 0, part.len()).await?, places)) }
    }));
    let single = try_join_all(alone.into_iter().map(|at| {
        let mut conn = conn.clone();
        let cmd = commands[at];
        async move { Ok::<_, RedisError>((vec![conn.req_packed_command(cmd).await?], vec![at])) }
    }));
    let single = single.await?;
    let grouped = grouped.await?;
    let mut replies: Vec<Option<Value>> = vec![None; commands.len()];
    for (values, places) in single.into_iter().chain(grouped) {
        if values.len() != places.len() {
            return Err(invalid(format!("a pipeline of {} commands got {} replies", places.len(), values.len())));
        }
        for (value, at) in values.into_iter().zip(places) {
            replies[at] = Some(value);
        }
    }
    Ok(replies.into_iter().map(|r| r.unwrap_or(Value::Nil)).collect())
}

impl ConnectionLike for RedisConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Single(conn) => conn.req_packed_command(cmd),
            Self::Cluster(link) => Box::pin(link.run(async move |mut conn| conn.req_packed_command(cmd).await)),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Single(conn) => conn.req_packed_commands(pipeline, offset, count),
            Self::Cluster(link) => Box::pin(link.run(async move |mut conn| {
                if pipeline.is_transaction() {
                    conn.req_packed_commands(pipeline, offset, count).await
                } else {
                    split_pipeline(&conn, pipeline).await
                }
            })),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Single(conn) => conn.get_db(),
            Self::Cluster(link) => link.current().1.get_db(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cluster_url_names_its_nodes_with_the_credentials_and_path_of_each() {
        assert_eq!(cluster_nodes("redis://127.0.0.1:6379").unwrap(), None);
        assert_eq!(
            cluster_nodes("redis+cluster://127.0.0.1:7001,127.0.0.1:7002").unwrap(),
            Some(vec!["redis://127.0.0.1:7001".to_owned(), "redis://127.0.0.1:7002".to_owned()])
        );
        assert_eq!(
            cluster_nodes("rediss+cluster://u:p%40w@a:1,b:2/0?protocol=resp3").unwrap(),
            Some(vec![
                "rediss://u:p%40w@a:1/0?protocol=resp3".to_owned(),
                "rediss://u:p%40w@b:2/0?protocol=resp3".to_owned()
            ])
        );
        let empty = cluster_nodes("redis+cluster://").unwrap_err();
        assert!(empty.to_string().contains("names no node"), "{empty}");
    }

    /// The cluster of the tests, or `None` (after [`environment_missing`]) without one.
    ///
    /// [`environment_missing`]: imagepipe_contracts::testing::environment_missing
    async fn cluster() -> Option<RedisConnection> {
        let (_, url) = imagepipe_contracts::testing::redis_urls().into_iter().find(|(name, _)| *name == "cluster")?;
        let conn = RedisConnection::open(&url).await.unwrap_or_else(|e| panic!("Redis Cluster at {url}: {e}"));
        assert!(conn.is_cluster());
        Some(conn)
    }

    #[tokio::test]
    async fn a_pipeline_over_many_slots_answers_in_order_and_a_scan_sees_every_primary() {
        let Some(mut conn) = cluster().await else { return };
        let prefix = format!("test-conn-{}", uuid::Uuid::new_v4().simple());
        let keys: Vec<String> = (0..64).map(|i| format!("{prefix}:{i}")).collect();
        let mut pipe = redis::pipe();
        for (i, key) in keys.iter().enumerate() {
            pipe.cmd("SET").arg(key).arg(i).arg("PX").arg(60_000).ignore().cmd("INCR").arg(key);
        }
        pipe.cmd("SCRIPT").arg("LOAD").arg("return 1").ignore();
        let counted: Vec<u64> = pipe.query_async(&mut conn).await.unwrap();
        assert_eq!(counted, (1..=64).collect::<Vec<u64>>(), "each INCR after its SET, in the pipeline's order");
        let mut found = conn.scan_match(&format!("{prefix}:*"), 10).await.unwrap();
        found.sort();
        let mut expected = keys.clone();
        expected.sort();
        assert_eq!(found, expected);
        let mut atomic = redis::pipe();
        atomic.atomic().cmd("SET").arg(&keys[0]).arg(1).ignore().cmd("SET").arg(&keys[1]).arg(1).ignore();
        let refused = atomic.query_async::<()>(&mut conn).await.unwrap_err();
        assert!(refused.to_string().to_lowercase().contains("slot"), "a MULTI over two slots is refused: {refused}");
        let _: () = redis::cmd("DEL").arg(&keys).query_async(&mut conn).await.unwrap();
    }

    #[tokio::test]
    async fn wait_counts_the_replicas_of_every_primary_written() {
        let Some(mut conn) = cluster().await else { return };
        let prefix = format!("test-wait-{}", uuid::Uuid::new_v4().simple());
        let keys: Vec<String> = (0..16).map(|i| format!("{prefix}:{i}")).collect();
        let mut pipe = redis::pipe();
        for key in &keys {
            pipe.cmd("SET").arg(key).arg(1).arg("PX").arg(60_000).ignore();
        }
        let () = pipe.query_async(&mut conn).await.unwrap();
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let timeout = Duration::from_millis(300);
        assert_eq!(conn.wait_replicas(&refs, 1, timeout).await.unwrap(), 1, "each primary has one replica");
        assert_eq!(conn.wait_replicas(&refs, 2, timeout).await.unwrap(), 1, "no primary has a second replica");
        assert_eq!(conn.wait_replicas(&[], 2, timeout).await.unwrap(), 2, "nothing written, nothing to wait for");
        let _: () = redis::cmd("DEL").arg(&keys).query_async(&mut conn).await.unwrap();
    }

    #[tokio::test]
    async fn a_request_that_times_out_has_the_connection_rebuilt_once_and_the_next_ones_run_on_it() {
        let Some(mut conn) = cluster().await else { return };
        let RedisConnection::Cluster(link) = conn.clone() else { unreachable!("a cluster connection") };
        let timed_out = || RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut));
        let refused: RedisError = (ErrorKind::Server(redis::ServerErrorKind::ReadOnly), "refused").into();
        assert!(link.run(async |_| Err::<(), _>(refused)).await.is_err());
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(link.generation(), 0, "an error other than a timeout keeps the connection");

        // Three requests time out on generation 0: one rebuild.
        let failed = futures::future::join_all((0..3).map(|_| link.run(async |_| Err::<(), _>(timed_out())))).await;
        assert!(failed.iter().all(|r| r.as_ref().is_err_and(RedisError::is_timeout)), "the timeouts are returned");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while link.generation() == 0 {
            assert!(tokio::time::Instant::now() < deadline, "the connection was rebuilt within 10 s");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(link.generation(), 1, "timeouts on one generation rebuild it once");

        let key = format!("test-rebuilt-{}", uuid::Uuid::new_v4().simple());
        let () = redis::cmd("SET").arg(&key).arg(7).arg("PX").arg(60_000).query_async(&mut conn).await.unwrap();
        let read: u32 = redis::cmd("GET").arg(&key).query_async(&mut conn).await.unwrap();
        assert_eq!(read, 7, "clones of the connection run on the rebuilt one");
    }

    #[test]
    fn a_command_is_routed_by_its_first_key_a_script_by_its_first_key_and_a_multi_slot_command_alone() {
        let key = |cmd: &Cmd| routing_key(cmd).map(|k| String::from_utf8(k.to_vec()).unwrap());
        assert_eq!(key(redis::cmd("ZADD").arg("{a}:x").arg(1).arg("m")).as_deref(), Some("{a}:x"));
        assert_eq!(key(redis::cmd("EVALSHA").arg("sha").arg(2).arg("k1").arg("k2").arg("v")).as_deref(), Some("k1"));
        assert_eq!(key(redis::cmd("EVALSHA").arg("sha").arg(0).arg("v")), None);
        assert_eq!(key(redis::cmd("DEL").arg("a").arg("b")), None);
        assert_eq!(key(redis::cmd("DEL").arg("a")).as_deref(), Some("a"));
        assert_eq!(key(redis::cmd("SCRIPT").arg("LOAD").arg("return 1")), None);
        assert_eq!(key(redis::cmd("XREAD").arg("COUNT").arg(1).arg("STREAMS").arg("s").arg("0")).as_deref(), Some("s"));
    }
}
