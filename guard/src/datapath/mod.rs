//! The egress program in the kernel: loading it with its maps (`mod.rs`),
//! attaching it (`attach`), keeping its maps equal to the view (`maps`),
//! pinning it for a no-gap restart (`pins`). It knows nothing of the command
//! line or the sources: it is given a config and a view.

mod apply;
pub mod attach;
pub mod census;
pub mod clients;
pub mod error;
mod filter;
pub mod history;
mod if_tables;
pub mod inspect;
mod map_data;
pub mod maps;
pub mod pins;
pub mod reclaim;
pub mod sys;
#[cfg(feature = "testing")]
mod test_run;
pub mod wire;

pub use attach::AttachMode;
pub use error::DatapathError;
pub use reclaim::CounterReclaimer;
pub use sys::monotonic_ns;
#[cfg(feature = "testing")]
pub use test_run::timed_on;

use error::Result;

use aya::{
    maps::{Array, MapData},
    programs::SchedClassifier,
    Ebpf,
};
use guard_common::{
    Config, LeakAction, Mode, MAP_CONFIG, MAP_COUNTERS, MAP_HEARTBEAT, MAP_LB_IPS, MAP_STATS,
};

use attach::Attachment;
use map_data::map_data;
use maps::Tables;
pub use reclaim::counter_capacity;

/// The program's name in the object file (and, truncated, in `bpftool prog`).
pub const PROGRAM: &str = "arp_guard_egress";

/// The compiled eBPF object, embedded at build time by build.rs (aya-build):
/// the guard and nothing else (test fixtures are in their own object).
pub static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/arp-guard-ebpf"));

/// Heartbeat ages at which the program stops trusting the daemon.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gate {
    /// From here `foreign` is judged as `unknown`.
    pub stale_after: std::time::Duration,
    /// From here everything passes.
    pub dead_after: std::time::Duration,
}

/// What to load and how (from the command line, through the daemon).
#[derive(Debug, Clone)]
pub struct DatapathConfig {
    pub mode: Mode,
    pub leak_action: LeakAction,
    /// Capacity of the LB IP map.
    pub max_lb_ips: u32,
    /// Pin maps, program and TCX links here (a bpffs directory).
    pub pin_dir: Option<std::path::PathBuf>,
    pub attach: AttachMode,
    pub gate: Gate,
    /// Drop events per second per CPU, and the burst.
    pub event_rate: u32,
    pub event_burst: u32,
    /// Load the responder census (an observe-only ingress program).
    pub census: bool,
    /// A silence this long ends a run of claims in the census.
    pub census_window: std::time::Duration,
    /// Copy dropped announcements of foreign IPs to the daemon (HELD), to be
    /// re-sent at a takeover (`--announce-hold` is not 0).
    pub defer: bool,
}

impl Default for DatapathConfig {
    fn default() -> Self {
        DatapathConfig {
            mode: Mode::Enforce,
            leak_action: LeakAction::Rewrite,
            max_lb_ips: guard_common::MAX_LB_IPS,
            pin_dir: None,
            attach: AttachMode::Auto,
            gate: Gate::default(),
            event_rate: 100,
            event_burst: 200,
            census: true,
            census_window: std::time::Duration::from_secs(60),
            defer: false,
        }
    }
}

impl Default for Gate {
    fn default() -> Self {
        Gate {
            stale_after: std::time::Duration::from_secs(15),
            dead_after: std::time::Duration::from_secs(300),
        }
    }
}

pub struct Datapath {
    gate: Gate,
    mode: Mode,
    leak_action: LeakAction,
    ebpf: Ebpf,
    attached: Vec<Attachment>,
    tables: Tables,
    logger: Option<aya_log::EbpfLogger<&'static dyn log::Log>>,
    /// `--pin-dir`: maps, program and TCX links are pinned there.
    pin_dir: Option<std::path::PathBuf>,
    /// Drop events per second per CPU, burst.
    event_rate: (u32, u32),
    /// The census program's links (None: the census is off or did not load).
    census: Option<Vec<census::CensusLink>>,
    census_window: std::time::Duration,
    defer: bool,
    /// Held while we own `pin_dir` (released when we exit).
    _pin_lock: Option<pins::PinLock>,
}

