//! The daemon's memory against its cgroup's limit, as `/status` shows it
//! (the watch itself, its levels and why they are where they are:
//! `guard::telemetry::memory`).

use serde::{Deserialize, Serialize};

/// How close to the limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    /// Under the daemon's warning level (`WARN_AT` of the limit), or no
    /// limit known.
    #[default]
    Ok,
    /// Past the warning level: raise the limit.
    Warning,
    /// Past the pressure level (`PRESSURE_AT`): no new object is taken in.
    Pressure,
}

/// The state as `/status` and `/metrics` show it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryStatus {
    /// Resident memory of the daemon.
    pub rss_bytes: u64,
    /// Kernel memory of its BPF maps (charged to its cgroup too).
    pub maps_bytes: u64,
    /// The cgroup's limit (absent: none found).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit_bytes: Option<u64>,
    pub level: Level,
}

impl MemoryStatus {
    /// What the cgroup counts of this daemon.
    pub fn used(&self) -> u64 {
        self.rss_bytes + self.maps_bytes
    }
}
