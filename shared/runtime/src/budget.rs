//! A byte-weighted memory budget: work that holds large buffers (decoding an image) asks the
//! budget for their bytes first and waits while other holders would push it over.
//!
//! The budget counts in KiB permits of a fair (first come, first served) [`Semaphore`], so a
//! large request at the head of the queue is not overtaken by smaller ones. A request larger
//! than the whole budget is clamped to the whole budget: it runs alone, neither refused nor
//! left waiting forever. The size of one image is bounded by the pixel limits, not here.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Metric names of memory budgets; each carries the budget's name in the [`BUDGET`] label.
pub mod metrics {
    /// Bytes granted to permits not yet dropped.
    pub const IN_USE_BYTES: &str = "imagepipe_memory_budget_in_use_bytes";
    /// The budget's capacity in bytes.
    pub const CAPACITY_BYTES: &str = "imagepipe_memory_budget_capacity_bytes";
    /// Requests that had to wait for other holders to release their bytes.
    pub const WAITS: &str = "imagepipe_memory_budget_waits_total";
    /// Requests waiting now.
    pub const WAITING: &str = "imagepipe_memory_budget_waiting";
    /// Seconds a request that had to wait waited.
    pub const WAIT_DURATION: &str = "imagepipe_memory_budget_wait_seconds";
    /// Label: the budget's name (`metadata`, `ai`).
    pub const BUDGET: &str = "budget";
}

/// Bytes per semaphore permit: KiB keep a multi-GiB request within the `u32` permits one
/// acquisition may take.
const UNIT: u64 = 1024;

/// A budget's default capacity is the memory available to the process divided by this.
pub const DEFAULT_DIVISOR: u64 = 4;

/// Smallest capacity the configuration accepts (16 MiB).
pub const MIN_CAPACITY: u64 = 16 << 20;

/// Memory assumed where neither `/proc/meminfo` nor a cgroup limit can be read.
const ASSUMED_MEMORY: u64 = 4 << 30;

/// A per-process budget of bytes, shared by cloning (see the module docs).
#[derive(Debug, Clone)]
pub struct MemoryBudget {
    name: &'static str,
    semaphore: Arc<Semaphore>,
    units: u32,
    waiting: Arc<AtomicUsize>,
}

impl MemoryBudget {
    /// A budget of `bytes` (rounded down to whole KiB, at least one) reported under `name`.
    pub fn new(name: &'static str, bytes: u64) -> Self {
        let units = u32::try_from(bytes / UNIT).unwrap_or(u32::MAX).max(1);
        ::metrics::gauge!(metrics::CAPACITY_BYTES, metrics::BUDGET => name).set(u64::from(units) as f64 * UNIT as f64);
        Self { name, semaphore: Arc::new(Semaphore::new(units as usize)), units, waiting: Arc::default() }
    }

    /// The budget's name, as in its metrics.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Bytes the budget holds in all.
    pub fn capacity(&self) -> u64 {
        u64::from(self.units) * UNIT
    }

    /// Bytes granted to permits not yet dropped.
    pub fn in_use(&self) -> u64 {
        (u64::from(self.units) - self.semaphore.available_permits() as u64) * UNIT
    }

    /// Requests waiting for their bytes now.
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Relaxed)
    }

    /// Waits until `bytes` (rounded up to whole KiB; clamped to the whole budget) are free and
    /// takes them until the permit is dropped. Cancel-safe: dropping the future takes nothing.
    pub async fn acquire(&self, bytes: u64) -> MemoryPermit {
        let units = u32::try_from(bytes.div_ceil(UNIT)).unwrap_or(u32::MAX).min(self.units);
        let permit = match self.semaphore.clone().try_acquire_many_owned(units) {
            Ok(permit) => permit,
            Err(_) => {
                ::metrics::counter!(metrics::WAITS, metrics::BUDGET => self.name).increment(1);
                let started = Instant::now();
                let _waiting = Waiting::start(self);
                let permit = self
                    .semaphore
                    .clone()
                    .acquire_many_owned(units)
                    .await
                    .expect("a budget's semaphore is never closed");
                ::metrics::histogram!(metrics::WAIT_DURATION, metrics::BUDGET => self.name)
                    .record(started.elapsed().as_secs_f64());
                permit
            }
        };
        let granted = MemoryPermit { _permit: permit, bytes: u64::from(units) * UNIT, budget: self.name };
        ::metrics::gauge!(metrics::IN_USE_BYTES, metrics::BUDGET => self.name).increment(granted.bytes as f64);
        granted
    }
}

