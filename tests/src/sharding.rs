//! The sharded coordinator over real processes (docs/design.md, "Shards, leases and routing"):
//! several coordinator replicas and the no-op stages on a real broker and Redis, read through
//! `GET /v1/cluster` (who owns which shard with which token, the handovers), each task's
//! history (which replica wrote each transition) and the replicas' `/metrics`.
//!
//! The pure parts — reading a view, the checks a sequence of views must pass, the fencing
//! check over histories — are here with unit tests; the scenarios are in [`scenarios`].

pub mod scenarios;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};
use tokio::task::JoinHandle;

use crate::backend::{Backend, BackendError, Submitter};
use crate::cluster::{Cluster, ClusterConfig, Member, ServiceKind};
use crate::observe::Seen;

/// How long a replica's lease on a shard lasts unless renewed, in these runs: short, so that
/// a dead or paused replica's shards are taken over quickly.
pub const SHARD_LEASE: Duration = Duration::from_secs(2);

/// How many shards there are (the default, `coordinator.shards`).
pub const SHARDS: u16 = imagepipe_contracts::shard::DEFAULT_SHARDS;

/// The blob every task names: the no-op stages never read it (the bench's, the sha256 of
/// nothing).
const BLOB_KEY: &str = "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

/// How often a waiting test reads `/v1/cluster` (each read lists the unfinished tasks: not
/// free on a loaded 2-core machine).
pub const VIEW_EVERY: Duration = Duration::from_millis(500);

/// `coordinators` coordinator replicas and the no-op stages on `backend`, holding shards by
/// [`SHARD_LEASE`].
pub fn cluster_config(backend: Backend, label: &str, coordinators: usize) -> ClusterConfig {
    ClusterConfig::new(backend, label)
        .services(&[ServiceKind::Coordinator, ServiceKind::NoopStages])
        .coordinators(coordinators)
        .env("IMAGEPIPE_COORDINATOR__SHARD_LEASE", format!("{}ms", SHARD_LEASE.as_millis()))
        .env("IMAGEPIPE_COORDINATOR__STEP_DEADLINE", "10s")
        .env("IMAGEPIPE_COORDINATOR__MAX_IN_FLIGHT", "1000")
        // A killed replica's unacknowledged inputs come back this long after it took them.
        .env("IMAGEPIPE_WORKER__ACK_WAIT", "5s")
        .env("IMAGEPIPE_WORKER__CONCURRENCY", "16")
}

/// Unix time now, in ms (the clock the replicas stamp handovers and history entries with:
/// the same machine's).
pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// The ids and submit bodies of `count` tasks named `tsk_<prefix>_<phase><n>`, each a blob the
/// no-op stages answer at once.
pub fn tasks(prefix: &str, phase: &str, count: usize) -> (Vec<String>, Vec<Vec<u8>>) {
    (0..count)
        .map(|i| {
            let id = format!("tsk_{prefix}_{phase}{i:04}");
            let body = json!({ "taskId": id, "blob": BLOB_KEY, "labels": { "run": prefix, "phase": phase } });
            (id, serde_json::to_vec(&body).expect("JSON"))
        })
        .unzip()
}

/// The shard of task `id` (docs/contracts.md, "Shards").
pub fn shard_of(id: &str) -> u16 {
    imagepipe_contracts::shard::shard_of(id, SHARDS)
}

/// Publishes submit commands in the background, `batch` at a time every `every`, so that a
/// run goes on while a test kills, adds or pauses replicas.
pub struct Feeder {
    published: Arc<AtomicUsize>,
    task: JoinHandle<Result<(), BackendError>>,
}

impl Feeder {
    /// Starts publishing `bodies` through `submitter`.
    pub fn start(submitter: Submitter, bodies: Vec<Vec<u8>>, batch: usize, every: Duration) -> Self {
        let published = Arc::new(AtomicUsize::new(0));
        let counter = published.clone();
        let task = tokio::spawn(async move {
            let mut ticks = tokio::time::interval(every);
            for chunk in bodies.chunks(batch.max(1)) {
                ticks.tick().await;
                submitter.publish_all(chunk.to_vec()).await?;
                counter.fetch_add(chunk.len(), Ordering::Relaxed);
            }
            Ok(())
        });
        Self { published, task }
    }