impl Datapath {
    /// Load the program and its maps into the kernel (not attached yet),
    /// reusing (or creating) the maps pinned under `cfg.pin_dir`: a daemon
    /// that restarts finds the policy its predecessor left, intact.
    pub fn load(cfg: &DatapathConfig) -> Result<Self> {
        Self::load_object(cfg, OBJECT)
    }

    /// [`Datapath::load`] with another build of the program (benchmarks time
    /// an earlier revision's object next to today's).
    #[cfg_attr(not(feature = "testing"), allow(dead_code))]
    pub(crate) fn load_object(cfg: &DatapathConfig, object: &[u8]) -> Result<Self> {
        let lb_ips = cfg.max_lb_ips.max(1);
        let pin_dir = cfg.pin_dir.as_deref();
        let lock = match pin_dir {
            Some(dir) => {
                pins::ensure_bpffs(dir)?;
                Some(pins::lock(dir)?)
            }
            None => None,
        };
        if let Some(dir) = pin_dir {
            pins::drop_incompatible_maps(dir, lb_ips);
        }
        let load = |census: bool| {
            let mut loader = aya::EbpfLoader::new();
            loader.map_max_entries(MAP_LB_IPS, lb_ips);
            // Allocated on use: its capacity costs nothing until IPv6 LB IPs come.
            loader.map_max_entries(guard_common::MAP_LB_IPS6, lb_ips);
            loader.map_max_entries(MAP_COUNTERS, counter_capacity(lb_ips));
            census::size_tables(&mut loader, census);
            if let Some(dir) = pin_dir {
                for (name, ..) in pins::pinned_maps(lb_ips) {
                    loader.map_pin_path(name, pins::map_path(dir, name));
                }
            }
            loader.load(object).map_err(error::load_error)
        };
        // The census tables (2.7 MiB, preallocated) must never be what keeps
        // the guard from loading (a tight memlock limit or memory cgroup).
        let (mut ebpf, census_on) = match load(cfg.census) {
            Ok(ebpf) => (ebpf, cfg.census),
            Err(e) if cfg.census => {
                tracing::warn!(error = %format!("{e:#}"), "loading with the responder census failed; loading the guard without it");
                (load(false)?, false)
            }
            Err(e) => return Err(e),
        };
        let logger = program_logger(&mut ebpf);
        let prog: &mut SchedClassifier = ebpf
            .program_mut(PROGRAM)
            .ok_or(DatapathError::NoProgram(PROGRAM))?
            .try_into()?;
        prog.load().map_err(error::load_error)?;
        if let Some(dir) = pin_dir {
            pins::pin_program(prog, dir)?;
        }
        // The census only observes: if it cannot load, the guard goes on without it.
        let census = match census_on.then(|| census::load(&mut ebpf)) {
            Some(Ok(())) => Some(Vec::new()),
            Some(Err(e)) => {
                tracing::warn!(error = %format!("{e:#}"), "the responder census cannot load; guarding without it");
                None
            }
            None => None,
        };
        // Held by the reconciler (written next to LB_IPS); the programs keep
        // their own reference to it.
        let filter = ebpf.take_map(guard_common::MAP_LB_FILTER);
        let foreign = census::foreign_filter(&mut ebpf, census.is_some());
        let mut dp = Datapath {
            census,
            census_window: cfg.census_window,
            defer: cfg.defer,
            event_rate: (cfg.event_rate, cfg.event_burst.max(1)),
            pin_dir: cfg.pin_dir.clone(),
            gate: cfg.gate,
            mode: cfg.mode,
            leak_action: cfg.leak_action,
            ebpf,
            attached: Vec::new(),
            tables: Tables::new(filter, foreign),
            logger,
            _pin_lock: lock,
        };
        dp.write_config()?;
        Ok(dp)
    }

