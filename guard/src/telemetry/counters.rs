//! Reading and presenting the kernel-side counters.
//!
//! The daemon reads its own maps; `arp-guard counters` finds the program
//! attached to an interface through the kernel (TCX query, then the program's
//! map ids), so it needs nothing from the daemon but the attachment itself.

use std::{collections::BTreeMap, fmt::Write as _};

use anyhow::{anyhow, bail, Context as _, Result};
use aya::{
    maps::{Map, MapData, PerCpuArray, PerCpuHashMap},
    programs::{SchedClassifier, TcAttachType},
};
use guard_common::{CounterKey, CounterValue, Stat, Verdict, MAP_COUNTERS, MAP_STATS};
use serde::{Deserialize, Serialize};

use crate::datapath::{pins::map_path, sys::ifindex, Datapath, PROGRAM};

/// One decision counter, summed over CPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Row {
    pub key: CounterKey,
    pub value: CounterValue,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    pub rows: Vec<Row>,
    pub stats: BTreeMap<&'static str, u64>,
}

/// One decision counter with its labels as names: what `arp-guard counters
/// -o json` prints and what the API's `/counters` serves.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CounterRow {
    #[serde(flatten)]
    pub labels: Labels,
    pub packets: u64,
    pub bytes: u64,
}

/// The counters of one guard, as names (the CLI reads it from the API, from
/// pinned maps, or from the kernel).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CountersDoc {
    pub counters: Vec<CounterRow>,
    pub totals: BTreeMap<String, u64>,
}

/// A counter key's labels as names.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Labels {
    pub lb_ip: String,
    /// "ipv4" (ARP) or "ipv6" (NDP).
    #[serde(default)]
    pub family: String,
    pub interface: String,
    pub kind: String,
    pub origin: String,
    pub state: String,
    pub verdict: String,
}

impl Row {
    pub fn labels(&self) -> Labels {
        let k = self.key;
        let [kind, origin, state, verdict] =
            super::decision_names(k.kind, k.origin, k.state, k.verdict);
        Labels {
            lb_ip: guard_common::ip_of_key(k.ip).to_string(),
            family: guard_common::family(&guard_common::ip_of_key(k.ip)).into(),
            interface: super::interface_name(k.ifindex),
            kind,
            origin,
            state,
            verdict,
        }
    }
}