    /// How many bodies it has published so far.
    pub fn published(&self) -> usize {
        self.published.load(Ordering::Relaxed)
    }

    /// Waits until it has published every body; panics with the broker's refusal.
    pub async fn finish(self) {
        self.task.await.expect("the feeder does not panic").expect("publishing submit commands");
    }
}

/// A shard changing hands, as `/v1/cluster` lists it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Handover {
    /// When, Unix ms (the replica's clock).
    pub at: u64,
    /// The shard.
    pub shard: u16,
    /// The replica that had it.
    pub from: Option<String>,
    /// The replica that has it now.
    pub to: Option<String>,
    /// `expired`, `released`, `shutdown` or `free`.
    pub reason: String,
}

/// Each shard's owner (none: free, or its lease ran out) and its lease's fencing token.
pub type Owners = BTreeMap<u16, (Option<String>, u64)>;

/// One reading of `GET /v1/cluster`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct View {
    /// The replica that answered.
    pub replica: String,
    /// The live replicas: id → announced address.
    pub replicas: BTreeMap<String, Option<String>>,
    /// Every shard: its owner (none: free or run out) and its lease's fencing token.
    pub shards: Owners,
    /// The newest handovers.
    pub handovers: Vec<Handover>,
}

impl View {
    /// Reads the JSON of `/v1/cluster`; what is missing or malformed, otherwise.
    pub fn parse(value: &Value) -> Result<Self, String> {
        let text = |v: &Value, field: &str| v[field].as_str().map(str::to_owned);
        let list = |field: &str| value[field].as_array().ok_or_else(|| format!("no `{field}` list in {value}"));
        let replica = text(value, "replica").ok_or_else(|| format!("no `replica` in {value}"))?;
        let mut replicas = BTreeMap::new();
        for r in list("replicas")? {
            let id = text(r, "id").ok_or_else(|| format!("a replica without an id: {r}"))?;
            replicas.insert(id, text(r, "address"));
        }
        let mut shards = BTreeMap::new();
        for s in list("shards")? {
            let shard = s["shard"].as_u64().and_then(|n| u16::try_from(n).ok());
            let shard = shard.ok_or_else(|| format!("a shard without a number: {s}"))?;
            let token = s["token"].as_u64().ok_or_else(|| format!("shard {shard} without a token: {s}"))?;
            if shards.insert(shard, (text(s, "owner"), token)).is_some() {
                return Err(format!("shard {shard} listed twice in one view"));
            }
        }
        let mut handovers = Vec::new();
        for h in list("handovers")? {
            let shard = h["shard"].as_u64().and_then(|n| u16::try_from(n).ok());
            handovers.push(Handover {
                at: h["at"].as_u64().ok_or_else(|| format!("a handover without a time: {h}"))?,
                shard: shard.ok_or_else(|| format!("a handover without a shard: {h}"))?,
                from: text(h, "from"),
                to: text(h, "to"),
                reason: text(h, "reason").ok_or_else(|| format!("a handover without a reason: {h}"))?,
            });
        }
        Ok(Self { replica, replicas, shards, handovers })
    }

    /// The id of the replica announcing `address`.
    pub fn id_at(&self, address: &str) -> Option<String> {
        self.replicas.iter().find(|(_, a)| a.as_deref() == Some(address)).map(|(id, _)| id.clone())
    }

    /// How many shards each replica owns (replicas owning none are absent).
    pub fn owned(&self) -> BTreeMap<String, usize> {
        let mut owned = BTreeMap::new();
        for owner in self.shards.values().filter_map(|(owner, _)| owner.clone()) {
            *owned.entry(owner).or_default() += 1;
        }
        owned
    }

    /// The shards `replica` owns.
    pub fn shards_of(&self, replica: &str) -> BTreeSet<u16> {
        self.shards.iter().filter(|(_, (owner, _))| owner.as_deref() == Some(replica)).map(|(s, _)| *s).collect()
    }