    #[cfg(feature = "testing")]
    /// Mode and leak action (the rest of the program's config stays).
    pub fn set_config(&mut self, mode: Mode, leak_action: LeakAction) -> Result<()> {
        (self.mode, self.leak_action) = (mode, leak_action);
        self.write_config()
    }

    #[cfg(feature = "testing")]
    /// The liveness gate's thresholds (see [`guard_common::liveness`]).
    pub fn set_gate(&mut self, gate: Gate) -> Result<()> {
        self.gate = gate;
        self.write_config()
    }

    /// The program's one `Config` entry, from what we hold.
    fn write_config(&mut self) -> Result<()> {
        let (events_per_sec, events_burst) = self.event_rate;
        let c = Config {
            mode: self.mode as u8,
            leak_action: self.leak_action as u8,
            defer: u8::from(self.defer),
            _pad: [0; 5],
            stale_after_ns: self.gate.stale_after.as_nanos() as u64,
            dead_after_ns: self.gate.dead_after.as_nanos() as u64,
            events_per_sec,
            events_burst,
            census_window_ns: u64::try_from(self.census_window.as_nanos()).unwrap_or(u64::MAX),
        };
        let mut config: Array<&mut MapData, Config> = Array::try_from(self.map_mut(MAP_CONFIG)?)?;
        config.set(0, c, 0)?;
        Ok(())
    }

    /// Take the drop-event ring buffer (once) for a reader task.
    pub fn take_events(&mut self) -> Result<aya::maps::RingBuf<MapData>> {
        self.take_ring(guard_common::MAP_EVENTS)
    }

    /// Take the ring buffer of held announcements (once) for a reader task.
    pub fn take_held(&mut self) -> Result<aya::maps::RingBuf<MapData>> {
        self.take_ring(guard_common::MAP_HELD)
    }

    fn take_ring(&mut self, name: &str) -> Result<aya::maps::RingBuf<MapData>> {
        let map = self
            .ebpf
            .take_map(name)
            .ok_or_else(|| DatapathError::NoMap(name.to_owned()))?;
        Ok(aya::maps::RingBuf::try_from(map)?)
    }

    /// Tell the program the daemon is alive (CLOCK_MONOTONIC, as bpf_ktime_get_ns).
    pub fn heartbeat(&mut self) -> Result<()> {
        self.write_heartbeat(monotonic_ns())
    }

    fn write_heartbeat(&mut self, ns: u64) -> Result<()> {
        let mut hb: Array<&mut MapData, u64> = Array::try_from(self.map_mut(MAP_HEARTBEAT)?)?;
        hb.set(0, ns, 0)?;
        Ok(())
    }

    #[cfg(feature = "testing")]
    /// Write a heartbeat of a given time (tests fake its age).
    pub fn heartbeat_at(&mut self, ns: u64) -> Result<()> {
        self.write_heartbeat(ns)
    }

    /// Kernel memory the program's maps hold (their `memlock` in
    /// /proc/self/fdinfo), for the status.
    pub fn memlock_bytes(&self) -> u64 {
        let ids: std::collections::BTreeSet<u32> = self
            .ebpf
            .maps()
            .filter_map(|(_, m)| map_data(m)?.info().ok())
            .map(|i| i.id())
            .chain(self.tables.filter.map_id())
            .chain(self.tables.foreign.map_id())
            .collect();
        let Ok(dir) = std::fs::read_dir("/proc/self/fdinfo") else {
            return 0;
        };
        let mut seen = std::collections::BTreeSet::new();
        let mut total = 0;
        for e in dir.flatten() {
            let Ok(text) = std::fs::read_to_string(e.path()) else {
                continue;
            };
            let field = |name: &str| {
                text.lines()
                    .find_map(|l| l.strip_prefix(name))
                    .and_then(|v| v.trim().parse::<u64>().ok())
            };
            if let (Some(id), Some(mem)) = (field("map_id:"), field("memlock:")) {
                // Several fds may refer to one map; count it once.
                if ids.contains(&(id as u32)) && seen.insert(id) {
                    total += mem;
                }
            }
        }
        total
    }

