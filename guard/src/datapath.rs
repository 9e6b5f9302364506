//! Loading the egress program, attaching it, and keeping its maps equal to the view.
//!
//! Map updates are incremental: entries that changed are written in place
//! (one atomic update per key) before stale ones are deleted, so protection for
//! an IP that stays in the view is never absent, not even for one frame.

use std::{collections::BTreeMap, io, net::Ipv4Addr};

use anyhow::{anyhow, bail, Context as _, Result};
use aya::{
    maps::{Array, HashMap, MapData},
    programs::{tc, LinkOrder, SchedClassifier, TcAttachType},
    Ebpf, Pod,
};
use guard_common::{
    Config, CounterKey, CounterValue, IfAddrKey, LbEntry, LeakAction, Mode, MAP_CONFIG,
    MAP_COUNTERS, MAP_HEARTBEAT, MAP_IF_ADDRS, MAP_IF_PRIMARY, MAP_LB_IPS, MAP_STATS,
};

use crate::{cli::AttachArg, counters::Snapshot, view::View};

/// The program's name in the object file (and, truncated, in `bpftool prog`).
pub const PROGRAM: &str = "arp_guard_egress";

/// The compiled eBPF object, embedded at build time by build.rs (aya-build):
/// the guard and nothing else (test fixtures are in their own object).
pub static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/arp-guard-ebpf"));

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttachHow {
    Tcx,
    Netlink,
}

impl AttachHow {
    pub fn as_str(self) -> &'static str {
        match self {
            AttachHow::Tcx => "tcx",
            AttachHow::Netlink => "netlink-clsact",
        }
    }
}

#[derive(Debug)]
pub struct Attachment {
    pub iface: String,
    pub ifindex: u32,
    pub how: AttachHow,
    link: AttachLink,
}

/// Who holds an attachment.
#[derive(Debug)]
enum AttachLink {
    /// The loaded program (netlink filters, and TCX links without pinning).
    Owned(tc::SchedClassifierLinkId),
    /// A TCX link pinned at `path`; our handle keeps an fd to it, the pin
    /// keeps it alive after us.
    Pinned {
        link: aya::programs::links::FdLink,
        path: std::path::PathBuf,
    },
}

/// What one [`Datapath::apply`] changed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ApplyReport {
    pub written: usize,
    pub removed: usize,
    /// Human-readable failures; the entry keeps its old value and the write
    /// is retried.
    pub errors: Vec<String>,
    /// Entries that did not fit in a full map. An LB IP that did not fit is
    /// not in the LB set: its frames pass (fail safe). Retried on the next
    /// change and at each full reconcile.
    pub full: Vec<String>,
}

/// What the maps currently hold, as written by us.
#[derive(Debug, Default)]
struct Applied {
    lb: BTreeMap<u32, LbEntry>,
    if_addrs: BTreeMap<IfAddrKey, u8>,
    if_primary: BTreeMap<u32, u32>,
}

/// Heartbeat ages at which the program stops trusting the daemon.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gate {
    /// From here `foreign` is judged as `unknown`.
    pub stale_after: std::time::Duration,
    /// From here everything passes.
    pub dead_after: std::time::Duration,
}

impl Default for Gate {
    fn default() -> Self {
        Gate {
            stale_after: std::time::Duration::from_secs(15),
            dead_after: std::time::Duration::from_secs(300),
        }
    }
}

/// Rows of the per-IP counter map for a given LB IP capacity: room for
/// several decisions (kinds, origins, verdicts, interfaces) per IP. Rows of
/// IPs that left the LB set are reclaimed ([`Datapath::reclaim_counters`]).
pub fn counter_capacity(lb_ips: u32) -> u32 {
    lb_ips.saturating_mul(4).clamp(1024, 4 * 1024 * 1024)
}

/// CLOCK_MONOTONIC in ns: the clock bpf_ktime_get_ns reads.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

pub struct Datapath {
    /// Entries the last apply could not fit (full map); shown in the status.
    pub not_enforced: usize,
    gate: Gate,
    ebpf: Ebpf,
    attached: Vec<Attachment>,
    applied: Applied,
    logger: Option<aya_log::EbpfLogger<&'static dyn log::Log>>,
    /// `--pin-dir`: maps, program and TCX links are pinned there.
    pin_dir: Option<std::path::PathBuf>,
    /// Drop events per second per CPU, burst.
    event_rate: (u32, u32),
    /// Held while we own `pin_dir` (released when we exit).
    _pin_lock: Option<crate::pins::PinLock>,
}

impl Datapath {
    /// Load the program and its maps into the kernel (not attached yet).
    pub fn load(mode: Mode, leak_action: LeakAction) -> Result<Self> {
        Self::load_with_capacity(mode, leak_action, guard_common::MAX_LB_IPS)
    }

    /// Load with room for `lb_ips` LB IPs in `LB_IPS` (the program's default
    /// is 65,536; fewer saves kernel memory on small nodes).
    pub fn load_with_capacity(mode: Mode, leak_action: LeakAction, lb_ips: u32) -> Result<Self> {
        Self::load_pinned(mode, leak_action, lb_ips, None)
    }

