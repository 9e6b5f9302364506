//! Writing the view into the maps: the whole view ([`Datapath::apply`]) or
//! the LB entries one change touched ([`Datapath::apply_changes`]), IPv4 LB
//! IPs into `LB_IPS` (behind its filter), IPv6 ones into `LB_IPS6`; and the
//! re-read of what the kernel really holds.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
};

use guard_common::{LbEntry, MAP_LB_FILTER, MAP_LB_IPS, MAP_LB_IPS6};

use super::{
    error::{DatapathError, Result},
    maps::{ApplyReport, Lb6Hooks, LbHooks},
    Datapath,
};
use crate::model::view::View;

impl Datapath {
    /// Make the maps hold `view`, touching only what differs. `additive`:
    /// write new and changed entries, delete nothing (while a source has not
    /// synced, pinned entries from the previous daemon stay).
    pub fn apply(&mut self, view: &View, additive: bool) -> ApplyReport {
        let (mut lb, mut lb6) = (BTreeMap::new(), BTreeMap::new());
        for (ip, l) in &view.lb {
            let entry = LbEntry::new(l.state);
            match ip {
                IpAddr::V4(v4) => lb.insert(u32::from(*v4), entry),
                IpAddr::V6(v6) => lb6.insert(v6.octets(), entry),
            };
        }
        let mut report = ApplyReport::default();
        // Addresses first: an LB IP that just appeared on the egress interface
        // must be known as such before its LB entry can make a frame drop.
        self.write_addresses(view, additive, &mut report);
        let Self { ebpf, tables, .. } = self;
        let t = tables;
        let mut hooks = LbHooks {
            filter: &mut t.filter,
            foreign: &mut t.foreign,
        };
        let lb_map = ebpf.map_mut(MAP_LB_IPS);
        t.lb.reconcile(lb_map, &lb, additive, &mut report, &mut hooks);
        let mut hooks6 = Lb6Hooks(&mut t.foreign);
        let lb6_map = ebpf.map_mut(MAP_LB_IPS6);
        t.lb6
            .reconcile(lb6_map, &lb6, additive, &mut report, &mut hooks6);
        t.foreign.flush();
        report
    }

    /// Make the maps hold `view` where it may differ from what was written:
    /// the LB entries of `changed` only (written, or deleted when no longer
    /// in the view), and the uplinks' few addresses in full. The
    /// periodic [`Datapath::apply`] after [`Datapath::reload_from_kernel`]
    /// stays the safety net that repairs anything else.
    pub fn apply_changes(
        &mut self,
        view: &View,
        changed: &BTreeSet<IpAddr>,
        additive: bool,
    ) -> ApplyReport {
        let mut report = ApplyReport::default();
        self.write_addresses(view, additive, &mut report);
        let Self { ebpf, tables, .. } = self;
        let t = tables;
        let entry = |ip: &IpAddr| view.lb.get(ip).map(|l| LbEntry::new(l.state));
        let lb = changed.iter().filter_map(|ip| match ip {
            IpAddr::V4(v4) => Some((u32::from(*v4), entry(ip))),
            IpAddr::V6(_) => None,
        });
        let mut hooks = LbHooks {
            filter: &mut t.filter,
            foreign: &mut t.foreign,
        };
        let lb_map = ebpf.map_mut(MAP_LB_IPS);
        t.lb.apply_keys(lb_map, lb, additive, &mut report, &mut hooks);
        let lb6 = changed.iter().filter_map(|ip| match ip {
            IpAddr::V6(v6) => Some((v6.octets(), entry(ip))),
            IpAddr::V4(_) => None,
        });
        let lb6_map = ebpf.map_mut(MAP_LB_IPS6);
        let mut hooks6 = Lb6Hooks(&mut t.foreign);
        t.lb6
            .apply_keys(lb6_map, lb6, additive, &mut report, &mut hooks6);
        t.foreign.flush();
        report
    }

    /// Entries that did not fit in a full map at the last apply; shown in
    /// the status as not enforced.
    pub fn not_enforced(&self) -> usize {
        let t = &self.tables;
        t.lb.full() + t.lb6.full() + t.if_addrs.full() + t.if_primary.full() + t.vlan_uppers.full()
    }

    /// Re-read what the maps really hold, so that the next [`Datapath::apply`]
    /// repairs any drift (an entry changed or deleted behind our back, e.g.
    /// with bpftool). Returns how many entries differed from our record.
    pub fn reload_from_kernel(&mut self) -> Result<usize> {
        let Self { ebpf, tables, .. } = self;
        let lb = tables.lb.reload(ebpf)?;
        // The filter must stand for what LB_IPS now holds (a pinned map from
        // the previous daemon, or entries changed behind our back), whatever
        // happens to the other reloads.
        if let Err(e) = tables.filter.rebuild(tables.lb.applied.keys().copied()) {
            // Some bits may be missing for entries we hold: forget that we
            // hold them, so that the next apply writes every entry again and
            // sets each one's bit first (in place, no gap).
            tables.lb.applied.clear();
            return Err(DatapathError::WriteMap {
                map: MAP_LB_FILTER,
                source: e.into(),
            });
        }
        let lb6 = tables.lb6.reload(ebpf)?;
        // Observe-only: a failed rebuild costs uncounted packets, retried at
        // the next reload.
        if let Err(e) = tables
            .foreign
            .rebuild(tables.foreign_ips().collect::<Vec<_>>().into_iter())
        {
            tracing::debug!(error = %e, "writing the census's foreign filter");
        }
        Ok(lb
            + lb6
            + tables.if_addrs.reload(ebpf)?
            + tables.if_primary.reload(ebpf)?
            + tables.vlan_uppers.reload(ebpf)?)
    }
}
