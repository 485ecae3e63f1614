//! A Redis Cluster of its own for one test: three primaries and three replicas of Debian's
//! `redis-server` in cluster mode, on ports the OS picked, in a temporary directory. A test
//! that kills a primary needs one nobody else uses (the shared cluster of
//! `scripts/redis-cluster.sh` serves every other suite at the same time).
//!
//! No persistence: a replica is promoted from what it received, and a killed primary is only
//! started again once its replica took over, so it comes back as a replica and copies the
//! data instead of serving an empty set (which a restart from nothing before the failover
//! would do).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::process::{Child, Command};

/// How long a node may be unreachable before the others count it failed and its replica is
/// promoted (`cluster-node-timeout`): short, so a failover takes seconds.
pub const NODE_TIMEOUT: Duration = Duration::from_millis(2_000);

/// How long the cluster may take to form, or to recover from a failure.
const SETTLE_WITHIN: Duration = Duration::from_secs(60);

/// Why the cluster could not be started or read.
#[derive(Debug, thiserror::Error)]
pub enum RedisClusterError {
    /// A node or `redis-cli` could not be run.
    #[error("running {what}: {source}")]
    Spawn {
        /// The program.
        what: String,
        /// The failure.
        source: std::io::Error,
    },
    /// `redis-cli --cluster create` failed.
    #[error("redis-cli --cluster create failed: {0}")]
    Create(String),
    /// A node did not answer or answered something unreadable.
    #[error("node 127.0.0.1:{port}: {reason}")]
    Node {
        /// Its port.
        port: u16,
        /// What went wrong.
        reason: String,
    },
    /// The cluster did not reach the wanted state in time.
    #[error("{0}")]
    Timeout(String),
}

/// One `redis-server` of the cluster.
struct Node {
    port: u16,
    cluster_port: u16,
    dir: PathBuf,
    child: Option<Child>,
}

/// A running Redis Cluster of six nodes; every node is killed when it is dropped.
pub struct RedisCluster {
    nodes: Vec<Node>,
    _dir: tempfile::TempDir,
}

/// One line of `CLUSTER NODES`: a node, its role and the slots it serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeLine {
    /// Its port.
    pub port: u16,
    /// Its node id.
    pub id: String,
    /// Whether it is a primary (`master` among its flags).
    pub primary: bool,
    /// Whether the others count it failed (`fail` or `fail?`).
    pub failed: bool,
    /// The id of its primary, for a replica.
    pub primary_id: Option<String>,
    /// The slot ranges it serves (inclusive).
    pub slots: Vec<(u16, u16)>,
}