    /// Whether membership has settled on exactly `live`: they are the replicas announced,
    /// every shard is owned by one of them, and their shares differ by at most one; the
    /// share of each, or why not.
    pub fn settled_on(&self, live: &BTreeSet<String>) -> Result<BTreeMap<String, usize>, String> {
        let announced: BTreeSet<String> = self.replicas.keys().cloned().collect();
        if announced != *live {
            return Err(format!("replicas announced {announced:?}, expected {live:?}"));
        }
        let unowned: Vec<u16> = self
            .shards
            .iter()
            .filter(|(_, (owner, _))| owner.as_ref().is_none_or(|o| !live.contains(o)))
            .map(|(s, _)| *s)
            .collect();
        if !unowned.is_empty() || self.shards.len() != usize::from(SHARDS) {
            return Err(format!("shards not owned by a live replica: {unowned:?} (of {})", self.shards.len()));
        }
        let owned = self.owned();
        let shares: BTreeMap<String, usize> =
            live.iter().map(|id| (id.clone(), owned.get(id).copied().unwrap_or(0))).collect();
        let (min, max) = (shares.values().min().copied().unwrap_or(0), shares.values().max().copied().unwrap_or(0));
        if max - min > 1 {
            return Err(format!("shares differ by more than one: {shares:?}"));
        }
        Ok(shares)
    }
}

/// Every view a test read, in the order read, checked as it comes: a shard's fencing token
/// never goes down, and one token is never held by two replicas (a shard changes hands only
/// with a new token: no shard is ever owned twice under one lease).
#[derive(Debug, Default)]
pub struct Watch {
    /// Per shard: each token seen, with the owner it was seen with.
    tokens: BTreeMap<u16, BTreeMap<u64, String>>,
    /// Per shard: the highest token seen.
    highest: BTreeMap<u16, u64>,
    /// Every handover any view listed.
    handovers: BTreeSet<Handover>,
    /// What broke the rules, in words.
    violations: Vec<String>,
    /// How many views were read.
    views: usize,
    /// The last view read.
    last: Option<View>,
}

impl Watch {
    /// A watch that has seen nothing yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Checks `view` against every view before it and keeps its handovers.
    pub fn record(&mut self, view: View) {
        self.views += 1;
        for (shard, (owner, token)) in &view.shards {
            let highest = self.highest.entry(*shard).or_default();
            if token < highest {
                self.violations.push(format!(
                    "shard {shard}: token went down from {highest} to {token} (view of {})",
                    view.replica
                ));
            }
            *highest = (*highest).max(*token);
            let Some(owner) = owner else { continue };
            let holder = self.tokens.entry(*shard).or_default().entry(*token).or_insert_with(|| owner.clone());
            if holder != owner {
                self.violations.push(format!(
                    "shard {shard}: token {token} held by {holder} and by {owner} (view of {})",
                    view.replica
                ));
            }
        }
        self.handovers.extend(view.handovers.iter().cloned());
        self.last = Some(view);
    }

    /// Reads `/v1/cluster` from the first of `from` that answers and records it; `None`, with
    /// every reason, when none did.
    pub async fn read(&mut self, cluster: &Cluster, from: &[Member]) -> Result<View, String> {
        let mut reasons = Vec::new();
        for member in from {
            match cluster.fetch_json(*member, "/v1/cluster").await.and_then(|v| View::parse(&v)) {
                Ok(view) => {
                    self.record(view.clone());
                    return Ok(view);
                }
                Err(reason) => reasons.push(format!("{member:?}: {reason}")),
            }
        }
        Err(format!("no replica answered /v1/cluster: {reasons:?}"))
    }

    /// Every handover seen so far, oldest first.
    pub fn handovers(&self) -> impl Iterator<Item = &Handover> {
        self.handovers.iter()
    }

    /// The last view read.
    pub fn last(&self) -> Option<&View> {
        self.last.as_ref()
    }

    /// How many views were read.
    pub fn views(&self) -> usize {
        self.views
    }

    /// What broke the rules so far (empty: nothing).
    pub fn violations(&self) -> &[String] {
        &self.violations
    }
}

