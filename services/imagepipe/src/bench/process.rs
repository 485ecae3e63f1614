//! What the operating system says about a process: CPU time (`/proc/<pid>/stat`), resident
//! memory now and at its peak (`VmRSS`, `VmHWM` in `/proc/<pid>/status`), and which local
//! process serves a broker or store.

use std::path::PathBuf;
use std::time::Duration;

/// `USER_HZ`: the unit of the CPU times in `/proc/<pid>/stat`, 100 on every Linux ABI.
const TICKS_PER_SECOND: u64 = 100;

/// A process to read figures of: this one, or another by pid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pid {
    /// The calling process.
    Current,
    /// Another process.
    Other(u32),
}

impl Pid {
    fn dir(self) -> PathBuf {
        match self {
            Pid::Current => PathBuf::from("/proc/self"),
            Pid::Other(pid) => PathBuf::from(format!("/proc/{pid}")),
        }
    }
}

/// User plus system CPU time the process has used so far, every thread included; `None` where
/// `/proc` is not readable (not Linux, or the process is gone).
pub fn cpu_time(pid: Pid) -> Option<Duration> {
    let stat = std::fs::read_to_string(pid.dir().join("stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces: count from after it.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(Duration::from_millis((utime + stime) * 1_000 / TICKS_PER_SECOND))
}

/// A memory figure of `/proc/<pid>/status` in bytes: `VmRSS` (resident now) or `VmHWM` (peak).
pub fn memory(pid: Pid, field: MemoryField) -> Option<u64> {
    let status = std::fs::read_to_string(pid.dir().join("status")).ok()?;
    let name = match field {
        MemoryField::Resident => "VmRSS:",
        MemoryField::Peak => "VmHWM:",
    };
    let line = status.lines().find_map(|l| l.strip_prefix(name))?;
    let kib: u64 = line.trim().trim_end_matches("kB").trim().parse().ok()?;
    Some(kib * 1024)
}

/// Resets this process's peak resident set size (`VmHWM`) to its current one, so that the
/// [`MemoryField::Peak`] read later is the peak since now (`5` written to
/// `/proc/self/clear_refs`, Linux 4.0 and later). False where that is not possible.
pub fn reset_peak_memory() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// Which memory figure to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryField {
    /// `VmRSS`: resident set size now.
    Resident,
    /// `VmHWM`: the peak resident set size.
    Peak,
}

/// The one local process whose command name starts with `comm` and whose command line mentions
/// `port` (how `nats-server -p 4222`, `redis-server 127.0.0.1:6379` or
/// `tansu-… --listener-url tcp://127.0.0.1:9092` are started); `None` when there is none, or
/// more than one.
pub fn find_server(comm: &str, port: u16) -> Option<u32> {
    let port = port.to_string();
    let mut found = None;
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        let dir = entry.path();
        if std::fs::read_to_string(dir.join("comm")).ok().is_none_or(|c| !c.trim().starts_with(comm)) {
            continue;
        }
        let cmdline = std::fs::read(dir.join("cmdline")).unwrap_or_default();
        let mentions_port = cmdline.split(|b| *b == 0 || *b == b' ' || *b == b':').any(|arg| arg == port.as_bytes());
        if mentions_port {
            if found.is_some() {
                return None;
            }
            found = Some(pid);
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_cpu_time_and_memory() {
        // CPU time counts in clock ticks, and a loaded machine may not schedule this thread for
        // a while: spin until a tick is charged, failing only if none is within seconds.
        let spin = std::time::Instant::now();
        while cpu_time(Pid::Current).is_none_or(|t| t == Duration::ZERO) {
            assert!(spin.elapsed() < Duration::from_secs(10), "no CPU time charged after 10 s of spinning");
            for _ in 0..100_000 {
                std::hint::black_box(0u64.wrapping_add(1));
            }
        }
        let rss = memory(Pid::Current, MemoryField::Resident).unwrap();
        let peak = memory(Pid::Current, MemoryField::Peak).unwrap();
        assert!(rss > 0 && peak >= rss, "rss {rss} peak {peak}");
    }

    #[test]
    fn the_peak_resets_to_the_current_size() {
        const SPIKE: usize = 64 << 20;
        // Mapped and unmapped here, not through the allocator, which may keep a freed buffer
        // resident (so it would still count in the current size).
        let mut spike = memmap2::MmapMut::map_anon(SPIKE).expect("an anonymous mapping");
        spike.fill(1);
        std::hint::black_box(&spike);
        drop(spike);
        let before = memory(Pid::Current, MemoryField::Peak).unwrap();
        assert!(reset_peak_memory(), "/proc/self/clear_refs takes 5");
        let after = memory(Pid::Current, MemoryField::Peak).unwrap();
        assert!(
            after + SPIKE as u64 / 2 < before,
            "the 64 MiB spike is forgotten: peak {before} before, {after} after"
        );
        assert!(after >= memory(Pid::Current, MemoryField::Resident).unwrap() / 2, "peak {after}");
    }

    #[test]
    fn figures_of_this_process_by_pid_match_self() {
        let pid = Pid::Other(std::process::id());
        assert!(cpu_time(pid).is_some());
        assert!(memory(pid, MemoryField::Peak).is_some());
        assert_eq!(cpu_time(Pid::Other(u32::MAX)), None);
    }
}