impl RedisCluster {
    /// Starts six nodes and makes them a cluster of three primaries with one replica each;
    /// returns once every slot is served and every replica is in sync.
    pub async fn start() -> Result<Self, RedisClusterError> {
        let dir = tempfile::tempdir().map_err(|source| RedisClusterError::Spawn { what: "mkdir".into(), source })?;
        let mut nodes = Vec::new();
        for i in 0..6 {
            let free = || {
                crate::cluster::free_port().map_err(|source| RedisClusterError::Spawn { what: "bind".into(), source })
            };
            let (port, cluster_port) = (free()?, free()?);
            let node_dir = dir.path().join(format!("node{i}"));
            std::fs::create_dir_all(&node_dir)
                .map_err(|source| RedisClusterError::Spawn { what: "mkdir".into(), source })?;
            nodes.push(Node { port, cluster_port, dir: node_dir, child: None });
        }
        let mut cluster = Self { nodes, _dir: dir };
        for i in 0..cluster.nodes.len() {
            cluster.spawn(i)?;
        }
        for node in &cluster.nodes {
            wait_answering(node.port).await?;
        }
        let addresses: Vec<String> = cluster.nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)).collect();
        let created = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addresses)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .await
            .map_err(|source| RedisClusterError::Spawn { what: "redis-cli".into(), source })?;
        if !created.status.success() {
            return Err(RedisClusterError::Create(String::from_utf8_lossy(&created.stdout).into_owned()));
        }
        cluster.wait_healthy(3).await?;
        Ok(cluster)
    }

    /// The URL imagepipe takes for this cluster: `redis+cluster://` and every primary-to-be.
    pub fn url(&self) -> String {
        let seeds: Vec<String> = self.nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)).collect();
        format!("redis+cluster://{}", seeds.join(","))
    }

    /// The ports of the nodes.
    pub fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(|n| n.port).collect()
    }

    /// `CLUSTER NODES` as node `port` sees it.
    pub async fn nodes_seen_by(&self, port: u16) -> Result<Vec<NodeLine>, RedisClusterError> {
        let text: String = query(port, redis::cmd("CLUSTER").arg("NODES")).await?;
        parse_nodes(&text).map_err(|reason| RedisClusterError::Node { port, reason })
    }

    /// The hash slot of `key` (`CLUSTER KEYSLOT`, asked of a node that is up).
    pub async fn slot_of(&self, key: &str) -> Result<u16, RedisClusterError> {
        let port = self.some_running_port()?;
        query(port, redis::cmd("CLUSTER").arg("KEYSLOT").arg(key)).await
    }

    /// The port of the primary serving the most of `keys`, with how many it serves.
    pub async fn primary_serving_most(&self, keys: &[String]) -> Result<(u16, usize), RedisClusterError> {
        let lines = self.nodes_seen_by(self.some_running_port()?).await?;
        let mut served: BTreeMap<u16, usize> = BTreeMap::new();
        for key in keys {
            let slot = self.slot_of(key).await?;
            if let Some(line) =
                lines.iter().find(|l| l.primary && l.slots.iter().any(|(a, b)| (*a..=*b).contains(&slot)))
            {
                *served.entry(line.port).or_default() += 1;
            }
        }
        served
            .into_iter()
            .max_by_key(|(port, n)| (*n, std::cmp::Reverse(*port)))
            .ok_or_else(|| RedisClusterError::Timeout("no primary serves any of the keys".into()))
    }

    /// Kills node `port` with SIGKILL and waits for it to exit.
    pub async fn kill9(&mut self, port: u16) {
        let node = self.nodes.iter_mut().find(|n| n.port == port).expect("a node of this cluster");
        if let Some(mut child) = node.child.take() {
            let _ = child.kill().await;
        }
    }

    /// Starts node `port` again from its `nodes.conf` (it rejoins the cluster on its own).
    pub async fn restart(&mut self, port: u16) -> Result<(), RedisClusterError> {
        let i = self.nodes.iter().position(|n| n.port == port).expect("a node of this cluster");
        self.spawn(i)?;
        wait_answering(port).await
    }

    /// The port of the replica of primary `port`.
    pub async fn replica_of(&self, port: u16) -> Result<u16, RedisClusterError> {
        let lines = self.nodes_seen_by(port).await?;
        let id = lines.iter().find(|l| l.port == port).map(|l| l.id.clone());
        lines
            .iter()
            .find(|l| l.primary_id.is_some() && l.primary_id == id)
            .map(|l| l.port)
            .ok_or_else(|| RedisClusterError::Node { port, reason: "has no replica".into() })
    }

    /// Waits until `replica` serves the slots of the killed primary `old`: it is a primary
    /// with slots, `old` serves none, and every node that runs says `cluster_state:ok`.
    pub async fn wait_promoted(&self, old: u16, replica: u16) -> Result<(), RedisClusterError> {
        let until = Instant::now() + SETTLE_WITHIN;
        loop {
            if let Ok(lines) = self.nodes_seen_by(replica).await {
                let serves = |port| lines.iter().any(|l| l.port == port && l.primary && !l.slots.is_empty());
                if serves(replica) && !serves(old) && self.state_ok().await {
                    return Ok(());
                }
            }
            if Instant::now() > until {
                return Err(RedisClusterError::Timeout(format!(
                    "127.0.0.1:{replica} did not take over from 127.0.0.1:{old} within {SETTLE_WITHIN:?}"
                )));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until every slot is served, every node that runs says `cluster_state:ok`, and
    /// `replicas` replicas are in sync with their primaries.
    pub async fn wait_healthy(&self, replicas: usize) -> Result<(), RedisClusterError> {
        let until = Instant::now() + SETTLE_WITHIN;
        loop {
            if self.state_ok().await && self.replicas_in_sync().await == replicas {
                return Ok(());
            }
            if Instant::now() > until {
                let seen = match self.some_running_port() {
                    Ok(port) => self.nodes_seen_by(port).await.map(|l| format!("{l:?}")).unwrap_or_default(),
                    Err(e) => e.to_string(),
                };
                return Err(RedisClusterError::Timeout(format!(
                    "the cluster did not become healthy with {replicas} replicas in sync within {SETTLE_WITHIN:?}: {seen}"
                )));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn state_ok(&self) -> bool {
        for node in self.nodes.iter().filter(|n| n.child.is_some()) {
            let info: Result<String, _> = query(node.port, redis::cmd("CLUSTER").arg("INFO")).await;
            if !info.is_ok_and(|i| i.contains("cluster_state:ok")) {
                return false;
            }
        }
        true
    }

    async fn replicas_in_sync(&self) -> usize {
        let mut count = 0;
        for node in self.nodes.iter().filter(|n| n.child.is_some()) {
            let info: Result<String, _> = query(node.port, redis::cmd("INFO").arg("replication")).await;
            if info.is_ok_and(|i| i.contains("role:slave") && i.contains("master_link_status:up")) {
                count += 1;
            }
        }
        count
    }

    fn some_running_port(&self) -> Result<u16, RedisClusterError> {
        self.nodes
            .iter()
            .find(|n| n.child.is_some())
            .map(|n| n.port)
            .ok_or_else(|| RedisClusterError::Timeout("no node runs".into()))
    }

    fn spawn(&mut self, i: usize) -> Result<(), RedisClusterError> {
        let node = &mut self.nodes[i];
        let dir = node.dir.display().to_string();
        let child = Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &node.port.to_string()])
            .args(["--cluster-port", &node.cluster_port.to_string()])
            .args(["--cluster-enabled", "yes", "--cluster-config-file", &format!("{dir}/nodes.conf")])
            .args(["--cluster-node-timeout", &NODE_TIMEOUT.as_millis().to_string()])
            .args(["--save", "", "--appendonly", "no", "--dir", &dir])
            .args(["--logfile", &format!("{dir}/redis.log")])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(|source| RedisClusterError::Spawn { what: "redis-server".into(), source })?;
        node.child = Some(child);
        Ok(())
    }

    /// The last `lines` lines of node `port`'s log.
    pub fn log_tail(&self, port: u16, lines: usize) -> String {
        let node = self.nodes.iter().find(|n| n.port == port).expect("a node of this cluster");
        let text = std::fs::read_to_string(Path::new(&node.dir).join("redis.log")).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

/// Waits until node `port` answers PING.
async fn wait_answering(port: u16) -> Result<(), RedisClusterError> {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let pong: Result<String, _> = query(port, &mut redis::cmd("PING")).await;
        if pong.is_ok() {
            return Ok(());
        }
        if Instant::now() > until {
            return Err(RedisClusterError::Node { port, reason: "does not answer PING within 10 s".into() });
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Sends `cmd` to node `port` alone (no cluster routing).
async fn query<T: redis::FromRedisValue>(port: u16, cmd: &mut redis::Cmd) -> Result<T, RedisClusterError> {
    let node = |reason: String| RedisClusterError::Node { port, reason };
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).map_err(|e| node(e.to_string()))?;
    let mut conn = tokio::time::timeout(Duration::from_secs(2), client.get_multiplexed_async_connection())
        .await
        .map_err(|_| node("connect timed out".into()))?
        .map_err(|e| node(e.to_string()))?;
    tokio::time::timeout(Duration::from_secs(2), cmd.query_async(&mut conn))
        .await
        .map_err(|_| node("timed out".into()))?
        .map_err(|e| node(e.to_string()))
}

/// The lines of a `CLUSTER NODES` answer.
pub fn parse_nodes(text: &str) -> Result<Vec<NodeLine>, String> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.len() < 8 {
                return Err(format!("a short CLUSTER NODES line: {line:?}"));
            }
            let address = fields[1].split('@').next().unwrap_or_default();
            let port = address
                .rsplit(':')
                .next()
                .and_then(|p| p.split(',').next())
                .and_then(|p| p.parse().ok())
                .ok_or_else(|| format!("no port in {line:?}"))?;
            let flags: Vec<&str> = fields[2].split(',').collect();
            let slots = fields[8..]
                .iter()
                .filter(|s| !s.starts_with('['))
                .map(|s| {
                    let (a, b) = s.split_once('-').unwrap_or((s, s));
                    Ok((a.parse().map_err(|_| format!("slot {s:?}"))?, b.parse().map_err(|_| format!("slot {s:?}"))?))
                })
                .collect::<Result<Vec<(u16, u16)>, String>>()?;
            Ok(NodeLine {
                port,
                id: fields[0].to_owned(),
                primary: flags.contains(&"master"),
                failed: flags.iter().any(|f| *f == "fail" || *f == "fail?"),
                primary_id: (fields[3] != "-").then(|| fields[3].to_owned()),
                slots,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_nodes_lines_give_roles_links_and_slots() {
        let text = "\
07c3 127.0.0.1:30004@31004 slave e7d1 0 1426238317239 4 connected
67ed 127.0.0.1:30002@31002 master - 0 1426238316232 2 connected 5461-10922
e7d1 127.0.0.1:30001@31001 myself,master - 0 0 1 connected 0-5460 [5461->-67ed]
6ec2 127.0.0.1:30003@31003 master,fail - 1426238316232 1426238315228 3 disconnected
";
        let lines = parse_nodes(text).unwrap();
        assert_eq!(lines.len(), 4);
        assert_eq!((lines[0].port, lines[0].primary, lines[0].primary_id.as_deref()), (30004, false, Some("e7d1")));
        assert_eq!(lines[1].slots, vec![(5461, 10922)]);
        assert_eq!(lines[2].slots, vec![(0, 5460)], "a migrating slot in brackets is not served");
        assert!(lines[3].failed && lines[3].primary && lines[3].slots.is_empty());
        assert!(parse_nodes("abc 127.0.0.1:1@2 master").is_err());
    }
}
