//! The daemon's memory against its cgroup's limit. On every node at once,
//! a limit crossed is an OOM kill everywhere: the guard gone cluster-wide.
//! So it watches what the kernel will count (its resident memory plus the
//! BPF maps' kernel memory, which the memory cgroup charges too) against
//! the limit (cgroup v2 `memory.max`, or v1 `memory.limit_in_bytes`, the
//! lowest on the way up to the root), and:
//!
//! - from [`WARN_AT`] of the limit, warns (log once, `/status`, `/metrics`);
//! - from [`PRESSURE_AT`], degrades: the Kubernetes feed takes in no *new*
//!   object (a new LB Service is not guarded, its frames pass, as with a
//!   full map) while every IP already guarded stays as it is and keeps
//!   following its owner (changes, renewals and deletions are applied);
//! - below [`CLEAR_AT`], takes in again (the streams that skipped objects
//!   are relisted).

use std::path::{Path, PathBuf};

/// How often the memory is looked at (a read of /proc/self/statm and of
/// the limit file: microseconds).
pub const PERIOD: std::time::Duration = std::time::Duration::from_secs(5);

/// Fractions of the limit (per mille) where the state changes.
pub const WARN_AT: u64 = 800;
pub const PRESSURE_AT: u64 = 900;
pub const CLEAR_AT: u64 = 750;

/// Where the limit comes from, and how much it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limit {
    pub bytes: u64,
    pub file: PathBuf,
}

/// The state as `/status` and `/metrics` show it (wire types: its level is
/// [`Level`], from [`WARN_AT`] and [`PRESSURE_AT`] of the limit).
pub use guard_wire::memory::{Level, MemoryStatus};

/// The next level from `prev` at `used` of `limit` bytes (hysteresis: a
/// level is left only well below where it was entered).
pub fn level(prev: Level, used: u64, limit: Option<u64>) -> Level {
    let Some(limit) = limit.filter(|l| *l > 0) else {
        return Level::Ok;
    };
    let per_mille = used.saturating_mul(1000) / limit;
    match (prev, per_mille) {
        (_, p) if p >= PRESSURE_AT => Level::Pressure,
        (Level::Pressure, p) if p >= CLEAR_AT => Level::Pressure,
        (_, p) if p >= WARN_AT => Level::Warning,
        (Level::Warning, p) if p >= CLEAR_AT => Level::Warning,
        _ => Level::Ok,
    }
}

/// One sample: the resident memory now, `maps_bytes` of BPF maps, the
/// limit under `root` (read each time: a pod's limit can be resized in
/// place), the level from the previous sample's.
pub fn sample(root: &Path, maps_bytes: u64, first: Option<&MemoryStatus>) -> MemoryStatus {
    let prev = first.map_or(Level::Ok, |l| l.level);
    let rss_bytes = rss_bytes().unwrap_or(0);
    let limit = find_limit(root);
    if first.is_none() {
        match &limit {
            Some(l) => tracing::info!(
                limit_mib = mib(l.bytes), file = %l.file.display(),
                "memory limit found: warning from 80 % of it, no new Kubernetes object taken in from 90 %"
            ),
            None => {
                tracing::info!(cgroup_root = %root.display(), "no memory limit found: memory is not watched against one")
            }
        }
    }
    let limit_bytes = limit.map(|l| l.bytes);
    MemoryStatus {
        rss_bytes,
        maps_bytes,
        limit_bytes,
        level: level(prev, rss_bytes + maps_bytes, limit_bytes),
    }
}

/// Log a sample's level when it differs from the previous sample's.
pub fn log_level(prev: Option<&MemoryStatus>, s: &MemoryStatus) {
    let prev = prev.map_or(Level::Ok, |l| l.level);
    if s.level != prev {
        let (used_mib, limit_mib) = (mib(s.used()), s.limit_bytes.map_or(0.0, mib));
        match s.level {
            Level::Pressure => tracing::warn!(
                used_mib, limit_mib,
                "memory near the cgroup limit: no new Kubernetes object is taken in \
                 (a new LB Service is not guarded, its frames pass) until it drops; \
                 every IP already guarded stays guarded. Raise resources.limits.memory (docs/sizing.md)"
            ),
            Level::Warning => tracing::warn!(
                used_mib, limit_mib,
                "memory approaching the cgroup limit; raise resources.limits.memory (docs/sizing.md)"
            ),
            Level::Ok => tracing::info!(used_mib, limit_mib, "memory well under the cgroup limit again"),
        }
    }
}