    /// The state an LB IP has in the map as last read or written.
    pub fn map_state(&self, ip: std::net::IpAddr) -> Option<guard_common::Ownership> {
        let entry = match ip {
            std::net::IpAddr::V4(v4) => self.tables.lb.applied.get(&u32::from(v4)),
            std::net::IpAddr::V6(v6) => self.tables.lb6.applied.get(&v6.octets()),
        };
        entry.and_then(|e| guard_common::Ownership::from_u8(e.state))
    }

    /// Our COUNTERS and STATS maps on duplicated file descriptors, for
    /// readers on other threads (the API).
    pub fn counter_maps(&self) -> Result<(aya::maps::Map, aya::maps::Map)> {
        Ok((
            aya::maps::Map::PerCpuHashMap(self.dup_map(MAP_COUNTERS)?),
            aya::maps::Map::PerCpuArray(self.dup_map(MAP_STATS)?),
        ))
    }

    /// The IPs the LB maps hold (as last written or read), as counter keys.
    pub fn lb_set(&self) -> std::collections::HashSet<guard_common::IpKey> {
        let t = &self.tables;
        let v4 = t.lb.applied.keys().map(|ip| guard_common::v4_key(*ip));
        v4.chain(t.lb6.applied.keys().copied()).collect()
    }

    /// A reclaimer of counter rows on its own (duplicated) fd of COUNTERS,
    /// to run off the main loop.
    pub fn counter_reclaimer(&self) -> Result<CounterReclaimer> {
        Ok(CounterReclaimer::new(aya::maps::Map::PerCpuHashMap(
            self.dup_map(MAP_COUNTERS)?,
        )))
    }

    /// One of our maps on a duplicated file descriptor. Duplicating an fd we
    /// hold needs no privilege; opening a map by id would need CAP_SYS_ADMIN,
    /// which the DaemonSet does not grant.
    fn dup_map(&self, name: &str) -> Result<MapData> {
        let m = self
            .ebpf
            .map(name)
            .and_then(map_data)
            .ok_or_else(|| DatapathError::NoMap(name.to_owned()))?;
        let fd = std::os::fd::AsFd::as_fd(m.fd())
            .try_clone_to_owned()
            .map_err(|source| DatapathError::DupMap {
                map: name.to_owned(),
                source,
            })?;
        Ok(MapData::from_fd(fd)?)
    }

    /// One of the program's maps, by name (for readers such as the counters).
    pub fn map(&self, name: &str) -> Option<&aya::maps::Map> {
        self.ebpf.map(name)
    }

    /// Forward diagnostics logged by the program with aya-log.
    pub fn flush_program_logs(&mut self) {
        if let Some(l) = self.logger.as_mut() {
            l.flush();
        }
    }

    fn program_mut(&mut self) -> Result<&mut SchedClassifier> {
        let p = self
            .ebpf
            .program_mut(PROGRAM)
            .ok_or(DatapathError::NoProgram(PROGRAM))?;
        Ok(p.try_into()?)
    }

    fn map_mut(&mut self, name: &str) -> Result<&mut aya::maps::Map> {
        self.ebpf
            .map_mut(name)
            .ok_or_else(|| DatapathError::NoMap(name.to_owned()))
    }
}

/// The program's aya-log diagnostics, when the object has them.
fn program_logger(ebpf: &mut Ebpf) -> Option<aya_log::EbpfLogger<&'static dyn log::Log>> {
    match aya_log::EbpfLogger::init(ebpf) {
        Ok(l) => Some(l),
        Err(e) => {
            tracing::debug!(error = %e, "eBPF program diagnostics unavailable");
            None
        }
    }
}