/// The takeover of each of `shards` from `from` after `since`: the first handover of the
/// shard from `from` to another replica at or after `since`, by shard; the shards without one
/// are absent.
pub fn takeovers(
    handovers: impl IntoIterator<Item = Handover>,
    shards: &BTreeSet<u16>,
    from: &str,
    since: u64,
) -> BTreeMap<u16, Handover> {
    let mut taken: BTreeMap<u16, Handover> = BTreeMap::new();
    for h in handovers {
        let away = h.from.as_deref() == Some(from) && h.to.as_deref().is_some_and(|to| to != from);
        if away && h.at >= since && shards.contains(&h.shard) && taken.get(&h.shard).is_none_or(|t| h.at < t.at) {
            taken.insert(h.shard, h);
        }
    }
    taken
}

/// When `replica` may have held `shard` again after `since`: the first handover of it to
/// `replica` after `since`, or, when none is listed, the last release (a handover to nobody)
/// not followed by another replica's take. A replica that takes back, by a new lease, a shard
/// it still remembered holding records no handover of it (its lease loop counts only shards
/// it did not hold), so its release by the last owner is the earliest time that new lease
/// can start: writes from then on are not called unleased.
pub fn regained<'a>(
    handovers: impl IntoIterator<Item = &'a Handover>,
    shard: u16,
    replica: &str,
    since: u64,
) -> Option<u64> {
    let mut ours: Vec<&Handover> = handovers.into_iter().filter(|h| h.shard == shard && h.at > since).collect();
    ours.sort_by_key(|h| (h.at, h.to.is_some()));
    let mut released = None;
    for h in ours {
        match h.to.as_deref() {
            Some(to) if to == replica => return Some(h.at),
            Some(_) => released = None,
            None => released = Some(h.at),
        }
    }
    released
}

/// One transition of a task's history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The task version it produced.
    pub version: u64,
    /// When, Unix ms (the writer's clock).
    pub at: u64,
    /// `created`, `started`, `step_succeeded`, …, `completed`.
    pub event: String,
    /// The state after it.
    pub to: String,
    /// The step involved (`download`, `metadata`, `analyze`), if any.
    pub step: Option<String>,
    /// The replica that wrote it under its lease (none: no lease was needed, as for creation).
    pub replica: Option<String>,
}

/// The entries of a `GET /v1/tasks/{id}/history` answer, by version.
pub fn parse_history(value: &Value) -> Result<Vec<Entry>, String> {
    let entries = value["entries"].as_array().ok_or_else(|| format!("no entries in {value}"))?;
    let entry = |e: &Value| {
        Some(Entry {
            version: e["version"].as_u64()?,
            at: e["at"].as_u64()?,
            event: e["event"].as_str()?.to_owned(),
            to: e["to"].as_str()?.to_owned(),
            step: e["step"].as_str().map(str::to_owned),
            replica: e["replica"].as_str().map(str::to_owned),
        })
    };
    let mut parsed = entries
        .iter()
        .map(|e| entry(e).ok_or_else(|| format!("a malformed history entry: {e}")))
        .collect::<Result<Vec<_>, _>>()?;
    parsed.sort_by_key(|e| e.version);
    Ok(parsed)
}

/// The history of every task of `ids`, read from `member` eight at a time; panics with the
/// reasons when one cannot be read.
pub async fn histories(cluster: &Cluster, member: Member, ids: &[String]) -> BTreeMap<String, Vec<Entry>> {
    let paths: Vec<String> = ids.iter().map(|id| format!("/v1/tasks/{id}/history")).collect();
    let answers = cluster.fetch_all_json(member, &paths, 8).await;
    let mut read = BTreeMap::new();
    let mut failures = Vec::new();
    for (id, answer) in ids.iter().zip(answers) {
        match answer.and_then(|value| parse_history(&value)) {
            Ok(entries) => {
                read.insert(id.clone(), entries);
            }
            Err(reason) => failures.push(format!("{id}: {reason}")),
        }
    }
    assert!(failures.is_empty(), "{} histories unreadable; the first: {:?}", failures.len(), failures.first());
    read
}

/// Why a task did not complete exactly once by its history: not one `completed` entry, or
/// not in state `completed` at the end; `None` when it did.
pub fn not_completed_once(entries: &[Entry]) -> Option<String> {
    let completions = entries.iter().filter(|e| e.event == "completed").count();
    let last = entries.last().map_or("nothing", |e| e.to.as_str());
    (completions != 1 || last != "completed")
        .then(|| format!("{completions} `completed` entries, last state {last}: {entries:?}"))
}