fn mib(b: u64) -> f64 {
    (b as f64 / (1u64 << 20) as f64 * 10.0).round() / 10.0
}

/// Resident memory of this process (/proc/self/statm).
pub fn rss_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Some(pages * u64::try_from(page).ok()?)
}

/// This process's memory limit under `root` (the cgroup file system's
/// mount, /sys/fs/cgroup; tests pass a fake tree): cgroup v2 `memory.max`,
/// else v1 `memory.limit_in_bytes`, the lowest from its cgroup up to the
/// root. None: no limit (or none readable).
pub fn find_limit(root: &Path) -> Option<Limit> {
    let cgroups = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    limit_in(root, &cgroups)
}

/// [`find_limit`] for a given /proc/self/cgroup text.
pub fn limit_in(root: &Path, cgroups: &str) -> Option<Limit> {
    let mut v2 = None;
    let mut v1 = None;
    for line in cgroups.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(ctrls), Some(path)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        if id == "0" && ctrls.is_empty() {
            v2 = Some(path);
        } else if ctrls.split(',').any(|c| c == "memory") {
            v1 = Some(path);
        }
    }
    let v2 = v2.and_then(|p| lowest(root, p, "memory.max"));
    v2.or_else(|| lowest(&root.join("memory"), v1?, "memory.limit_in_bytes"))
}

/// The lowest limit in `file` from `root/path` up to `root`.
fn lowest(root: &Path, path: &str, file: &str) -> Option<Limit> {
    let mut dir = root.join(path.trim_start_matches('/'));
    let mut best: Option<Limit> = None;
    loop {
        let f = dir.join(file);
        if let Some(bytes) = read_limit(&f) {
            if best.as_ref().is_none_or(|b| bytes < b.bytes) {
                best = Some(Limit { bytes, file: f });
            }
        }
        if dir == root || !dir.pop() || !dir.starts_with(root) {
            return best;
        }
    }
}

/// A limit file: a number of bytes; `max` (v2) or a near-2^63 value (v1)
/// is no limit.
fn read_limit(f: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(f).ok()?;
    let v: u64 = text.trim().parse().ok()?;
    (v < 1 << 62).then_some(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_with_hysteresis() {
        let l = |prev, used| level(prev, used, Some(1000));
        assert_eq!(l(Level::Ok, 799), Level::Ok);
        assert_eq!(l(Level::Ok, 800), Level::Warning);
        assert_eq!(l(Level::Ok, 900), Level::Pressure);
        assert_eq!(l(Level::Pressure, 800), Level::Pressure, "not left at 80 %");
        assert_eq!(l(Level::Pressure, 749), Level::Ok);
        assert_eq!(l(Level::Warning, 760), Level::Warning);
        assert_eq!(
            level(Level::Pressure, 5000, None),
            Level::Ok,
            "no limit known"
        );
    }

    #[test]
    fn the_lowest_limit_on_the_way_up() {
        let dir = std::env::temp_dir().join(format!("arp-guard-cg-{}", std::process::id()));
        let leaf = dir.join("kubepods/pod1/c1");
        std::fs::create_dir_all(&leaf).unwrap();
        std::fs::write(leaf.join("memory.max"), "max\n").unwrap();
        std::fs::write(dir.join("kubepods/pod1/memory.max"), "268435456\n").unwrap();
        std::fs::write(dir.join("kubepods/memory.max"), "8589934592\n").unwrap();
        let got = limit_in(&dir, "0::/kubepods/pod1/c1\n").unwrap();
        assert_eq!(got.bytes, 268435456);
        assert!(got.file.ends_with("kubepods/pod1/memory.max"));
        // cgroup v1 (no v2 limit anywhere on the way up).
        let v1 = dir.join("memory/kubepods/pod2");
        std::fs::create_dir_all(&v1).unwrap();
        std::fs::write(v1.join("memory.limit_in_bytes"), "134217728\n").unwrap();
        std::fs::write(
            dir.join("memory/memory.limit_in_bytes"),
            "9223372036854771712\n",
        )
        .unwrap();
        let got = limit_in(&dir, "4:memory:/kubepods/pod2\n0::/nowhere\n").unwrap();
        assert_eq!(got.bytes, 134217728);
        assert_eq!(limit_in(&dir, "4:cpu:/x\n"), None);
        // A cgroup namespace: the process's own cgroup is the root.
        std::fs::write(dir.join("memory.max"), "1048576\n").unwrap();
        assert_eq!(limit_in(&dir, "0::/\n").unwrap().bytes, 1048576);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