impl Snapshot {
    /// Read the COUNTERS and STATS maps handed out by `map`.
    pub fn read<'a>(map: impl Fn(&str) -> Result<&'a Map>) -> Result<Self> {
        let rows = Self::rows(map(MAP_COUNTERS)?)?;
        let stats_map: PerCpuArray<&MapData, u64> =
            PerCpuArray::try_from(map(MAP_STATS)?).context("STATS map")?;
        let mut stats = BTreeMap::new();
        for s in Stat::ALL {
            let per_cpu = stats_map.get(&(*s as u32), 0).context("reading STATS")?;
            stats.insert(s.as_str(), per_cpu.iter().sum());
        }
        Ok(Snapshot { rows, stats })
    }

    /// The decision counters of COUNTERS, summed over CPUs, in key order.
    fn rows(map: &Map) -> Result<Vec<Row>> {
        let counters: PerCpuHashMap<&MapData, CounterKey, CounterValue> =
            PerCpuHashMap::try_from(map).context("COUNTERS map")?;
        let mut rows = Vec::new();
        for item in counters.iter() {
            let (key, per_cpu) = item.context("reading COUNTERS")?;
            let mut value = CounterValue::default();
            for v in per_cpu.iter() {
                value.packets += v.packets;
                value.bytes += v.bytes;
            }
            rows.push(Row { key, value });
        }
        rows.sort_by_key(|r| r.key);
        Ok(rows)
    }

    /// Only the decision counters of a loaded datapath (`stats` left
    /// empty): for the tests that judge a frame at a time, for which the
    /// STATS lookups (one system call per statistic) were most of the cost.
    #[cfg(feature = "testing")]
    pub fn rows_of_datapath(dp: &Datapath) -> Result<Self> {
        let map = dp
            .map(MAP_COUNTERS)
            .ok_or_else(|| anyhow!("map {MAP_COUNTERS} missing"))?;
        Ok(Snapshot {
            rows: Self::rows(map)?,
            stats: BTreeMap::new(),
        })
    }

    /// Read the counters of a loaded datapath (the daemon's own).
    pub fn of_datapath(dp: &Datapath) -> Result<Self> {
        Snapshot::read(|name| dp.map(name).ok_or_else(|| anyhow!("map {name} missing")))
    }

    /// Read the counters from the maps a guard pinned under `pin_dir`
    /// (needs read permission on the pins, no capability).
    pub fn of_pins(pin_dir: &std::path::Path) -> Result<Self> {
        let open = |name: &str| -> Result<MapData> {
            let path = map_path(pin_dir, name);
            MapData::from_pin(&path).with_context(|| format!("opening {}", path.display()))
        };
        let counters = Map::PerCpuHashMap(open(MAP_COUNTERS)?);
        let stats = Map::PerCpuArray(open(MAP_STATS)?);
        Snapshot::read(|name| {
            Ok(if name == MAP_COUNTERS {
                &counters
            } else {
                &stats
            })
        })
    }

    /// Read the counters of the arp-guard program attached (TCX) to `iface`'s
    /// egress, found through the kernel. Opening its maps by id needs
    /// CAP_SYS_ADMIN (root on the node; not the DaemonSet's capabilities).
    pub fn of_attached(iface: &str) -> Result<Self> {
        ifindex(iface)?;
        let (_, progs) = SchedClassifier::query_tcx(iface, TcAttachType::Egress)
            .with_context(|| {
                format!("querying the TCX egress programs of {iface} (opening programs and maps by id needs CAP_SYS_ADMIN)")
            })?;
        // The kernel keeps 15 characters of a program's name.
        let prefix = &PROGRAM[..15];
        let Some(prog) = progs
            .iter()
            .find(|p| p.name_as_str().is_some_and(|n| n.starts_with(prefix)))
        else {
            bail!(
                "no arp-guard program is attached to {iface} egress through TCX \
                 (is the daemon running in this network namespace?)"
            );
        };
        Self::of_program(prog)
    }

    /// Read the counters of the loaded program `id` (a netlink filter's, on
    /// kernels without TCX). Needs CAP_SYS_ADMIN, as [`Snapshot::of_attached`].
    pub fn of_program_id(id: u32) -> Result<Self> {
        let prog = aya::programs::loaded_programs()
            .filter_map(|p| p.ok())
            .find(|p| p.id() == id)
            .with_context(|| {
                format!("program id {id} is not among the loaded programs (listing them needs CAP_SYS_ADMIN)")
            })?;
        Self::of_program(&prog)
    }

    fn of_program(prog: &aya::programs::ProgramInfo) -> Result<Self> {
        let ids = prog
            .map_ids()
            .context("listing the program's maps")?
            .unwrap_or_default();
        let mut maps: BTreeMap<String, Map> = BTreeMap::new();
        for id in ids {
            let data = MapData::from_id(id)
                .with_context(|| format!("opening map id {id} (needs CAP_SYS_ADMIN)"))?;
            let name = data
                .info()
                .ok()
                .and_then(|i| i.name_as_str().map(str::to_owned))
                .unwrap_or_default();
            let map = match name.as_str() {
                MAP_COUNTERS => Map::PerCpuHashMap(data),
                MAP_STATS => Map::PerCpuArray(data),
                _ => continue,
            };
            maps.insert(name, map);
        }
        Snapshot::read(|name| {
            maps.get(name)
                .ok_or_else(|| anyhow!("the attached program has no {name} map"))
        })
    }

    #[cfg(feature = "testing")]
    /// Packets counted for this (ip, kind, origin, verdict), over all interfaces and states.
    pub fn packets(
        &self,
        ip: impl Into<std::net::IpAddr>,
        kind: guard_common::Kind,
        origin: guard_common::Origin,
        verdict: Verdict,
    ) -> u64 {
        let key = guard_common::key_of_ip(ip.into());
        self.rows
            .iter()
            .filter(|r| {
                r.key.ip == key
                    && r.key.kind == kind as u8
                    && r.key.origin == origin as u8
                    && r.key.verdict == verdict as u8
            })
            .map(|r| r.value.packets)
            .sum()
    }

    /// Packets per verdict name, over everything.
    pub fn by_verdict(&self) -> BTreeMap<&'static str, u64> {
        let mut m = BTreeMap::new();
        for r in &self.rows {
            *m.entry(Verdict::from_u8(r.key.verdict).map_or("?", Verdict::as_str))
                .or_default() += r.value.packets;
        }
        m
    }

    /// The counters as names.
    pub fn to_doc(&self) -> CountersDoc {
        CountersDoc {
            counters: self
                .rows
                .iter()
                .map(|r| CounterRow {
                    labels: r.labels(),
                    packets: r.value.packets,
                    bytes: r.value.bytes,
                })
                .collect(),
            totals: self
                .stats
                .iter()
                .map(|(k, v)| ((*k).to_owned(), *v))
                .collect(),
        }
    }

    /// A one-line summary for logs.
    pub fn summary(&self) -> String {
        let v: Vec<String> = self
            .by_verdict()
            .iter()
            .map(|(k, n)| format!("{k}={n}"))
            .collect();
        let s: Vec<String> = self.stats.iter().map(|(k, n)| format!("{k}={n}")).collect();
        format!(
            "{} | {}",
            if v.is_empty() {
                "no LB announcements seen".into()
            } else {
                v.join(" ")
            },
            s.join(" ")
        )
    }
}

impl CountersDoc {
    /// Only the rows of `iface` (all with None); the totals stay global (the
    /// program's STATS are not per interface).
    pub fn only(mut self, iface: Option<&str>) -> Self {
        if let Some(i) = iface {
            self.counters.retain(|r| r.labels.interface == i);
        }
        self
    }

    /// A table for a terminal.
    pub fn to_table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{:<16} {:<10} {:<14} {:<8} {:<8} {:<14} {:>10}",
            "LB IP", "INTERFACE", "KIND", "ORIGIN", "STATE", "VERDICT", "PACKETS"
        );
        for r in &self.counters {
            let l = &r.labels;
            let _ = writeln!(
                out,
                "{:<16} {:<10} {:<14} {:<8} {:<8} {:<14} {:>10}",
                l.lb_ip, l.interface, l.kind, l.origin, l.state, l.verdict, r.packets
            );
        }
        if self.counters.is_empty() {
            out.push_str("(no ARP frame from an LB IP seen yet)\n");
        }
        let totals: Vec<String> = self
            .totals
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let _ = writeln!(out, "totals: {}", totals.join(" "));
        out
    }
}