    /// Load, reusing (or creating) the maps pinned under `pin_dir`: a daemon
    /// that restarts finds the policy its predecessor left, intact.
    pub fn load_pinned(
        mode: Mode,
        leak_action: LeakAction,
        lb_ips: u32,
        pin_dir: Option<&std::path::Path>,
    ) -> Result<Self> {
        let lb_ips = lb_ips.max(1);
        let mut loader = aya::EbpfLoader::new();
        loader.map_max_entries(MAP_LB_IPS, lb_ips);
        loader.map_max_entries(MAP_COUNTERS, counter_capacity(lb_ips));
        let lock = match pin_dir {
            Some(dir) => {
                crate::pins::ensure_bpffs(dir)?;
                Some(crate::pins::lock(dir)?)
            }
            None => None,
        };
        if let Some(dir) = pin_dir {
            crate::pins::drop_incompatible_maps(dir, lb_ips);
            for (name, ..) in crate::pins::pinned_maps(lb_ips) {
                loader.map_pin_path(name, crate::pins::map_path(dir, name));
            }
        }
        let mut ebpf = loader
            .load(OBJECT)
            .map_err(|e| explain_load_error(e.into()))?;
        let logger = match aya_log::EbpfLogger::init(&mut ebpf) {
            Ok(l) => Some(l),
            Err(e) => {
                tracing::debug!(error = %e, "eBPF program diagnostics unavailable");
                None
            }
        };
        let prog: &mut SchedClassifier = ebpf
            .program_mut(PROGRAM)
            .ok_or_else(|| anyhow!("program {PROGRAM} missing from the embedded object"))?
            .try_into()?;
        prog.load()
            .map_err(|e| explain_load_error(e.into()))
            .context("loading the egress program")?;
        if let Some(dir) = pin_dir {
            crate::pins::pin_program(prog, dir)?;
        }
        let mut dp = Datapath {
            event_rate: (100, 200),
            pin_dir: pin_dir.map(std::path::Path::to_path_buf),
            not_enforced: 0,
            gate: Gate::default(),
            ebpf,
            attached: Vec::new(),
            applied: Applied::default(),
            logger,
            _pin_lock: lock,
        };
        dp.set_config(mode, leak_action)?;
        Ok(dp)
    }

    pub fn set_config(&mut self, mode: Mode, leak_action: LeakAction) -> Result<()> {
        let (gate, (events_per_sec, events_burst)) = (self.gate, self.event_rate);
        let mut config: Array<&mut MapData, Config> = Array::try_from(self.map_mut(MAP_CONFIG)?)?;
        let c = Config {
            mode: mode as u8,
            leak_action: leak_action as u8,
            _pad: [0; 6],
            stale_after_ns: gate.stale_after.as_nanos() as u64,
            dead_after_ns: gate.dead_after.as_nanos() as u64,
            events_per_sec,
            events_burst,
        };
        config.set(0, c, 0)?;
        Ok(())
    }

    /// The in-kernel rate limit of drop events (per CPU).
    pub fn set_event_rate(&mut self, per_sec: u32, burst: u32) -> Result<()> {
        let rate = (per_sec, burst.max(1));
        self.event_rate = rate;
        let mut config: Array<&mut MapData, Config> = Array::try_from(self.map_mut(MAP_CONFIG)?)?;
        let mut c = config.get(&0, 0)?;
        (c.events_per_sec, c.events_burst) = rate;
        config.set(0, c, 0)?;
        Ok(())
    }

    /// Take the drop-event ring buffer (once) for a reader task.
    pub fn take_events(&mut self) -> Result<aya::maps::RingBuf<MapData>> {
        let map = self
            .ebpf
            .take_map(guard_common::MAP_EVENTS)
            .ok_or_else(|| anyhow!("map EVENTS missing"))?;
        Ok(aya::maps::RingBuf::try_from(map)?)
    }

