//! The census program on the ingress of each uplink, and the
//! reader of its responder table (its table of misdirected clients is read
//! by `clients.rs`). Observe-only and never pinned: it lives with the
//! daemon (a restart starts new tables), and anything that goes wrong with
//! it is logged and leaves the guard itself untouched.

use aya::{
    maps::{HashMap, Map, MapData, PerCpuArray},
    programs::{tc, LinkOrder, SchedClassifier, TcAttachType},
};
use guard_common::{
    CensusStat, ResponderKey, ResponderValue, MAP_CENSUS_STATS, MAP_RESPONDERS, MAX_RESPONDERS,
};

use super::{
    attach::{attach_netlink, AttachHow, AttachMode},
    error::{DatapathError, Result},
    Datapath,
};
use crate::model::census::CensusEntry;

/// The census program's name in the object file.
pub const CENSUS_PROGRAM: &str = "arp_guard_census";

/// The census on one interface.
#[derive(Debug)]
pub(super) struct CensusLink {
    ifindex: u32,
    id: tc::SchedClassifierLinkId,
}

/// The census as a TCX link, first in the ingress chain.
fn attach_tcx(prog: &mut SchedClassifier, iface: &str) -> Result<tc::SchedClassifierLinkId> {
    prog.attach_with_options(
        iface,
        TcAttachType::Ingress,
        tc::TcAttachOptions::TcxOrder(LinkOrder::first()),
    )
    .map_err(|e| DatapathError::Tcx {
        iface: iface.to_owned(),
        source: Box::new(e),
    })
}

/// The census's tables as the object declares them, or, without the census
/// (the object always has them), one entry each: unused, they hold nothing.
pub(super) fn size_tables(loader: &mut aya::EbpfLoader, census: bool) {
    if census {
        return;
    }
    for map in [
        guard_common::MAP_RESPONDERS,
        guard_common::MAP_CLIENTS,
        guard_common::MAP_FOREIGN_FILTER,
    ] {
        loader.map_max_entries(map, 1);
    }
}

/// The census's foreign filter, taken out of the object for the writer
/// (the program keeps its own reference); None when the census is off.
pub(super) fn foreign_filter(ebpf: &mut aya::Ebpf, census: bool) -> Option<Map> {
    let map = ebpf.take_map(guard_common::MAP_FOREIGN_FILTER);
    map.filter(|_| census)
}

/// Load the census program beside the guard; its maps are the object's own
/// (LB_IPS and CONFIG shared with the guard).
pub(super) fn load(ebpf: &mut aya::Ebpf) -> Result<()> {
    let prog: &mut SchedClassifier = ebpf
        .program_mut(CENSUS_PROGRAM)
        .ok_or(DatapathError::NoProgram(CENSUS_PROGRAM))?
        .try_into()?;
    prog.load().map_err(super::error::load_error)
}

impl Datapath {
    /// Is the census loaded (it may still be attached nowhere)?
    pub fn census_loaded(&self) -> bool {
        self.census.is_some()
    }

    /// Put the census on the ingress of `iface`, as the guard is put on its
    /// egress (`how`): a TCX link first in the chain (Linux >= 6.6), so that
    /// it sees a frame before a program that consumes it (a datapath ARP
    /// responder ends the chain), whose link goes with our fds however the
    /// daemon ends; else a netlink clsact filter in arp-guard's fixed slot
    /// on ingress, replaced in place by the next start (never stacked). A
    /// filter left by a killed daemon only observes: it stops nothing, and
    /// `arp-guard uninstall` removes it.
    pub fn attach_census(
        &mut self,
        iface: &str,
        ifindex: u32,
        how: AttachMode,
    ) -> Result<AttachHow> {
        self.detach_census(ifindex);
        let prog = self.census_program_mut()?;
        let netlink =
            |prog: &mut SchedClassifier| attach_netlink(prog, iface, TcAttachType::Ingress);
        let (id, how) = match how {
            AttachMode::Tcx => (attach_tcx(prog, iface)?, AttachHow::Tcx),
            AttachMode::Netlink => (netlink(prog)?, AttachHow::Netlink),
            AttachMode::Auto => match attach_tcx(prog, iface) {
                Ok(id) => (id, AttachHow::Tcx),
                Err(e) => {
                    tracing::debug!(interface = iface, error = %format!("{e:#}"), "census: TCX attach failed; a netlink clsact filter instead");
                    (netlink(prog)?, AttachHow::Netlink)
                }
            },
        };
        if let Some(links) = self.census.as_mut() {
            links.push(CensusLink { ifindex, id });
        }
        // A census filter a killed daemon left in our netlink slot (an
        // earlier `--attach netlink`) would observe on beside the TCX link.
        if how == AttachHow::Tcx
            && super::attach::remove_netlink_filter(iface, TcAttachType::Ingress).unwrap_or(false)
        {
            tracing::info!(
                interface = iface,
                "removed a census filter an earlier run left on ingress"
            );
        }
        Ok(how)
    }