/// The transition an event implies was stored before it went out: a history event and the
/// step it names (`None`: any). The coordinator relays its own events and the commands after
/// writing the transition that made them; a stage's event shows its command was relayed.
fn implied_by(event_type: &str) -> Option<(&'static str, Option<&'static str>)> {
    Some(match event_type {
        "task.created" => ("created", None),
        "image.downloaded" => ("started", None),
        "image.metadata_extracted" => ("step_succeeded", Some("download")),
        "image.analyzed" => ("step_succeeded", Some("metadata")),
        "task.retrying" => ("retry_scheduled", None),
        "task.completed" => ("completed", None),
        "task.failed" => ("failed", None),
        "task.cancelled" => ("cancelled", None),
        _ => return None,
    })
}

/// The events seen whose transition is missing from their task's history (one line each).
/// What a store that lost acknowledged writes (a promoted replica that had not received them)
/// shows. A stage's event (`image.*`) needs one entry of the implied transition: a command is
/// delivered at least once, and a stage that handles it twice publishes two events for one
/// dispatch. The coordinator's own events (`task.*`) each need an entry of their own: the
/// history must hold as many as distinct event ids were seen (each retry is a transition).
pub fn relayed_but_not_stored(seen: &[Seen], histories: &BTreeMap<String, Vec<Entry>>) -> Vec<String> {
    let mut distinct: BTreeMap<(&str, &str), BTreeSet<&str>> = BTreeMap::new();
    for s in seen.iter().filter(|s| histories.contains_key(&s.task_id)) {
        distinct.entry((s.task_id.as_str(), s.event_type.as_str())).or_default().insert(s.event_id.as_str());
    }
    distinct
        .into_iter()
        .filter_map(|((task, event_type), ids)| {
            let (event, step) = implied_by(event_type)?;
            let stored = histories[task]
                .iter()
                .filter(|e| e.event == event && step.is_none_or(|s| e.step.as_deref() == Some(s)))
                .count();
            let needed = if event_type.starts_with("task.") { ids.len() } else { 1 };
            (stored < needed)
                .then(|| format!("{task}: {} {event_type} event(s) seen, {stored} `{event}` entries stored", ids.len()))
        })
        .collect()
}

/// How many tasks each replica completed: the writer of each task's `completed` entry.
pub fn completions_by_replica(histories: &BTreeMap<String, Vec<Entry>>) -> BTreeMap<String, usize> {
    let mut by = BTreeMap::new();
    for entries in histories.values() {
        for e in entries.iter().filter(|e| e.event == "completed") {
            *by.entry(e.replica.clone().unwrap_or_else(|| "(none)".into())).or_default() += 1;
        }
    }
    by
}

/// The transitions `paused` wrote on the tasks of the shards taken from it (`taken`: shard →
/// the takeover's time) that no lease of its covered: written at or after the takeover and
/// before it took the shard back (`retaken`: shard → the time it did), or written after, by
/// version, a transition another replica wrote at or after the takeover (a write that carried
/// an old time past the new owner's) and before it took the shard back. One line per write.
pub fn writes_without_lease(
    histories: &BTreeMap<String, Vec<Entry>>,
    paused: &str,
    taken: &BTreeMap<u16, u64>,
    retaken: &BTreeMap<u16, u64>,
) -> Vec<String> {
    let mut found = Vec::new();
    for (id, entries) in histories {
        let shard = shard_of(id);
        let Some(&takeover) = taken.get(&shard) else { continue };
        let back = retaken.get(&shard).copied().unwrap_or(u64::MAX);
        let mut overtaken = false;
        for e in entries {
            match e.replica.as_deref() {
                Some(writer) if writer == paused => {
                    let unleased = e.at < back && (e.at >= takeover || overtaken);
                    if unleased {
                        found.push(format!(
                            "{id} (shard {shard}, taken at {takeover}, back at {back}): {} at {} by {paused}",
                            e.event, e.at
                        ));
                    }
                }
                Some(_) if e.at >= takeover => overtaken = true,
                _ => {}
            }
        }
    }
    found
}