    /// The liveness gate's thresholds (see [`guard_common::liveness`]).
    pub fn set_gate(&mut self, gate: Gate) -> Result<()> {
        self.gate = gate;
        let mut config: Array<&mut MapData, Config> = Array::try_from(self.map_mut(MAP_CONFIG)?)?;
        let mut c = config.get(&0, 0)?;
        c.stale_after_ns = gate.stale_after.as_nanos() as u64;
        c.dead_after_ns = gate.dead_after.as_nanos() as u64;
        config.set(0, c, 0)?;
        Ok(())
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

    /// Attach to the egress of `iface`.
    pub fn attach(&mut self, iface: &str, how: AttachArg) -> Result<AttachHow> {
        let pin_dir = self.pin_dir.clone();
        let prog = self.program_mut()?;
        // First in the chain at attach time: a program that returns TCX_PASS
        // (Cilium's egress programs do) ends the chain, and the guard must have
        // seen the frame by then. The guard returns TCX_NEXT for what it passes.
        let tcx = || tc::TcAttachOptions::TcxOrder(LinkOrder::first());
        let netlink = |prog: &mut SchedClassifier| attach_netlink(prog, iface);
        let index = ifindex(iface)?;
        if let (Some(dir), false) = (&pin_dir, how == AttachArg::Netlink) {
            match attach_pinned_tcx(prog, iface, index, dir) {
                Ok(link) => {
                    self.attached.push(Attachment {
                        iface: iface.to_owned(),
                        ifindex: index,
                        how: AttachHow::Tcx,
                        link,
                    });
                    return Ok(AttachHow::Tcx);
                }
                Err(e) if how == AttachArg::Tcx => return Err(e),
                Err(e) => {
                    tracing::info!(interface = iface, error = %format!("{e:#}"), "TCX attach failed; falling back to a netlink clsact filter")
                }
            }
        }
        let (link, how) = match how {
            AttachArg::Tcx => (
                prog.attach_with_options(iface, TcAttachType::Egress, tcx())
                    .with_context(|| {
                        format!("attaching to {iface} egress with TCX (needs Linux >= 6.6)")
                    })?,
                AttachHow::Tcx,
            ),
            AttachArg::Netlink => (netlink(prog)?, AttachHow::Netlink),
            AttachArg::Auto => match prog.attach_with_options(iface, TcAttachType::Egress, tcx()) {
                Ok(link) => (link, AttachHow::Tcx),
                Err(tcx_err) => {
                    tracing::info!(interface = iface, error = %tcx_err, "TCX attach failed; falling back to a netlink clsact filter");
                    (netlink(prog)?, AttachHow::Netlink)
                }
            },
        };
        self.attached.push(Attachment {
            iface: iface.to_owned(),
            ifindex: index,
            how,
            link: AttachLink::Owned(link),
        });
        Ok(how)
    }

    /// How the program is attached to `ifindex`, if it is.
    pub fn attached_how(&self, ifindex: u32) -> Option<AttachHow> {
        self.attached
            .iter()
            .find(|a| a.ifindex == ifindex)
            .map(|a| a.how)
    }

    /// Detach from one interface that is still there.
    pub fn detach(&mut self, ifindex: u32) -> Result<()> {
        let Some(pos) = self.attached.iter().position(|a| a.ifindex == ifindex) else {
            return Ok(());
        };
        let a = self.attached.remove(pos);
        self.release(a.link, true)
    }

    /// Let go of an attachment. `detach`: take the guard off the interface
    /// (and remove its pin); else leave it in place (pinned TCX link, or a
    /// netlink filter) for the next daemon to take over.
    fn release(&mut self, link: AttachLink, detach: bool) -> Result<()> {
        match link {
            AttachLink::Owned(id) => {
                let prog = self.program_mut()?;
                if detach {
                    prog.detach(id)?;
                } else {
                    // Taken out of the program and forgotten, so that unloading
                    // the program does not remove the filter.
                    std::mem::forget(prog.take_link(id)?);
                }
            }
            AttachLink::Pinned { link, path } => {
                if detach {
                    match std::fs::remove_file(&path) {
                        Ok(()) => {}
                        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                        Err(e) => {
                            return Err(e).with_context(|| format!("removing {}", path.display()))
                        }
                    }
                }
                // Our fd goes; without the pin this was the last reference.
                drop(link);
            }
        }
        Ok(())
    }

    /// Drop the record of an attachment whose device is gone (the kernel
    /// removed the attachment with it).
    pub fn forget(&mut self, ifindex: u32) {
        let (gone, keep): (Vec<Attachment>, Vec<Attachment>) = std::mem::take(&mut self.attached)
            .into_iter()
            .partition(|a| a.ifindex == ifindex);
        self.attached = keep;
        for a in gone {
            // The kernel side is gone with the device; drop ours (and a stale pin).
            let _ = self.release(a.link, true);
        }
    }

    /// Detach from every interface. Also happens on drop; explicit so that
    /// errors can be logged.
    pub fn detach_all(&mut self) -> Vec<(String, Result<()>)> {
        let attached = std::mem::take(&mut self.attached);
        let mut out: Vec<(String, Result<()>)> = attached
            .into_iter()
            .map(|a| (a.iface, self.release(a.link, true)))
            .collect();
        if let Some(dir) = self.pin_dir.clone() {
            out.push((
                dir.display().to_string(),
                crate::pins::uninstall(&dir).map(|_| ()),
            ));
        }
        out
    }

    /// Leave every attachment and pin in place for the next daemon
    /// (`--on-exit keep`): the program keeps enforcing its last maps, within
    /// the liveness gate's limits.
    pub fn keep_all(&mut self) -> Vec<(String, Result<()>)> {
        let attached = std::mem::take(&mut self.attached);
        attached
            .into_iter()
            .map(|a| {
                let r = match a.link {
                    // Its pin is gone (bpffs was lost): pin it again, or the
                    // link goes with our fd. pin() consumes the handle; if it
                    // fails the link detaches, as it would have anyway.
                    AttachLink::Pinned { link, path } if !path.exists() => link
                        .pin(&path)
                        .map(drop)
                        .map_err(|e| anyhow!("pinning {}: {e}", path.display())),
                    link => self.release(link, false),
                };
                (a.iface, r)
            })
            .collect()
    }

    /// Remove link pins that no attachment of ours uses (interfaces dropped
    /// from `--interface`, or devices gone): their program would otherwise
    /// keep running, unseen, on the shared maps.
    pub fn prune_link_pins(&mut self) -> Vec<String> {
        let Some(dir) = self.pin_dir.clone() else {
            return Vec::new();
        };
        let ours: Vec<std::path::PathBuf> = self
            .attached
            .iter()
            .filter_map(|a| match &a.link {
                AttachLink::Pinned { path, .. } => Some(path.clone()),
                AttachLink::Owned(_) => None,
            })
            .collect();
        let Ok(entries) = std::fs::read_dir(&dir) else {
            return Vec::new();
        };
        let mut pruned = Vec::new();
        for e in entries.flatten() {
            let path = e.path();
            let name = e.file_name().to_string_lossy().into_owned();
            if !name.starts_with("link_") || ours.contains(&path) {
                continue;
            }
            match aya::programs::links::PinnedLink::from_pin(&path).map(|l| l.unpin()) {
                // Unpinned and dropped: detached.
                Ok(Ok(link)) => drop(link),
                _ => {
                    let _ = std::fs::remove_file(&path);
                }
            }
            pruned.push(name);
        }
        pruned
    }

    /// The pins are gone (bpffs unmounted or the directory removed): pin
    /// maps and program again where a bpffs can be had. The datapath itself
    /// never depended on the pins while we run.
    pub fn repin(&mut self) -> Result<()> {
        let Some(dir) = self.pin_dir.clone() else {
            return Ok(());
        };
        crate::pins::ensure_bpffs(&dir)?;
        for (name, ..) in crate::pins::pinned_maps(u32::MAX) {
            let path = crate::pins::map_path(&dir, name);
            if let (false, Some(m)) = (
                path.exists(),
                self.ebpf.map_mut(name).and_then(map_data_mut),
            ) {
                m.pin(&path)
                    .with_context(|| format!("pinning {}", path.display()))?;
            }
        }
        crate::pins::pin_program(self.program_mut()?, &dir)?;
        // Links are not pinned again: aya's pin() consumes the only handle
        // and a failure would take the guard off the interface. Our fds keep
        // them attached while we run; the next start attaches afresh.
        Ok(())
    }

    /// Make the maps hold `view`, touching only what differs. `additive`:
    /// write new and changed entries, delete nothing (while a source has not
    /// synced, pinned entries from the previous daemon stay).
    pub fn apply(&mut self, view: &View, additive: bool) -> ApplyReport {
        let mut report = ApplyReport::default();
        let lb: BTreeMap<u32, LbEntry> = view
            .lb
            .iter()
            .map(|(ip, l)| {
                (
                    u32::from(*ip),
                    LbEntry {
                        state: l.state as u8,
                        _pad: [0; 3],
                    },
                )
            })
            .collect();
        let if_addrs: BTreeMap<IfAddrKey, u8> = view
            .if_addrs
            .iter()
            .map(|(ifindex, a)| {
                (
                    IfAddrKey {
                        ifindex: *ifindex,
                        addr: u32::from(*a),
                    },
                    1,
                )
            })
            .collect();
        let if_primary: BTreeMap<u32, u32> = view
            .if_primary
            .iter()
            .map(|(i, a)| (*i, u32::from(*a)))
            .collect();

        // Addresses first: an LB IP that just appeared on the egress interface
        // must be known as such before its LB entry can make a frame drop.
        let Self { ebpf, applied, .. } = self;
        let mut sync =
            |name: &str, f: &mut dyn FnMut(&mut aya::maps::Map, &mut ApplyReport)| match ebpf
                .map_mut(name)
            {
                Some(m) => f(m, &mut report),
                None => report.errors.push(format!("map {name} missing")),
            };
        sync(MAP_IF_ADDRS, &mut |m, r| {
            sync_map(m, &mut applied.if_addrs, &if_addrs, additive, r, |k| {
                format!("{}", Ipv4Addr::from(k.addr))
            })
        });
        sync(MAP_IF_PRIMARY, &mut |m, r| {
            sync_map(m, &mut applied.if_primary, &if_primary, additive, r, |k| {
                format!("ifindex {k}")
            })
        });
        sync(MAP_LB_IPS, &mut |m, r| {
            sync_map(m, &mut applied.lb, &lb, additive, r, |k| {
                format!("LB IP {}", Ipv4Addr::from(*k))
            })
        });
        report
    }

    /// Re-read what the maps really hold, so that the next [`Datapath::apply`]
    /// repairs any drift (an entry changed or deleted behind our back, e.g.
    /// with bpftool). Returns how many entries differed from our record.
    pub fn reload_from_kernel(&mut self) -> Result<usize> {
        fn read<K: Pod + Ord, V: Pod>(ebpf: &Ebpf, name: &str) -> Result<BTreeMap<K, V>> {
            let map = ebpf
                .map(name)
                .ok_or_else(|| anyhow!("map {name} missing"))?;
            let map: HashMap<&MapData, K, V> = HashMap::try_from(map)?;
            map.iter().map(|r| r.map_err(anyhow::Error::from)).collect()
        }
        let lb: BTreeMap<u32, LbEntry> = read(&self.ebpf, MAP_LB_IPS)?;
        let if_addrs: BTreeMap<IfAddrKey, u8> = read(&self.ebpf, MAP_IF_ADDRS)?;
        let if_primary: BTreeMap<u32, u32> = read(&self.ebpf, MAP_IF_PRIMARY)?;
        let differing = differing(&lb, &self.applied.lb)
            + differing(&if_addrs, &self.applied.if_addrs)
            + differing(&if_primary, &self.applied.if_primary);
        self.applied = Applied {
            lb,
            if_addrs,
            if_primary,
        };
        Ok(differing)
    }

    /// Kernel memory the program's maps hold (their `memlock` in
    /// /proc/self/fdinfo), for the status.
    pub fn memlock_bytes(&self) -> u64 {
        let ids: std::collections::BTreeSet<u32> = self
            .ebpf
            .maps()
            .filter_map(|(_, m)| map_data(m)?.info().ok())
            .map(|i| i.id())
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
    pub fn map_state(&self, ip: std::net::Ipv4Addr) -> Option<guard_common::Ownership> {
        self.applied
            .lb
            .get(&u32::from(ip))
            .and_then(|e| guard_common::Ownership::from_u8(e.state))
    }

    /// Our COUNTERS and STATS maps on duplicated file descriptors, for
    /// readers on other threads (the API).
    pub fn counter_maps(&self) -> Result<(aya::maps::Map, aya::maps::Map)> {
        Ok((
            aya::maps::Map::PerCpuHashMap(self.dup_map(MAP_COUNTERS)?),
            aya::maps::Map::PerCpuArray(self.dup_map(MAP_STATS)?),
        ))
    }

    /// The IPs the LB map holds (as last written or read).
    pub fn lb_set(&self) -> std::collections::HashSet<u32> {
        self.applied.lb.keys().copied().collect()
    }

    /// A reclaimer of counter rows on its own (duplicated) fd of COUNTERS,
    /// to run off the main loop.
    pub fn counter_reclaimer(&self) -> Result<CounterReclaimer> {
        Ok(CounterReclaimer {
            map: aya::maps::Map::PerCpuHashMap(self.dup_map(MAP_COUNTERS)?),
            gone: Default::default(),
        })
    }

    /// One of our maps on a duplicated file descriptor. Duplicating an fd we
    /// hold needs no privilege; opening a map by id would need CAP_SYS_ADMIN,
    /// which the DaemonSet does not grant.
    fn dup_map(&self, name: &str) -> Result<MapData> {
        let m = self
            .ebpf
            .map(name)
            .and_then(map_data)
            .ok_or_else(|| anyhow!("map {name} missing"))?;
        let fd = std::os::fd::AsFd::as_fd(m.fd())
            .try_clone_to_owned()
            .with_context(|| format!("duplicating the fd of map {name}"))?;
        Ok(MapData::from_fd(fd)?)
    }

    /// Sum the kernel-side counters over CPUs.
    pub fn snapshot(&self) -> Result<Snapshot> {
        Snapshot::read(|name| {
            self.ebpf
                .map(name)
                .ok_or_else(|| anyhow!("map {name} missing"))
        })
    }

    #[cfg(feature = "testing")]
    /// Run the loaded program on `frame` with BPF_PROG_TEST_RUN (nothing is
    /// transmitted). Returns the program's return code and the frame as the
    /// program left it. The kernel runs it with the loopback device as the
    /// egress interface and a dummy socket of family AF_UNSPEC, so the frame
    /// counts as kernel-originated.
    pub fn test_run(&self, frame: &[u8]) -> Result<(i32, Vec<u8>)> {
        self.test_run_from(frame, 0)
    }

    #[cfg(feature = "testing")]
    /// The same as a frame that came in through `ingress_ifindex` (non-zero:
    /// a redirected frame, origin `redirect`).
    pub fn test_run_from(&self, frame: &[u8], ingress_ifindex: u32) -> Result<(i32, Vec<u8>)> {
        use aya::programs::{TestRun as _, TestRunOptions};
        let prog = self.program()?;
        let mut out = vec![0u8; frame.len() + 64];
        // The head of a `struct __sk_buff` up to and including `ifindex`:
        // ingress_ifindex sits at offset 36 and is one of the fields
        // BPF_PROG_TEST_RUN copies into the skb (as skb_iif).
        let mut ctx = [0u8; 44];
        ctx[36..40].copy_from_slice(&ingress_ifindex.to_ne_bytes());
        let res = prog
            .test_run(TestRunOptions {
                data_in: Some(frame),
                data_out: Some(&mut out),
                ctx_in: Some(&ctx),
                ..TestRunOptions::new()
            })
            .context("BPF_PROG_TEST_RUN")?;
        out.truncate(res.data_size_out as usize);
        Ok((res.return_value as i32, out))
    }

    #[cfg(feature = "testing")]
    /// Average kernel time of one program run on `frame` over `repeat` runs
    /// (BPF_PROG_TEST_RUN's own timing; for benchmarks).
    pub fn test_run_timed(&self, frame: &[u8], repeat: u32) -> Result<std::time::Duration> {
        use aya::programs::{TestRun as _, TestRunOptions};
        let prog = self.program()?;
        let res = prog
            .test_run(TestRunOptions {
                data_in: Some(frame),
                repeat,
                ..TestRunOptions::new()
            })
            .context("BPF_PROG_TEST_RUN")?;
        Ok(res.duration)
    }

    /// Forward diagnostics logged by the program with aya-log.
    pub fn flush_program_logs(&mut self) {
        if let Some(l) = self.logger.as_mut() {
            l.flush();
        }
    }

    #[cfg(feature = "testing")]
    fn program(&self) -> Result<&SchedClassifier> {
        let p = self
            .ebpf
            .program(PROGRAM)
            .ok_or_else(|| anyhow!("program {PROGRAM} missing"))?;
        Ok(p.try_into()?)
    }

    fn program_mut(&mut self) -> Result<&mut SchedClassifier> {
        let p = self
            .ebpf
            .program_mut(PROGRAM)
            .ok_or_else(|| anyhow!("program {PROGRAM} missing"))?;
        Ok(p.try_into()?)
    }

    fn map_mut(&mut self, name: &str) -> Result<&mut aya::maps::Map> {
        self.ebpf
            .map_mut(name)
            .ok_or_else(|| anyhow!("map {name} missing from the embedded object"))
    }
}

/// Deletes the counter rows of IPs that have been out of the LB map for a
/// grace period (long enough for a scrape to see their last values), so that
/// churn cannot fill the map and leave new IPs uncounted. It walks the whole
/// map, so it runs off the main loop.
pub struct CounterReclaimer {
    map: aya::maps::Map,
    /// LB IPs with counter rows that are no longer in the LB set, and since when.
    gone: std::collections::HashMap<u32, std::time::Instant>,
}

impl CounterReclaimer {
    /// Returns how many rows went.
    pub fn reclaim(
        &mut self,
        lb: &std::collections::HashSet<u32>,
        now: std::time::Instant,
        grace: std::time::Duration,
    ) -> Result<usize> {
        let mut map: aya::maps::PerCpuHashMap<&mut MapData, CounterKey, CounterValue> =
            aya::maps::PerCpuHashMap::try_from(&mut self.map)?;
        let keys: Vec<CounterKey> = map.keys().filter_map(Result::ok).collect();
        let mut gone_now = std::collections::HashSet::new();
        let mut removed = 0;
        for k in keys {
            if lb.contains(&k.ip) {
                continue;
            }
            gone_now.insert(k.ip);
            let since = *self.gone.entry(k.ip).or_insert(now);
            if now.saturating_duration_since(since) >= grace && map.remove(&k).is_ok() {
                removed += 1;
            }
        }
        self.gone.retain(|ip, _| gone_now.contains(ip));
        Ok(removed)
    }
}

/// Entries that differ between what a map holds and our record of it: keys
/// on one side only, and keys whose values differ (by content, so a
/// same-size swap is drift too).
fn differing<K: Ord, V: PartialEq>(kernel: &BTreeMap<K, V>, ours: &BTreeMap<K, V>) -> usize {
    let changed_or_extra = kernel
        .iter()
        .filter(|(k, v)| ours.get(k) != Some(v))
        .count();
    let missing = ours.keys().filter(|k| !kernel.contains_key(k)).count();
    changed_or_extra + missing
}

fn map_data_mut(m: &mut aya::maps::Map) -> Option<&mut MapData> {
    use aya::maps::Map::*;
    match m {
        Array(d) | HashMap(d) | PerCpuArray(d) | PerCpuHashMap(d) | RingBuf(d) => Some(d),
        _ => None,
    }
}

fn map_data(m: &aya::maps::Map) -> Option<&MapData> {
    use aya::maps::Map::*;
    match m {
        Array(d) | HashMap(d) | PerCpuArray(d) | PerCpuHashMap(d) | RingBuf(d) => Some(d),
        _ => None,
    }
}

/// TCX attach with the link pinned at `DIR/link_<ifindex>`. A link pinned
/// there by an earlier daemon is taken over: the new program replaces the old
/// one in that link atomically (BPF_LINK_UPDATE), so the interface is never
/// unguarded.
fn attach_pinned_tcx(
    prog: &mut SchedClassifier,
    iface: &str,
    index: u32,
    dir: &std::path::Path,
) -> Result<AttachLink> {
    use aya::programs::links::{FdLink, PinnedLink};
    let path = crate::pins::link_path(dir, index);
    let adopted = match PinnedLink::from_pin(&path) {
        Ok(old) => {
            let link: tc::SchedClassifierLink = FdLink::from(old)
                .try_into()
                .context("the pinned link is not a TCX link")?;
            Some(prog.attach_to_link(link).with_context(|| {
                format!(
                    "replacing the program in the link pinned at {}",
                    path.display()
                )
            })?)
        }
        Err(_) => None,
    };
    let id = match adopted {
        Some(id) => {
            tracing::info!(interface = iface, pin = %path.display(), "took over the pinned attachment: program replaced atomically");
            id
        }
        None => {
            let _ = std::fs::remove_file(&path); // a stale pin (not a link we can use)
            prog.attach_with_options(
                iface,
                TcAttachType::Egress,
                tc::TcAttachOptions::TcxOrder(LinkOrder::first()),
            )
            .with_context(|| format!("attaching to {iface} egress with TCX (needs Linux >= 6.6)"))?
        }
    };
    let link: FdLink = prog.take_link(id)?.try_into().context("a TCX link")?;
    let link = if path.exists() {
        link
    } else {
        // pin() hands the fd back inside the PinnedLink; we keep it for the
        // life of the daemon, the pin keeps the link after us.
        FdLink::from(
            link.pin(&path)
                .with_context(|| format!("pinning {}", path.display()))?,
        )
    };
    Ok(AttachLink::Pinned { link, path })
}

/// The clsact filter slot arp-guard uses in netlink mode. A fixed slot means a
/// filter left behind by a daemon that was killed (netlink filters, unlike TCX
/// links, outlive their process) is found and replaced, not stacked upon.
pub const NETLINK_PRIORITY: u16 = 1;
pub const NETLINK_HANDLE: tc::TcHandle = tc::TcHandle::new(0, 0xa6d0);

/// A handle on arp-guard's netlink filter slot on `iface` (it may be empty).
fn our_netlink_slot(iface: &str) -> io::Result<tc::SchedClassifierLink> {
    tc::SchedClassifierLink::attached(
        iface,
        TcAttachType::Egress,
        NETLINK_PRIORITY,
        NETLINK_HANDLE,
        None,
    )
}

fn attach_netlink(prog: &mut SchedClassifier, iface: &str) -> Result<tc::SchedClassifierLinkId> {
    // EEXIST: a clsact qdisc is already there (ours from before, or Cilium's).
    if let Err(e) = tc::qdisc_add_clsact(iface) {
        if !is_exists(&e) {
            return Err(anyhow!(e).context(format!("adding a clsact qdisc to {iface}")));
        }
    }
    let options = tc::NlOptions {
        priority: NETLINK_PRIORITY,
        handle: NETLINK_HANDLE,
        ..Default::default()
    };
    match prog.attach_with_options(
        iface,
        TcAttachType::Egress,
        tc::TcAttachOptions::Netlink(options),
    ) {
        Ok(link) => Ok(link),
        Err(e) if is_exists(&e) => {
            // Our slot is taken by an earlier run's filter: swap the program in
            // place (one netlink change, no moment without a guard).
            let old = our_netlink_slot(iface)?;
            let link = prog
                .attach_to_link(old)
                .with_context(|| format!("replacing the guard filter left on {iface}"))?;
            tracing::warn!(
                interface = iface,
                "replaced an arp-guard filter left behind by an earlier run"
            );
            Ok(link)
        }
        Err(e) => Err(anyhow!(e).context(format!(
            "attaching to {iface} egress with a netlink clsact filter"
        ))),
    }
}

/// EEXIST anywhere in an error's chain (netlink errors carry it as text).
fn is_exists(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(err) = cur {
        let io_exists = err
            .downcast_ref::<io::Error>()
            .is_some_and(|io| io.kind() == io::ErrorKind::AlreadyExists);
        if io_exists || err.to_string().contains("File exists") {
            return true;
        }
        cur = err.source();
    }
    false
}

/// Bring `map` (whose content we last wrote as `applied`) to `desired`.
fn sync_map<K: Pod + Ord, V: Pod + PartialEq>(
    map: &mut aya::maps::Map,
    applied: &mut BTreeMap<K, V>,
    desired: &BTreeMap<K, V>,
    additive: bool,
    report: &mut ApplyReport,
    describe: impl Fn(&K) -> String,
) {
    let mut map: HashMap<&mut MapData, K, V> = match HashMap::try_from(map) {
        Ok(m) => m,
        Err(e) => {
            report
                .errors
                .push(format!("opening map {}: {e}", std::any::type_name::<K>()));
            return;
        }
    };
    // Entries that met a full map get a second chance once stale ones are gone.
    let mut full = Vec::new();
    for (k, v) in desired {
        if applied.get(k) == Some(v) {
            continue;
        }
        match map.insert(k, v, 0) {
            Ok(()) => {
                applied.insert(*k, *v);
                report.written += 1;
            }
            Err(e) if is_full(&e) => full.push(*k),
            Err(e) => report
                .errors
                .push(format!("{} not written: {}", describe(k), map_error(&e))),
        }
    }
    let stale: Vec<K> = if additive {
        Vec::new()
    } else {
        applied
            .keys()
            .filter(|k| !desired.contains_key(k))
            .copied()
            .collect()
    };
    for k in stale {
        match map.remove(&k) {
            Ok(()) => {
                applied.remove(&k);
                report.removed += 1;
            }
            Err(e) => {
                report
                    .errors
                    .push(format!("{} not removed: {}", describe(&k), map_error(&e)))
            }
        }
    }
    for k in full {
        let v = &desired[&k];
        match map.insert(k, v, 0) {
            Ok(()) => {
                applied.insert(k, *v);
                report.written += 1;
            }
            Err(e) if is_full(&e) => report.full.push(describe(&k)),
            Err(e) => {
                report
                    .errors
                    .push(format!("{} not written: {}", describe(&k), map_error(&e)))
            }
        }
    }
}

fn is_full(e: &aya::maps::MapError) -> bool {
    matches!(e, aya::maps::MapError::SyscallError(sys) if sys.io_error.raw_os_error() == Some(libc::E2BIG))
}

fn map_error(e: &aya::maps::MapError) -> String {
    let s = e.to_string();
    if let aya::maps::MapError::SyscallError(sys) = e {
        if sys.io_error.raw_os_error() == Some(libc::E2BIG) {
            return "the map is full".into();
        }
        return format!("{s}: {}", sys.io_error);
    }
    s
}

/// Turn the kernel's terse errno into what an operator can act on.
fn explain_load_error(e: anyhow::Error) -> anyhow::Error {
    let io = e.chain().find_map(|c| {
        c.downcast_ref::<aya::sys::SyscallError>()
            .map(|s| s.io_error.raw_os_error())
    });
    let os = io.flatten().or_else(|| {
        e.chain().find_map(|c| {
            c.downcast_ref::<io::Error>()
                .and_then(io::Error::raw_os_error)
        })
    });
    match os {
        Some(libc::EPERM) | Some(libc::EACCES) => {
            e.context("the kernel refused to load the BPF program: run as root or with CAP_BPF, CAP_NET_ADMIN and CAP_PERFMON")
        }
        Some(libc::ENOSYS) => e.context("this kernel has no BPF support (bpf() returned ENOSYS)"),
        Some(libc::EINVAL) => e.context("the kernel rejected the BPF object; arp-guard needs Linux >= 5.15 with BPF_SYSCALL"),
        _ => e,
    }
}

/// Every interface name in this network namespace.
pub fn interface_names() -> Vec<String> {
    let mut out = Vec::new();
    // SAFETY: if_nameindex returns an array terminated by a zero entry, freed below.
    unsafe {
        let list = libc::if_nameindex();
        if list.is_null() {
            return out;
        }
        let mut p = list;
        while (*p).if_index != 0 {
            out.push(
                std::ffi::CStr::from_ptr((*p).if_name)
                    .to_string_lossy()
                    .into_owned(),
            );
            p = p.add(1);
        }
        libc::if_freenameindex(list);
    }
    out
}

/// Remove arp-guard's netlink filter (fixed slot) from `iface`; false if there was none.
pub fn remove_netlink_filter(iface: &str) -> Result<bool> {
    use aya::programs::links::Link as _;
    match our_netlink_slot(iface)?.detach() {
        Ok(()) => Ok(true),
        Err(e) => {
            let msg = format!("{e:#}");
            // No clsact qdisc, or no filter in our slot: nothing to remove.
            if msg.contains("No such file")
                || msg.contains("not found")
                || msg.contains("Qdisc")
                || msg.contains("exist")
            {
                Ok(false)
            } else {
                Err(anyhow!(e).context(format!("removing the netlink filter from {iface}")))
            }
        }
    }
}

/// Check that `iface` exists in this network namespace.
pub fn ifindex(iface: &str) -> Result<u32> {
    let name = std::ffi::CString::new(iface)
        .map_err(|_| anyhow!("interface name {iface:?} contains a NUL byte"))?;
    // SAFETY: `name` is a valid NUL-terminated string for the duration of the call.
    let idx = unsafe { libc::if_nametoindex(name.as_ptr()) };
    if idx == 0 {
        bail!("interface {iface} not found in this network namespace");
    }
    Ok(idx)
}

/// The name of `ifindex` in this network namespace, if it still exists.
pub fn ifname(ifindex: u32) -> Option<String> {
    let mut buf = [0 as libc::c_char; libc::IF_NAMESIZE];
    // SAFETY: buf has IF_NAMESIZE bytes as if_indextoname requires.
    let p = unsafe { libc::if_indextoname(ifindex, buf.as_mut_ptr()) };
    if p.is_null() {
        return None;
    }
    // SAFETY: on success the buffer holds a NUL-terminated name.
    Some(
        unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned(),
    )
}

#[cfg(test)]
mod tests {
    use super::differing;
    use std::collections::BTreeMap;

    #[test]
    fn drift_is_seen_by_content() {
        let ours = BTreeMap::from([(1, 1u8), (2, 1)]);
        assert_eq!(differing(&ours, &ours), 0);
        // Same size, another key: one extra, one missing.
        assert_eq!(differing(&BTreeMap::from([(1, 1), (3, 1)]), &ours), 2);
        // Same keys, another value.
        assert_eq!(differing(&BTreeMap::from([(1, 1), (2, 9)]), &ours), 1);
        assert_eq!(differing(&BTreeMap::new(), &ours), 2);
        assert_eq!(differing(&ours, &BTreeMap::new()), 2);
    }
}
