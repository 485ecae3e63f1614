//! The sharded coordinator's scenarios, each one run of real processes (coordinator
//! replicas and the no-op stages) on a real broker and Redis: failover after a kill -9; and
//! balance, a replica joining and a replica paused past its lease, one after the other in
//! one run.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use super::{
    Entry, Feeder, Owners, SHARD_LEASE, SHARDS, VIEW_EVERY, View, Watch, cluster_config, completions_by_replica,
    histories, metric_sum, not_completed_once, now_ms, regained, relayed_but_not_stored, takeovers, tasks,
    writes_without_lease,
};
use crate::backend::{Backend, Cleanup};
use crate::cluster::{Cluster, ClusterConfig, Member, ServiceKind, Signal};
use crate::observe::EventRecorder;
use crate::redis_cluster::RedisCluster;

/// How long after a kill -9 the dead replica's shards must be owned elsewhere: the lease
/// plus 5 s (the issue's bound: a lease, a renewal period and the time to read the store).
const TAKEOVER_WITHIN: Duration = Duration::from_secs(SHARD_LEASE.as_secs() + 5);

/// How long a joining replica may take to own shards.
const JOIN_WITHIN: Duration = Duration::from_secs(30);

/// How long membership may take to settle after a replica starts, dies or wakes up.
const SETTLE_WITHIN: Duration = Duration::from_secs(30);

/// How long the owners must stay unchanged for membership to count as settled: longer than
/// a handover takes (a renewal period, the intake's drain of at most half a lease, the next
/// renewal).
const STABLE: Duration = Duration::from_millis(SHARD_LEASE.as_millis() as u64 + 500);

/// How long a phase's tasks may take to finish once submitted.
const FINISH_WITHIN: Duration = Duration::from_secs(180);

/// A run: the cluster, what it recorded, and its cleanup (dropped last).
struct Run {
    backend: Backend,
    cluster: Cluster,
    recorder: EventRecorder,
    watch: Watch,
    started: Instant,
    _cleanup: Cleanup,
}

impl Run {
    /// Starts `coordinators` replicas and the no-op stages, with an event recorder.
    async fn start(backend: Backend, label: &str, coordinators: usize) -> Self {
        Self::start_with(cluster_config(backend, label, coordinators), coordinators).await
    }

    /// Starts the cluster of `config` (its `coordinators` replicas and the no-op stages), with
    /// an event recorder.
    async fn start_with(config: ClusterConfig, coordinators: usize) -> Self {
        let started = Instant::now();
        let backend = config.backend.clone();
        let cleanup = Cleanup::new(&backend, &config.prefix);
        let recorder = EventRecorder::start(&backend.bus_config(&config.prefix)).await.expect("event recorder");
        let cluster = Cluster::start(config).await.expect("cluster");
        eprintln!("{coordinators} coordinators and the no-op stages ready in {:.1?}", started.elapsed());
        Self { backend, cluster, recorder, watch: Watch::new(), started, _cleanup: cleanup }
    }

    fn prefix(&self) -> String {
        self.cluster.prefix().to_owned()
    }

    /// The coordinator replicas running now.
    fn running(&mut self) -> Vec<Member> {
        let members = self.cluster.members(ServiceKind::Coordinator);
        members.into_iter().filter(|m| self.cluster.is_running(*m)).collect()
    }

    /// Reads `/v1/cluster` from the first of `from` that answers.
    async fn view(&mut self, from: &[Member]) -> View {
        match self.watch.read(&self.cluster, from).await {
            Ok(view) => view,
            Err(reason) => panic!("{reason}"),
        }
    }

    /// The replica id of each of `members`, as `/v1/cluster` announces it at their URLs;
    /// waits until each has announced itself.
    async fn ids(&mut self, members: &[Member], ask: &[Member]) -> BTreeMap<Member, String> {
        let until = Instant::now() + SETTLE_WITHIN;
        loop {
            let view = self.view(ask).await;
            let ids: BTreeMap<Member, String> =
                members.iter().filter_map(|m| Some((*m, view.id_at(&self.cluster.url(*m))?))).collect();
            if ids.len() == members.len() {
                return ids;
            }
            assert!(
                Instant::now() < until,
                "not every replica of {members:?} announced itself within {SETTLE_WITHIN:?}: {:?}",
                view.replicas
            );
            tokio::time::sleep(VIEW_EVERY).await;
        }
    }