/// The sum of every sample of metric `name` in a Prometheus text exposition (0 when absent).
pub fn metric_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter(|line| line.strip_prefix(name).is_some_and(|rest| rest.starts_with(['{', ' '])))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .fold(0.0, |sum, sample| sum + sample)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(owners: &[(u16, Option<&str>, u64)], handovers: Value) -> Value {
        let shards: Vec<Value> = owners
            .iter()
            .map(|(shard, owner, token)| json!({ "shard": shard, "owner": owner, "token": token }))
            .collect();
        json!({
            "replica": "a",
            "replicas": [{ "id": "a", "address": "http://127.0.0.1:1" }, { "id": "b", "address": "http://127.0.0.1:2" }],
            "shards": shards,
            "handovers": handovers,
        })
    }

    #[test]
    fn a_view_is_read_with_its_owners_tokens_and_handovers() {
        let value = view(
            &[(0, Some("a"), 1), (1, None, 3)],
            json!([{ "shard": 1, "from": "b", "at": 10, "reason": "expired" }]),
        );
        let view = View::parse(&value).unwrap();
        assert_eq!(view.id_at("http://127.0.0.1:2").as_deref(), Some("b"));
        assert_eq!(view.shards[&1], (None, 3));
        assert_eq!(view.owned(), BTreeMap::from([("a".to_owned(), 1)]));
        assert_eq!(view.handovers[0].from.as_deref(), Some("b"));
        assert!(View::parse(&json!({ "replica": "a" })).is_err());
    }

    #[test]
    fn a_token_held_by_two_replicas_or_going_down_is_a_violation() {
        let mut watch = Watch::new();
        watch.record(View::parse(&view(&[(0, Some("a"), 1)], json!([]))).unwrap());
        watch.record(View::parse(&view(&[(0, Some("b"), 2)], json!([]))).unwrap());
        assert!(watch.violations().is_empty(), "{:?}", watch.violations());
        watch.record(View::parse(&view(&[(0, Some("a"), 2)], json!([]))).unwrap());
        assert_eq!(watch.violations().len(), 1, "token 2 held by b, then a");
        watch.record(View::parse(&view(&[(0, Some("a"), 1)], json!([]))).unwrap());
        assert_eq!(watch.violations().len(), 2, "token went down: {:?}", watch.violations());
    }

    #[test]
    fn settling_needs_every_shard_owned_and_shares_within_one() {
        let live: BTreeSet<String> = ["a".to_owned(), "b".to_owned()].into();
        let all = |split: u16| -> Vec<(u16, Option<&'static str>, u64)> {
            (0..SHARDS).map(|s| (s, Some(if s < split { "a" } else { "b" }), 1)).collect()
        };
        let even = View::parse(&view(&all(32), json!([]))).unwrap();
        assert_eq!(even.settled_on(&live).unwrap().values().copied().collect::<Vec<_>>(), vec![32, 32]);
        assert!(View::parse(&view(&all(34), json!([]))).unwrap().settled_on(&live).is_err(), "34/30");
        assert!(even.settled_on(&["a".to_owned()].into()).is_err(), "b still announced");
    }

    #[test]
    fn takeovers_are_the_first_handover_away_after_the_time() {
        let h = |at, shard, from: &str, to: &str| Handover {
            at,
            shard,
            from: Some(from.into()),
            to: Some(to.into()),
            reason: "expired".into(),
        };
        let shards = BTreeSet::from([1, 2]);
        let taken = takeovers(
            [h(5, 1, "v", "a"), h(20, 1, "v", "b"), h(15, 1, "v", "a"), h(30, 3, "v", "a")],
            &shards,
            "v",
            10,
        );
        assert_eq!(taken.len(), 1);
        assert_eq!((taken[&1].at, taken[&1].to.as_deref()), (15, Some("a")));
    }

    #[test]
    fn a_shard_is_regained_by_a_handover_to_the_replica_or_a_release_nobody_else_took() {
        let h = |at, to: Option<&str>| Handover {
            at,
            shard: 7,
            from: Some("x".into()),
            to: to.map(Into::into),
            reason: "released".into(),
        };
        assert_eq!(regained(&[h(5, Some("v")), h(20, Some("v"))], 7, "v", 10), Some(20));
        assert_eq!(regained(&[h(15, None), h(30, Some("v"))], 7, "v", 10), Some(30), "the handover to it, when listed");
        assert_eq!(regained(&[h(15, None)], 7, "v", 10), Some(15), "released and taken silently");
        assert_eq!(regained(&[h(15, None), h(16, Some("y"))], 7, "v", 10), None, "taken by another");
        assert_eq!(regained(&[h(15, None), h(16, Some("y")), h(40, None)], 7, "v", 10), Some(40));
    }

    #[test]
    fn writes_without_a_lease_are_found_by_time_and_by_order() {
        let id = "tsk_fence_0001";
        let shard = shard_of(id);
        let e = |version, at, replica: &str| Entry {
            version,
            at,
            event: "step_succeeded".into(),
            to: "analyzing".into(),
            step: Some("metadata".into()),
            replica: Some(replica.into()),
        };
        let taken = BTreeMap::from([(shard, 100)]);
        let retaken = BTreeMap::from([(shard, 200)]);
        let check = |entries: Vec<Entry>| {
            writes_without_lease(&BTreeMap::from([(id.to_owned(), entries)]), "v", &taken, &retaken)
        };
        assert!(check(vec![e(1, 50, "v"), e(2, 120, "a"), e(3, 250, "v")]).is_empty(), "before and after its leases");
        assert_eq!(check(vec![e(1, 50, "v"), e(2, 150, "v")]).len(), 1, "between takeover and retake");
        assert_eq!(check(vec![e(1, 120, "a"), e(2, 90, "v")]).len(), 1, "an old time after the new owner's write");
    }

    #[test]
    fn an_event_seen_without_its_stored_transition_is_found() {
        let seen = |task: &str, event_type: &str, id: &str| Seen {
            event_id: id.into(),
            event_type: event_type.into(),
            task_id: task.into(),
            trace_id: String::new(),
            body: Value::Null,
        };
        let entry = |version, event: &str, step: Option<&str>| Entry {
            version,
            at: version,
            event: event.into(),
            to: "x".into(),
            step: step.map(str::to_owned),
            replica: None,
        };
        let histories = BTreeMap::from([(
            "t1".to_owned(),
            vec![
                entry(1, "created", None),
                entry(2, "started", Some("download")),
                entry(3, "step_succeeded", Some("download")),
            ],
        )]);
        let events = vec![
            seen("t1", "task.created", "a"),
            seen("t1", "task.created", "a"),
            seen("t1", "image.downloaded", "b"),
            seen("t1", "image.metadata_extracted", "c"),
            seen("t2", "task.completed", "z"),
        ];
        assert!(
            relayed_but_not_stored(&events, &histories).is_empty(),
            "a redelivery is one event; other tasks ignored"
        );
        let mut twice = events.clone();
        twice.push(seen("t1", "image.downloaded", "b2"));
        assert!(relayed_but_not_stored(&twice, &histories).is_empty(), "a command handled twice: one dispatch");
        let mut more = events.clone();
        more.push(seen("t1", "image.analyzed", "d"));
        more.push(seen("t1", "task.completed", "e"));
        more.push(seen("t1", "task.created", "a2"));
        let missing = relayed_but_not_stored(&more, &histories);
        assert_eq!(missing.len(), 3, "{missing:?}");
        assert!(missing[0].contains("image.analyzed") && missing[1].contains("task.completed"), "{missing:?}");
        assert!(missing[2].contains("2 task.created event(s) seen, 1"), "{missing:?}");
    }

    #[test]
    fn metrics_are_summed_over_their_labels() {
        let text = "# TYPE x counter\nx_total{to=\"a\"} 2\nx_total{to=\"b\"} 3\nx_total_other 7\nx_total 1\n";
        assert_eq!(metric_sum(text, "x_total"), 6.0);
        assert_eq!(metric_sum(text, "y").to_string(), "0", "absent: 0, not -0");
    }

    #[test]
    fn a_history_is_read_in_version_order() {
        let value = json!({ "entries": [
            { "version": 2, "at": 5, "event": "started", "to": "downloading", "replica": "a" },
            { "version": 1, "at": 4, "event": "created", "to": "queued" },
        ]});
        let entries = parse_history(&value).unwrap();
        assert_eq!(entries[0].event, "created");
        assert_eq!(entries[1].replica.as_deref(), Some("a"));
        assert!(not_completed_once(&entries).is_some());
    }
}
