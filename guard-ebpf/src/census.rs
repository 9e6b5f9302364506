//! The responder census: an observe-only TC ingress program. Every ARP
//! claim of an LB IP that arrives (reply, gratuitous ARP, announcement) is
//! recorded by LB IP and sender MAC in an LRU map; the frame always goes on
//! unchanged (TCX_NEXT), so a fault here cannot cost a packet.
//!
//! Non-ARP frames cost the same bounds check and two-byte read as on egress.

use aya_ebpf::{
    macros::{classifier, map},
    maps::{LruHashMap, PerCpuArray},
    programs::TcContext,
};
use guard_common::{
    census::{claim, first, record},
    parse, CensusStat, Parsed, ResponderKey, ResponderValue, MAX_RESPONDERS,
};

use crate::program::{may_be_lb, outer_ethertype, Skb, CONFIG, LB_IPS, PASS};

#[map(name = "RESPONDERS")]
static RESPONDERS: LruHashMap<ResponderKey, ResponderValue> =
    LruHashMap::with_max_entries(MAX_RESPONDERS, 0);

#[map(name = "CENSUS_STATS")]
static CENSUS_STATS: PerCpuArray<u64> = PerCpuArray::with_max_entries(CensusStat::COUNT, 0);

#[classifier]
pub fn arp_guard_census(ctx: TcContext) -> i32 {
    let Some(ethertype) = outer_ethertype(&ctx) else {
        return PASS;
    };
    if ethertype != guard_common::frame::ETH_P_ARP && !guard_common::frame::is_vlan(ethertype) {
        return PASS;
    }
    let Parsed::Arp(arp) = parse(&Skb(&ctx), ethertype) else {
        return PASS;
    };
    bump(CensusStat::Arp);
    // SAFETY: a plain lookup; LB_IPS values are written whole by userspace.
    if !may_be_lb(arp.spa) || unsafe { LB_IPS.get(&arp.spa) }.is_none() {
        return PASS;
    }
    let Some(kind) = claim(&arp) else {
        return PASS;
    };
    // SAFETY: bpf_ktime_get_ns has no preconditions.
    let now = unsafe { aya_ebpf::helpers::bpf_ktime_get_ns() };
    let window = CONFIG.get(0).map_or(0, |c| c.census_window_ns);
    // SAFETY: ctx.skb.skb is the kernel's __sk_buff for this invocation.
    let ifindex = unsafe { (*ctx.skb.skb).ifindex };
    let key = ResponderKey::new(arp.spa, arp.sha);
    match RESPONDERS.get_ptr_mut(&key) {
        // SAFETY: a live element of the map. Two CPUs updating one entry at
        // the same instant may lose one count; the claim itself is never lost.
        Some(v) => unsafe { record(&mut *v, now, kind, ifindex, window) },
        None => {
            if RESPONDERS
                .insert(&key, &first(now, kind, ifindex), 0)
                .is_err()
            {
                bump(CensusStat::InsertFailed);
                return PASS;
            }
        }
    }
    bump(CensusStat::Claims);
    PASS
}

#[inline(always)]
fn bump(stat: CensusStat) {
    if let Some(v) = CENSUS_STATS.get_ptr_mut(stat as u32) {
        // SAFETY: this CPU's slot of a per-CPU array; nothing else writes it now.
        unsafe { *v += 1 };
    }
}