    /// Waits until membership settles on exactly `live`: each of them announced, every shard
    /// owned by one of them, shares within one, and no shard changing hands for [`STABLE`];
    /// the settled view, when it was read (Unix ms) and when the shares were first seen as
    /// they stayed.
    async fn settle(&mut self, live: &BTreeSet<String>, ask: &[Member], within: Duration) -> (View, u64, Instant) {
        let called = Instant::now();
        let mut steady: Option<(Owners, Instant)> = None;
        loop {
            let view = self.view(ask).await;
            let reason = match view.settled_on(live) {
                Ok(_) => match &steady {
                    Some((shards, since)) if *shards == view.shards => {
                        if since.elapsed() >= STABLE {
                            return (view, now_ms(), *since);
                        }
                        "not yet steady".to_owned()
                    }
                    _ => {
                        steady = Some((view.shards.clone(), Instant::now()));
                        "just reached".to_owned()
                    }
                },
                Err(reason) => {
                    steady = None;
                    reason
                }
            };
            assert!(
                called.elapsed() < within,
                "membership did not settle on {live:?} within {within:?}: {reason}; {:?}",
                view.owned()
            );
            tokio::time::sleep(VIEW_EVERY).await;
        }
    }

    /// Waits until every task of `ids` has a terminal event, reading `/v1/cluster` from `ask`
    /// meanwhile; panics with how many did.
    async fn finish(&mut self, ids: &BTreeSet<String>, ask: &[Member], what: &str) -> Duration {
        let started = Instant::now();
        let mut next_view = Instant::now();
        loop {
            let done = self.recorder.terminal_among(ids);
            if done == ids.len() {
                return started.elapsed();
            }
            assert!(
                started.elapsed() < FINISH_WITHIN,
                "{what}: {done} of {} tasks finished within {FINISH_WITHIN:?}; last view: {:?}",
                ids.len(),
                self.watch.last().map(View::owned)
            );
            if Instant::now() >= next_view {
                let _ = self.watch.read(&self.cluster, ask).await;
                next_view = Instant::now() + VIEW_EVERY;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Every task of `ids` completed exactly once: one distinct `task.completed` event id,
    /// no `task.failed` or `task.cancelled`, one `completed` entry in its history, which ends
    /// completed. Returns the histories, read from `ask`.
    async fn completed_once(&self, ids: &[String], ask: Member, what: &str) -> BTreeMap<String, Vec<Entry>> {
        let completed = self.recorder.distinct_ids("task.completed");
        let mut wrong: Vec<String> = ids
            .iter()
            .filter_map(|id| {
                let n = completed.get(id).map_or(0, BTreeSet::len);
                (n != 1).then(|| format!("{id}: {n} task.completed event ids"))
            })
            .collect();
        for other in ["task.failed", "task.cancelled"] {
            let ended = self.recorder.distinct_ids(other);
            wrong.extend(ids.iter().filter(|id| ended.contains_key(*id)).map(|id| format!("{id}: {other}")));
        }
        assert!(
            wrong.is_empty(),
            "{what}: {} of {} tasks did not complete once by their events: {:?}",
            wrong.len(),
            ids.len(),
            &wrong[..wrong.len().min(10)]
        );
        let read = histories(&self.cluster, ask, ids).await;
        let wrong: Vec<String> = read
            .iter()
            .filter_map(|(id, entries)| not_completed_once(entries).map(|why| format!("{id}: {why}")))
            .collect();
        assert!(
            wrong.is_empty(),
            "{what}: {} of {} histories without exactly one completion: {:?}",
            wrong.len(),
            ids.len(),
            &wrong[..wrong.len().min(5)]
        );
        read
    }

    /// `/metrics` of `member`, the sum of metric `name`.
    async fn metric(&self, member: Member, name: &str) -> Result<f64, String> {
        Ok(metric_sum(&self.cluster.fetch_text(member, "/metrics").await?, name))
    }

    /// Stops every process with SIGTERM (each must exit 0) and the recorder; the view rules
    /// must have held throughout.
    async fn stop(self) {
        let Self { cluster, recorder, watch, started, .. } = self;
        assert!(watch.violations().is_empty(), "over {} views of /v1/cluster: {:?}", watch.views(), watch.violations());
        let failures = cluster.stop(Duration::from_secs(40)).await;
        recorder.stop().await;
        assert!(failures.is_empty(), "processes that did not stop cleanly on SIGTERM: {failures:?}");
        eprintln!("run done in {:.1?} ({} views of /v1/cluster read)", started.elapsed(), watch.views());
    }
}

/// A run settled on its first replicas, with tasks streaming in and a quarter of them finished:
/// where the failover scenarios strike.
struct MidRun {
    members: Vec<Member>,
    ids: BTreeMap<Member, String>,
    task_ids: Vec<String>,
    all: BTreeSet<String>,
    feeder: Feeder,
    feeding: Instant,
}

impl Run {
    /// Waits until the replicas running now settle, feeds `count` tasks of `phase` at a steady
    /// pace, and returns once a quarter of them finished (more still to be submitted).
    async fn settle_and_feed_a_quarter(&mut self, phase: &str, count: usize) -> MidRun {
        let members = self.running();
        let ids = self.ids(&members, &members).await;
        let live: BTreeSet<String> = ids.values().cloned().collect();
        let (settled, _, _) = self.settle(&live, &members, SETTLE_WITHIN + STABLE).await;
        eprintln!("settled: {:?}", settled.owned());
        let prefix = self.prefix();
        let (task_ids, bodies) = tasks(&prefix, phase, count);
        let all: BTreeSet<String> = task_ids.iter().cloned().collect();
        let submitter = self.backend.submitter(&prefix).await.expect("submitter");
        let feeding = Instant::now();
        let feeder = Feeder::start(submitter, bodies, count / 20, Duration::from_millis(400));
        let until = Instant::now() + FINISH_WITHIN;
        while self.recorder.terminal_among(&all) < count / 4 {
            assert!(Instant::now() < until, "a quarter of the tasks did not finish within {FINISH_WITHIN:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        MidRun { members, ids, task_ids, all, feeder, feeding }
    }
}

/// Three coordinators over `backend` and Redis, `count` tasks submitted at a steady pace as
/// plain JSON; one coordinator is killed with SIGKILL mid-run. Every task completes exactly
/// once (events and histories), every shard the dead replica owned is taken by a live one
/// (handover `expired`, from the dead replica) within the lease plus 5 s of the kill, and the
/// two survivors settle on shares within one of each other.
pub async fn failover_after_kill_9(backend: Backend, count: usize) {
    let mut run = Run::start(backend, "shfail", 3).await;
    let MidRun { members, ids, task_ids, all, feeder, feeding } = run.settle_and_feed_a_quarter("f", count).await;
    let victim = members[1];
    let victim_id = ids[&victim].clone();
    let survivors: Vec<Member> = members.iter().copied().filter(|m| *m != victim).collect();
    let owned = run.view(&members).await.shards_of(&victim_id);
    assert!(!owned.is_empty(), "the victim {victim_id} owns no shard before the kill");
    let killed_at = now_ms();
    run.cluster.kill9(victim).await;
    let (finished, published) = (run.recorder.terminal_among(&all), feeder.published());
    eprintln!(
        "killed {victim:?} ({victim_id}, {} shards) {:.1?} into the run: {finished} of {count} finished, {published} submitted",
        owned.len(),
        feeding.elapsed()
    );
    assert!(finished < count, "the run ended before the kill: make it longer");

    // Every shard of the dead replica owned elsewhere, expired, within the bound.
    let until = Instant::now() + TAKEOVER_WITHIN + Duration::from_secs(10);
    let taken = loop {
        let view = run.view(&survivors).await;
        let taken = takeovers(run.watch.handovers().cloned(), &owned, &victim_id, killed_at);
        let owned_by_survivors = owned.iter().all(|s| view.shards[s].0.as_ref().is_some_and(|o| *o != victim_id));
        if taken.len() == owned.len() && owned_by_survivors {
            break taken;
        }
        let missing: Vec<&u16> = owned.iter().filter(|s| !taken.contains_key(s)).collect();
        assert!(
            Instant::now() < until,
            "shards of the dead replica never taken over: {missing:?}; view: {:?}",
            view.owned()
        );
        tokio::time::sleep(VIEW_EVERY).await;
    };
    let late: Vec<String> = taken
        .values()
        .filter(|h| h.reason != "expired" || h.at.saturating_sub(killed_at) > TAKEOVER_WITHIN.as_millis() as u64)
        .map(|h| format!("shard {} {} after {} ms", h.shard, h.reason, h.at - killed_at))
        .collect();
    assert!(late.is_empty(), "takeovers not by expiry within {TAKEOVER_WITHIN:?} of the kill: {late:?}");
    let slowest = taken.values().map(|h| h.at - killed_at).max().unwrap_or(0);
    eprintln!("the dead replica's {} shards taken over by expiry, the last {slowest} ms after the kill", taken.len());

    let survivor_ids: BTreeSet<String> = survivors.iter().map(|m| ids[m].clone()).collect();
    let (settled, _, _) = run.settle(&survivor_ids, &survivors, SETTLE_WITHIN + STABLE).await;
    eprintln!("settled on the survivors: {:?}", settled.owned());

    feeder.finish().await;
    let took = run.finish(&all, &survivors, "failover").await;
    eprintln!(
        "all {count} tasks finished {:.1?} after the feeder's start ({took:.1?} after its end)",
        feeding.elapsed()
    );
    let read = run.completed_once(&task_ids, survivors[0], "failover").await;
    let writers = completions_by_replica(&read);
    eprintln!("completions by replica: {writers:?}");
    let dead_after: Vec<String> = read
        .iter()
        .flat_map(|(id, entries)| entries.iter().map(move |e| (id, e)))
        .filter(|(_, e)| e.replica.as_deref() == Some(victim_id.as_str()) && e.at > killed_at)
        .map(|(id, e)| format!("{id}: {} at {}", e.event, e.at))
        .collect();
    assert!(dead_after.is_empty(), "transitions written by the dead replica after its kill: {dead_after:?}");
    run.stop().await;
}

/// One run over `backend` and Redis, three phases of `per_phase` tasks:
///
/// 1. **Balance**: three coordinators settle (shares within one); the phase's tasks, submitted
///    at once, complete once each, every transition written by its shard's owner, no shard
///    changing hands, and each replica completes within ±20 % of the mean.
/// 2. **Join**: a fourth replica starts while tasks stream in; it owns shards within 30 s,
///    membership settles on four, every task completes once and the newcomer completes some.
/// 3. **Fencing**: one replica is paused (SIGSTOP) while tasks stream in; the others take its
///    shards when its leases run out; it is resumed (SIGCONT). It wrote no transition on those
///    shards without a lease (history), it owns at most its fair share from then on (views)
///    and by its own account (`imagepipe_coordinator_shards_owned`), and every task
///    completes once.
///
/// Throughout, no fencing token is seen held by two replicas, and none goes down.
pub async fn balance_join_and_fencing(backend: Backend, per_phase: usize) {
    let mut run = Run::start(backend, "shjoin", 3).await;
    let prefix = run.prefix();
    let originals = run.running();
    let mut ids = run.ids(&originals, &originals).await;
    let live: BTreeSet<String> = ids.values().cloned().collect();

    // 1. Balance.
    let (settled, settled_at, _) = run.settle(&live, &originals, SETTLE_WITHIN + STABLE).await;
    let shares = settled.owned();
    eprintln!("balance: settled on {shares:?}");
    let (balance_ids, bodies) = tasks(&prefix, "b", per_phase);
    let balance_set: BTreeSet<String> = balance_ids.iter().cloned().collect();
    run.backend.submitter(&prefix).await.expect("submitter").publish_all(bodies).await.expect("publish submits");
    let took = run.finish(&balance_set, &originals, "balance").await;
    eprintln!("balance: {per_phase} tasks finished in {took:.1?}");
    let moved: Vec<String> = run.watch.handovers().filter(|h| h.at >= settled_at).map(|h| format!("{h:?}")).collect();
    assert!(moved.is_empty(), "balance: shards changed hands with membership settled: {moved:?}");
    let read = run.completed_once(&balance_ids, originals[0], "balance").await;
    let strangers: Vec<String> = read
        .iter()
        .flat_map(|(id, entries)| entries.iter().map(move |e| (id, e)))
        .filter_map(|(id, e)| {
            let owner = settled.shards[&super::shard_of(id)].0.as_deref();
            let writer = e.replica.as_deref()?;
            (Some(writer) != owner).then(|| format!("{id}: {} by {writer}, shard owner {owner:?}", e.event))
        })
        .collect();
    assert!(
        strangers.is_empty(),
        "balance: transitions not written by the shard's owner: {:?}",
        &strangers[..strangers.len().min(10)]
    );
    let handled = completions_by_replica(&read);
    let mean = per_phase as f64 / live.len() as f64;
    let off: Vec<String> = live
        .iter()
        .map(|id| (id, handled.get(id).copied().unwrap_or(0)))
        .filter(|(_, n)| (*n as f64 - mean).abs() > 0.2 * mean)
        .map(|(id, n)| format!("{id}: {n}"))
        .collect();
    eprintln!("balance: completions by replica {handled:?} (mean {mean:.0})");
    assert!(
        off.is_empty(),
        "balance: replicas more than 20 % from the mean of {mean:.0} tasks: {off:?} of {handled:?}"
    );
    // A task's view names its shard and the shard's owner.
    for id in balance_ids.iter().take(10) {
        let task = run.cluster.must_get_json(originals[0], &format!("/v1/tasks/{id}")).await;
        let shard = super::shard_of(id);
        assert_eq!(task["shard"].as_u64(), Some(u64::from(shard)), "{id}: its shard: {task}");
        assert_eq!(task["owner"].as_str(), settled.shards[&shard].0.as_deref(), "{id}: its shard's owner: {task}");
    }

    // 2. Join, while tasks stream in.
    let (join_ids, bodies) = tasks(&prefix, "j", per_phase);
    let join_set: BTreeSet<String> = join_ids.iter().cloned().collect();
    let submitter = run.backend.submitter(&prefix).await.expect("submitter");
    let feeder = Feeder::start(submitter, bodies, per_phase / 20, Duration::from_millis(500));
    while feeder.published() < per_phase / 5 {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let join_started = Instant::now();
    let joined = run.cluster.add_replica(ServiceKind::Coordinator).await.expect("a fourth coordinator");
    let ready = join_started.elapsed();
    let everyone = run.running();
    ids.extend(run.ids(&[joined], &originals).await);
    let joined_id = ids[&joined].clone();
    let owning = loop {
        let view = run.view(&everyone).await;
        let owned = view.shards_of(&joined_id).len();
        if owned > 0 {
            break join_started.elapsed();
        }
        assert!(
            join_started.elapsed() < JOIN_WITHIN,
            "join: {joined_id} owns no shard {JOIN_WITHIN:?} after starting: {:?}",
            view.owned()
        );
        tokio::time::sleep(VIEW_EVERY).await;
    };
    let live: BTreeSet<String> = everyone.iter().map(|m| ids[m].clone()).collect();
    let (settled, _, reached) = run.settle(&live, &everyone, JOIN_WITHIN + STABLE).await;
    let settled_after = reached.duration_since(join_started);
    assert!(settled_after <= JOIN_WITHIN, "join: settled only {settled_after:?} after the start");
    let share = settled.shards_of(&joined_id).len();
    eprintln!(
        "join: {joined:?} ({joined_id}) ready after {ready:.1?}, owned shards after {owning:.1?}, {share} after {settled_after:.1?} \
         (feeder at {} of {per_phase}): {:?}",
        feeder.published(),
        settled.owned()
    );
    feeder.finish().await;
    let took = run.finish(&join_set, &everyone, "join").await;
    eprintln!("join: all {per_phase} tasks finished {took:.1?} after the last submit");
    let read = run.completed_once(&join_ids, originals[0], "join").await;
    let handled = completions_by_replica(&read);
    eprintln!("join: completions by replica {handled:?}");
    assert!(
        handled.get(&joined_id).copied().unwrap_or(0) > 0,
        "join: the newcomer {joined_id} completed no task: {handled:?}"
    );

    // 3. Fencing: a replica paused past its lease, while tasks stream in.
    let (fence_ids, bodies) = tasks(&prefix, "x", per_phase);
    let fence_set: BTreeSet<String> = fence_ids.iter().cloned().collect();
    let submitter = run.backend.submitter(&prefix).await.expect("submitter");
    let feeder = Feeder::start(submitter, bodies, per_phase / 20, Duration::from_millis(500));
    while feeder.published() < per_phase / 5 {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let paused = originals[2];
    let paused_id = ids[&paused].clone();
    let others: Vec<Member> = everyone.iter().copied().filter(|m| *m != paused).collect();
    let owned = run.view(&others).await.shards_of(&paused_id);
    assert!(!owned.is_empty(), "fencing: {paused_id} owns no shard before the pause");
    let stopped_at = now_ms();
    run.cluster.signal(paused, Signal::SIGSTOP).expect("SIGSTOP");
    let until = Instant::now() + TAKEOVER_WITHIN + Duration::from_secs(10);
    let taken = loop {
        let view = run.view(&others).await;
        let taken = takeovers(run.watch.handovers().cloned(), &owned, &paused_id, stopped_at);
        let owned_by_others = owned.iter().all(|s| view.shards[s].0.as_ref().is_some_and(|o| *o != paused_id));
        if taken.len() == owned.len() && owned_by_others {
            break taken;
        }
        let missing: Vec<&u16> = owned.iter().filter(|s| !taken.contains_key(s)).collect();
        assert!(
            Instant::now() < until,
            "fencing: shards of the paused replica never taken over: {missing:?}; view: {:?}",
            view.owned()
        );
        tokio::time::sleep(VIEW_EVERY).await;
    };
    let slowest = taken.values().map(|h| h.at - stopped_at).max().unwrap_or(0);
    let not_expired: Vec<&super::Handover> = taken.values().filter(|h| h.reason != "expired").collect();
    assert!(
        not_expired.is_empty(),
        "fencing: the paused replica's shards were taken other than by expiry: {not_expired:?}"
    );
    let continued_at = now_ms();
    run.cluster.signal(paused, Signal::SIGCONT).expect("SIGCONT");
    eprintln!(
        "fencing: paused {paused:?} ({paused_id}, {} shards) for {} ms; its shards taken by expiry, the last {slowest} ms after the pause",
        owned.len(),
        continued_at - stopped_at
    );

    // Woken up: at most its fair share in every view, by its own account too, and settled.
    let fair = usize::from(SHARDS).div_ceil(everyone.len());
    let woke = Instant::now();
    let mut own_account = None;
    let (settled, _) = loop {
        let view = run.view(&everyone).await;
        let holds = view.shards_of(&paused_id).len();
        assert!(holds <= fair, "fencing: the woken replica owns {holds} shards, more than its fair share {fair}");
        if own_account.is_none()
            && let Ok(says) = run.metric(paused, "imagepipe_coordinator_shards_owned").await
            && says as usize <= fair
        {
            own_account = Some((says, woke.elapsed()));
        }
        if own_account.is_some() && view.settled_on(&live).is_ok() {
            break (view, now_ms());
        }
        assert!(
            woke.elapsed() < SETTLE_WITHIN,
            "fencing: not settled with the woken replica within {SETTLE_WITHIN:?} (it says it owns {own_account:?}): {:?}",
            view.owned()
        );
        tokio::time::sleep(VIEW_EVERY).await;
    };
    let (says, after) = own_account.expect("read above");
    eprintln!(
        "fencing: the woken replica said it owns {says} shards {after:.1?} after SIGCONT; settled on {:?} {:.1?} after it",
        settled.owned(),
        woke.elapsed()
    );
    feeder.finish().await;
    let took = run.finish(&fence_set, &everyone, "fencing").await;
    eprintln!("fencing: all {per_phase} tasks finished {took:.1?} after the last submit");
    let read = run.completed_once(&fence_ids, others[0], "fencing").await;
    // From when a new lease of its own may cover its writes again on each shard taken from it.
    let retaken: BTreeMap<u16, u64> = taken
        .iter()
        .filter_map(|(shard, h)| Some((*shard, regained(run.watch.handovers(), *shard, &paused_id, h.at)?)))
        .collect();
    let taken_at: BTreeMap<u16, u64> = taken.iter().map(|(s, h)| (*s, h.at)).collect();
    let unleased = writes_without_lease(&read, &paused_id, &taken_at, &retaken);
    assert!(unleased.is_empty(), "fencing: the paused replica wrote without its lease: {unleased:?}");
    let by_paused: usize = read
        .iter()
        .filter(|(id, _)| taken_at.contains_key(&super::shard_of(id)))
        .flat_map(|(_, entries)| entries.iter())
        .filter(|e| e.replica.as_deref() == Some(paused_id.as_str()))
        .count();
    let fenced = run.metric(paused, "imagepipe_coordinator_writes_fenced_total").await.unwrap_or(f64::NAN);
    eprintln!(
        "fencing: completions by replica {:?}; on its former shards the paused replica wrote {by_paused} transitions, none \
         unleased ({} shards taken back since); the store refused {fenced} of its writes",
        completions_by_replica(&read),
        retaken.len()
    );
    run.stop().await;
}

/// Three coordinators over `backend` with their state on a Redis Cluster of the test's own
/// (three primaries, three replicas) and `store.redis.min_replicas = 1`; `count` tasks
/// submitted at a steady pace. Once a quarter finished, the primary serving the most shards
/// is killed with SIGKILL; its replica is promoted, and the killed node is started again once
/// it was (it rejoins as the new primary's replica). Every task completes exactly once, and
/// no transition whose event or command went out is missing from the store (each task's
/// history against the events seen): what `min_replicas = 1` promises.
pub async fn redis_failover(backend: Backend, count: usize) {
    let mut redis = RedisCluster::start().await.expect("a Redis Cluster of the test's own");
    let config = cluster_config(backend, "rdfail", 3)
        .env("IMAGEPIPE_STORE__REDIS__URL", redis.url())
        .env("IMAGEPIPE_STORE__REDIS__MIN_REPLICAS", "1")
        // A store write can wait out the failover (up to the client's 30 s per request): the
        // 5 s of the other scenarios, five deliveries, dead-lettered a submit mid-failover.
        .env("IMAGEPIPE_WORKER__ACK_WAIT", "15s");
    let mut run = Run::start_with(config, 3).await;
    let MidRun { members, task_ids, all, feeder, feeding, .. } = run.settle_and_feed_a_quarter("r", count).await;
    let prefix = run.prefix();

    // The primary serving the most shards' slots (every key of a shard's tasks and its lease).
    let shard_keys: Vec<String> = (0..SHARDS).map(|s| format!("{{{prefix}:s{s}}}")).collect();
    let (victim, served) = redis.primary_serving_most(&shard_keys).await.expect("the shards' primaries");
    let replica = redis.replica_of(victim).await.expect("the victim's replica");
    redis.kill9(victim).await;
    let killed = Instant::now();
    let (finished, published) = (run.recorder.terminal_among(&all), feeder.published());
    eprintln!(
        "killed the Redis primary 127.0.0.1:{victim} ({served} of {SHARDS} shards) {:.1?} into the run: \
         {finished} of {count} finished, {published} submitted",
        feeding.elapsed()
    );
    assert!(finished < count, "the run ended before the kill: make it longer");
    if let Err(e) = redis.wait_promoted(victim, replica).await {
        panic!("{e}\n{}", redis.log_tail(replica, 30));
    }
    let promoted = killed.elapsed();
    redis.restart(victim).await.expect("the killed node starts again");
    redis.wait_healthy(3).await.expect("the killed node rejoins as a replica in sync");
    eprintln!(
        "127.0.0.1:{replica} promoted {promoted:.1?} after the kill; the killed node back as its replica, in sync, {:.1?} after it",
        killed.elapsed()
    );

    feeder.finish().await;
    let took = run.finish(&all, &members, "redis failover").await;
    eprintln!(
        "all {count} tasks finished {:.1?} after the feeder's start ({took:.1?} after its end)",
        feeding.elapsed()
    );
    let read = run.completed_once(&task_ids, members[0], "redis failover").await;
    let lost = run.recorder.inspect(|seen| relayed_but_not_stored(seen, &read));
    assert!(
        lost.is_empty(),
        "{} events went out whose transition the promoted replica does not have: {:?}",
        lost.len(),
        &lost[..lost.len().min(10)]
    );
    let unreplicated = run.metric(members[0], "imagepipe_coordinator_unreplicated_batches_total").await;
    eprintln!(
        "every event seen has its transition stored; completions by replica {:?}; batches not replicated in time \
         (retried) on the first replica: {unreplicated:?}",
        completions_by_replica(&read)
    );
    run.stop().await;
}