/// One request in [`MemoryBudget::waiting`] and the [`metrics::WAITING`] gauge while it lives.
struct Waiting {
    count: Arc<AtomicUsize>,
    budget: &'static str,
}

impl Waiting {
    fn start(budget: &MemoryBudget) -> Self {
        budget.waiting.fetch_add(1, Ordering::Relaxed);
        ::metrics::gauge!(metrics::WAITING, metrics::BUDGET => budget.name).increment(1.0);
        Self { count: budget.waiting.clone(), budget: budget.name }
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        self.count.fetch_sub(1, Ordering::Relaxed);
        ::metrics::gauge!(metrics::WAITING, metrics::BUDGET => self.budget).decrement(1.0);
    }
}

/// Bytes taken from a [`MemoryBudget`], given back when dropped.
#[derive(Debug)]
pub struct MemoryPermit {
    _permit: OwnedSemaphorePermit,
    bytes: u64,
    budget: &'static str,
}

impl MemoryPermit {
    /// Bytes this permit holds: the request rounded up to whole KiB, at most the whole budget.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl Drop for MemoryPermit {
    fn drop(&mut self) {
        ::metrics::gauge!(metrics::IN_USE_BYTES, metrics::BUDGET => self.budget).decrement(self.bytes as f64);
    }
}

/// The default capacity of a budget: [`process_memory`] / [`DEFAULT_DIVISOR`], at least
/// [`MIN_CAPACITY`].
pub fn default_capacity() -> u64 {
    (process_memory() / DEFAULT_DIVISOR).max(MIN_CAPACITY)
}

/// The memory this process may use: the machine's (`MemTotal` of `/proc/meminfo`), or its
/// cgroup's limit when lower (cgroup v2 `memory.max` or v1 `memory.limit_in_bytes` of the
/// process's cgroup and its ancestors); 4 GiB where neither can be read. Read once.
pub fn process_memory() -> u64 {
    static MEMORY: OnceLock<u64> = OnceLock::new();
    *MEMORY.get_or_init(|| {
        let read = |path: &str| std::fs::read_to_string(Path::new(path)).ok();
        let total = read("/proc/meminfo").as_deref().and_then(mem_total);
        let limit = read("/proc/self/cgroup").and_then(|cgroups| cgroup_limit(&cgroups, read));
        [total, limit].into_iter().flatten().min().unwrap_or(ASSUMED_MEMORY)
    })
}

/// `MemTotal` of a `/proc/meminfo` text, in bytes.
fn mem_total(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find_map(|line| line.strip_prefix("MemTotal:"))?;
    let kib = line.trim().strip_suffix("kB")?.trim().parse::<u64>().ok()?;
    kib.checked_mul(1024)
}

