//! The uplinks' tables: their addresses (the "LB IP on the
//! egress interface" rule), the address an announce leak is rewritten to,
//! and the VLAN devices stacked on them. A few entries per interface,
//! written in full on every apply.

use std::collections::BTreeMap;

use guard_common::{IfAddrKey, VlanKey, MAP_IF_ADDRS, MAP_IF_PRIMARY, MAP_VLAN_UPPERS};

use super::{
    maps::{ApplyReport, NoHook},
    Datapath,
};
use crate::model::view::View;

impl Datapath {
    /// The uplinks' addresses and primaries, in full (a few per
    /// interface).
    pub(super) fn write_addresses(
        &mut self,
        view: &View,
        additive: bool,
        report: &mut ApplyReport,
    ) {
        let if_addrs: BTreeMap<IfAddrKey, u8> = view
            .if_addrs
            .iter()
            .map(|(ifindex, a)| (IfAddrKey::new(*ifindex, *a), 1))
            .collect();
        let if_primary: BTreeMap<u32, u32> = view
            .if_primary
            .iter()
            .map(|(i, a)| (*i, u32::from(*a)))
            .collect();
        let Self { ebpf, tables, .. } = self;
        tables.if_addrs.reconcile(
            ebpf.map_mut(MAP_IF_ADDRS),
            &if_addrs,
            additive,
            report,
            &mut NoHook,
        );
        tables.if_primary.reconcile(
            ebpf.map_mut(MAP_IF_PRIMARY),
            &if_primary,
            additive,
            report,
            &mut NoHook,
        );
        let vlan_uppers: BTreeMap<VlanKey, u32> = view
            .vlan_uppers
            .iter()
            .map(|((lower, vid), dev)| {
                let key = VlanKey {
                    lower: *lower,
                    vid: u32::from(*vid),
                };
                (key, *dev)
            })
            .collect();
        tables.vlan_uppers.reconcile(
            ebpf.map_mut(MAP_VLAN_UPPERS),
            &vlan_uppers,
            additive,
            report,
            &mut NoHook,
        );
    }
}