    /// Take the census off one interface (best effort: it only observes).
    pub fn detach_census(&mut self, ifindex: u32) {
        let Some(links) = self.census.as_mut() else {
            return;
        };
        let (gone, keep): (Vec<CensusLink>, Vec<CensusLink>) = std::mem::take(links)
            .into_iter()
            .partition(|l| l.ifindex == ifindex);
        *links = keep;
        for l in gone {
            if let Ok(prog) = self.census_program_mut() {
                if let Err(e) = prog.detach(l.id) {
                    tracing::debug!(ifindex, error = %e, "census detach");
                }
            }
        }
    }

    /// Take the census off everywhere (its TCX links would go with our fds
    /// anyway, its netlink filters would not; explicit, so that it is gone
    /// before the process is).
    pub(super) fn detach_census_all(&mut self) {
        let all: Vec<u32> = self.census.iter().flatten().map(|l| l.ifindex).collect();
        for i in all {
            self.detach_census(i);
        }
    }

    /// A reader of the census table on fds of its own, for a task off the
    /// main loop.
    pub fn census_reader(&self) -> Result<CensusReader> {
        if self.census.is_none() {
            return Err(DatapathError::CensusNotLoaded);
        }
        Ok(CensusReader {
            responders: Map::LruHashMap(self.dup_map(MAP_RESPONDERS)?),
            stats: Map::PerCpuArray(self.dup_map(MAP_CENSUS_STATS)?),
        })
    }

    #[cfg(feature = "testing")]
    pub(super) fn census_program(&self) -> Result<&SchedClassifier> {
        let p = self
            .ebpf
            .program(CENSUS_PROGRAM)
            .ok_or(DatapathError::NoProgram(CENSUS_PROGRAM))?;
        Ok(p.try_into()?)
    }

    fn census_program_mut(&mut self) -> Result<&mut SchedClassifier> {
        let p = self
            .ebpf
            .program_mut(CENSUS_PROGRAM)
            .ok_or(DatapathError::NoProgram(CENSUS_PROGRAM))?;
        Ok(p.try_into()?)
    }
}

/// At most `capacity` of `seen` (sorted by IP and MAC), the newest: a walk
/// that the kernel restarted (its key evicted under a flood of claims)
/// also returns entries evicted while it ran, more than the table can
/// hold; the LRU table keeps the newest, so those are what it holds.
fn newest_that_fit(mut seen: Vec<CensusEntry>, capacity: usize) -> Vec<CensusEntry> {
    if seen.len() > capacity {
        seen.sort_by_key(|c| std::cmp::Reverse(c.last_ns));
        seen.truncate(capacity);
        seen.sort_by_key(|c| (c.ip, c.mac));
    }
    seen
}

/// The census table and its totals, read from userspace.
pub struct CensusReader {
    responders: Map,
    stats: Map,
}

impl CensusReader {
    /// Every entry of the table. Bounded: a table that churns under the walk
    /// (the kernel restarts a walk whose key was evicted) is read at most
    /// twice its capacity of entries.
    pub fn claims(&self) -> Result<Vec<CensusEntry>> {
        let map: HashMap<&MapData, ResponderKey, ResponderValue> =
            HashMap::try_from(&self.responders)?;
        let mut out = Vec::new();
        for item in map.iter().take(2 * MAX_RESPONDERS as usize) {
            // An entry evicted between the key walk and its lookup is skipped.
            let Ok((k, v)) = item else { continue };
            out.push(CensusEntry {
                ip: guard_common::ip_of_key(k.ip),
                mac: k.mac,
                first_ns: v.first_ns,
                last_ns: v.last_ns,
                count: v.count,
                ifindex: v.ifindex,
                kinds: v.kinds,
            });
        }
        out.sort_by_key(|c| (c.ip, c.mac));
        out.dedup_by_key(|c| (c.ip, c.mac));
        Ok(newest_that_fit(out, MAX_RESPONDERS as usize))
    }

    /// The census totals, summed over CPUs.
    pub fn stats(&self) -> Result<Vec<(&'static str, u64)>> {
        let map: PerCpuArray<&MapData, u64> = PerCpuArray::try_from(&self.stats)?;
        CensusStat::ALL
            .iter()
            .map(|s| Ok((s.as_str(), map.get(&(*s as u32), 0)?.iter().sum())))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(last: u8, last_ns: u64) -> CensusEntry {
        CensusEntry {
            ip: std::net::Ipv4Addr::new(198, 51, 100, 7).into(),
            mac: [2, 0, 0, 0, 0, last],
            first_ns: 0,
            last_ns,
            count: 1,
            ifindex: 2,
            kinds: 1,
        }
    }

    #[test]
    fn a_walk_that_saw_more_than_the_table_holds_keeps_the_newest() {
        let seen: Vec<_> = (0..6)
            .map(|i| entry(i, [5, 1, 4, 2, 6, 3][i as usize]))
            .collect();
        let kept = newest_that_fit(seen.clone(), 3);
        let macs: Vec<u8> = kept.iter().map(|c| c.mac[5]).collect();
        // last_ns 5, 4 and 6: MACs ...:00, ...:02, ...:04, in (IP, MAC) order.
        assert_eq!(macs, [0, 2, 4]);
        assert_eq!(newest_that_fit(seen.clone(), 6), seen, "fits: unchanged");
    }
}