/// The lowest memory limit of the cgroups a `/proc/self/cgroup` text names, and of their
/// ancestors, through `read` (a file's contents by path). `max` (v2) and unreadable files are no
/// limit; v1's "unlimited" is a huge number, which the caller's `MemTotal` undercuts.
fn cgroup_limit(self_cgroup: &str, read: impl Fn(&str) -> Option<String>) -> Option<u64> {
    let mut lowest: Option<u64> = None;
    for line in self_cgroup.lines() {
        let mut fields = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (fields.next(), fields.next(), fields.next()) else { continue };
        let (root, file) = if controllers.is_empty() {
            ("/sys/fs/cgroup", "memory.max")
        } else if controllers.split(',').any(|c| c == "memory") {
            ("/sys/fs/cgroup/memory", "memory.limit_in_bytes")
        } else {
            continue;
        };
        let mut dir = path.trim_end_matches('/');
        loop {
            let limit = read(&format!("{root}{dir}/{file}")).and_then(|text| text.trim().parse::<u64>().ok());
            lowest = lowest.into_iter().chain(limit).min();
            let Some((parent, _)) = dir.rsplit_once('/') else { break };
            dir = parent;
        }
    }
    lowest
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::time::Duration;

    use super::*;

    const MIB: u64 = 1 << 20;

    #[tokio::test(start_paused = true)]
    async fn requests_that_together_exceed_the_budget_run_one_after_the_other() {
        let budget = MemoryBudget::new("test", 100 * MIB);
        let first = budget.acquire(60 * MIB).await;
        assert_eq!((first.bytes(), budget.in_use()), (60 * MIB, 60 * MIB));

        let second = tokio::spawn({
            let budget = budget.clone();
            async move { budget.acquire(60 * MIB).await }
        });
        tokio::task::yield_now().await;
        assert_eq!(budget.waiting(), 1, "60 + 60 MiB do not fit in 100 MiB");
        // A small request queued behind the large one does not overtake it.
        let small = tokio::spawn({
            let budget = budget.clone();
            async move { budget.acquire(MIB).await }
        });
        tokio::time::sleep(Duration::from_secs(3600)).await;
        assert!(!second.is_finished() && !small.is_finished());
        assert_eq!(budget.waiting(), 2);

        drop(first);
        let second = second.await.unwrap();
        assert_eq!(budget.in_use(), 61 * MIB, "the queued requests both fit now");
        assert_eq!(budget.waiting(), 0);
        drop(small.await.unwrap());
        drop(second);
        assert_eq!(budget.in_use(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn dropping_a_permit_or_a_waiting_request_releases_its_bytes() {
        let budget = MemoryBudget::new("test", 10 * MIB);
        let held = budget.acquire(10 * MIB).await;
        let waiting = budget.acquire(MIB);
        assert!(tokio::time::timeout(Duration::from_secs(1), waiting).await.is_err(), "the budget is full");
        assert_eq!(budget.waiting(), 0, "the abandoned request waits no more");
        drop(held);
        assert_eq!(budget.in_use(), 0, "the abandoned request took nothing");
        let again = budget.acquire(10 * MIB).await;
        assert_eq!(again.bytes(), 10 * MIB);
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_larger_than_the_budget_runs_alone() {
        let budget = MemoryBudget::new("test", 10 * MIB);
        let huge = budget.acquire(u64::MAX).await;
        assert_eq!((huge.bytes(), budget.in_use()), (10 * MIB, 10 * MIB), "clamped to the whole budget");
        let other = budget.acquire(1);
        assert!(tokio::time::timeout(Duration::from_secs(1), other).await.is_err(), "nothing runs beside it");
        drop(huge);
        let tiny = budget.acquire(1).await;
        assert_eq!(tiny.bytes(), UNIT, "rounded up to a whole KiB");
        assert_eq!(budget.acquire(0).await.bytes(), 0);
    }

    #[test]
    fn capacity_is_whole_kib_and_never_zero() {
        assert_eq!(MemoryBudget::new("test", 10 * MIB + 1000).capacity(), 10 * MIB);
        assert_eq!(MemoryBudget::new("test", 0).capacity(), UNIT);
    }

    #[test]
    fn mem_total_is_read_in_bytes() {
        let meminfo = "MemTotal:       24684084 kB\nMemFree:        21460280 kB\n";
        assert_eq!(mem_total(meminfo), Some(24_684_084 * 1024));
        assert_eq!(mem_total("MemFree: 1 kB\n"), None);
    }

    #[test]
    fn the_lowest_limit_of_the_cgroup_and_its_ancestors_counts() {
        let files: HashMap<&str, &str> = HashMap::from([
            ("/sys/fs/cgroup/memory.max", "max\n"),
            ("/sys/fs/cgroup/app/memory.max", "2147483648\n"),
            ("/sys/fs/cgroup/app/worker/memory.max", "max\n"),
            ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n"),
            ("/sys/fs/cgroup/memory/job/memory.limit_in_bytes", "1073741824\n"),
        ]);
        let read = |path: &str| files.get(path).map(|text| text.to_string());
        assert_eq!(cgroup_limit("0::/app/worker\n", read), Some(2 << 30), "v2: the parent's limit");
        assert_eq!(cgroup_limit("0::/\n", read), None, "v2: max is no limit");
        assert_eq!(cgroup_limit("4:memory:/job\n3:cpu:/other\n", read), Some(1 << 30), "v1");
        assert_eq!(cgroup_limit("4:cpu,memory:/\n", read), Some(9_223_372_036_854_771_712), "v1 unlimited");
        assert_eq!(cgroup_limit("0::/unknown\n", read), None);
    }

    #[test]
    fn the_default_is_a_share_of_the_process_memory() {
        assert_eq!(default_capacity(), (process_memory() / DEFAULT_DIVISOR).max(MIN_CAPACITY));
        assert!(process_memory() > 0);
    }
}
