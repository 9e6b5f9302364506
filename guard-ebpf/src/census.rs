//! The responder census: an observe-only TC ingress program. Every ARP
//! claim of an LB IP that arrives (reply, gratuitous ARP, announcement), and
//! every NDP claim of an IPv6 LB IP (advertisement, solicitation with a
//! source link-layer option), is recorded by LB IP and sender MAC in an LRU
//! map; the frame always goes on unchanged (TCX_NEXT), so a fault here
//! cannot cost a packet.
//!
//! Other frames cost the same fast path as on egress.

use aya_ebpf::{
    macros::{classifier, map},
    maps::{LruHashMap, PerCpuArray},
    programs::TcContext,
};
use guard_common::{
    census::{claim, first, record},
    classify_nd, parse, v4_key, CensusStat, Kind, NdClass, Parsed, ResponderKey, ResponderValue,
    MAX_RESPONDERS,
};

use crate::program::{
    may_be_lb, outer_ethertype, worth_parsing, Skb, CONFIG, LB_IPS, LB_IPS6, PASS,
};

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
    if !worth_parsing(&ctx, ethertype) {
        return PASS;
    }
    let (ip, mac, kind) = match parse(&Skb(&ctx), ethertype) {
        Parsed::Arp(arp) => {
            bump(CensusStat::Arp);
            // SAFETY: a plain lookup; LB_IPS values are written whole by userspace.
            if !may_be_lb(arp.spa) || unsafe { LB_IPS.get(&arp.spa) }.is_none() {
                return PASS;
            }
            let Some(kind) = claim(&arp) else {
                return PASS;
            };
            (v4_key(arp.spa), arp.sha, kind)
        }
        Parsed::Nd(nd) => {
            bump(CensusStat::Ndp);
            match nd_claim(&ctx, &nd) {
                Some((ip, kind)) => (ip, nd.eth_src, kind),
                None => return PASS,
            }
        }
        _ => return PASS,
    };
    // SAFETY: bpf_ktime_get_ns has no preconditions.
    let now = unsafe { aya_ebpf::helpers::bpf_ktime_get_ns() };
    let window = CONFIG.get(0).map_or(0, |c| c.census_window_ns);
    // SAFETY: ctx.skb.skb is the kernel's __sk_buff for this invocation.
    let ifindex = unsafe { (*ctx.skb.skb).ifindex };
    let key = ResponderKey::new(ip, mac);
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

/// The IPv6 LB IP an arriving NDP message claims, and how: the same kinds
/// the egress guard judges (an advertisement; a solicitation with a source
/// link-layer option).
#[inline(always)]
fn nd_claim(ctx: &TcContext, nd: &guard_common::NdFrame) -> Option<(guard_common::IpKey, Kind)> {
    let ip = nd.claimed()?;
    // SAFETY: a plain lookup; LB_IPS6 values are written whole by userspace.
    unsafe { LB_IPS6.get(&ip) }?;
    match classify_nd(&Skb(ctx), nd) {
        NdClass::Announces(kind) => Some((ip, kind)),
        NdClass::Nothing | NdClass::Malformed => None,
    }
}

#[inline(always)]
fn bump(stat: CensusStat) {
    if let Some(v) = CENSUS_STATS.get_ptr_mut(stat as u32) {
        // SAFETY: this CPU's slot of a per-CPU array; nothing else writes it now.
        unsafe { *v += 1 };
    }
}
