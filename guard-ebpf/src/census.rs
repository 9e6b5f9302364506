//! The census: an observe-only TC ingress program with two jobs.
//!
//! - Responders: every ARP claim of an LB IP that arrives (reply,
//!   gratuitous ARP, announcement), and every NDP claim of an IPv6 LB IP
//!   (advertisement, solicitation with a source link-layer option), is
//!   recorded by LB IP and sender MAC in an LRU map.
//! - Misdirected clients: every IPv4 and IPv6 packet addressed to this
//!   host for an LB IP that is `foreign` here is recorded by LB IP and
//!   client MAC in another LRU map (`guard_common::clients`).
//!
//! Every frame goes on unchanged (TC_ACT_UNSPEC / TCX_NEXT), so a fault
//! here cannot cost a packet. An IPv4 or IPv6 packet whose destination is
//! not a foreign LB IP costs a bounds check, one read and one bit of the
//! foreign filter; other frames cost the same fast path as on egress.

use aya_ebpf::{
    macros::{classifier, map},
    maps::{Array, LruHashMap, PerCpuArray},
    programs::TcContext,
};
use guard_common::{
    census::{claim_kind, first, record},
    classify_nd,
    clients::{self, foreign_slot_v4, ClientKey, ClientStat, ClientValue},
    frame::{ETH_P_IP, VID_MASK},
    ndp::ETH_P_IPV6,
    parse, v4_key, CensusStat, IpKey, Kind, NdClass, Ownership, Parsed, ResponderKey,
    ResponderValue, MAX_CLIENTS, MAX_RESPONDERS,
};

use crate::{
    maps::{may_be_lb, CONFIG, LB_IPS, LB_IPS6},
    skb::{outer_ethertype, worth_parsing, Skb, PASS},
};

#[map(name = "RESPONDERS")]
static RESPONDERS: LruHashMap<ResponderKey, ResponderValue> =
    LruHashMap::with_max_entries(MAX_RESPONDERS, 0);

#[map(name = "CENSUS_STATS")]
static CENSUS_STATS: PerCpuArray<u64> = PerCpuArray::with_max_entries(CensusStat::COUNT, 0);

#[map(name = "CLIENTS")]
static CLIENTS: LruHashMap<ClientKey, ClientValue> = LruHashMap::with_max_entries(MAX_CLIENTS, 0);

#[map(name = "CLIENT_STATS")]
static CLIENT_STATS: PerCpuArray<u64> = PerCpuArray::with_max_entries(ClientStat::COUNT, 0);

#[map(name = "FOREIGN_FILTER")]
static FOREIGN_FILTER: Array<u64> =
    Array::with_max_entries(guard_common::clients::FOREIGN_FILTER_WORDS, 0);

#[classifier]
pub fn arp_guard_census(ctx: TcContext) -> i32 {
    let Some(ethertype) = outer_ethertype(&ctx) else {
        return PASS;
    };
    if ethertype == ETH_P_IP {
        if let Some(dst) = be32_at(&ctx, clients::IPV4_DST) {
            if may_be_foreign(foreign_slot_v4(dst)) {
                misdirected_v4(&ctx, dst);
            }
        }
        return PASS;
    }
    if ethertype == ETH_P_IPV6 {
        if let Some(low) = be32_at(&ctx, clients::IPV6_DST_LOW) {
            if may_be_foreign(foreign_slot_v4(low)) {
                misdirected_v6(&ctx);
            }
        }
    }
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
            let Some(kind) = claim_kind(&arp) else {
                return PASS;
            };
            (v4_key(arp.spa), arp.sha, kind)
        }
        Parsed::Nd(nd) => {
            bump(CensusStat::Ndp);
            match nd_claim_kind(&ctx, &nd) {
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
fn nd_claim_kind(
    ctx: &TcContext,
    nd: &guard_common::NdFrame,
) -> Option<(guard_common::IpKey, Kind)> {
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

/// The four bytes at the even `offset` of the linear data as a big-endian
/// u32, read as two 16-bit loads: every IPv4 and IPv6 packet pays this read,
/// and LLVM splits a 32-bit read of unknown alignment into four byte loads
/// and six shifts and ors (2-3 ns here). Frame data starts 2-byte aligned
/// (the verifier's own model of packet alignment: NET_IP_ALIGN is 0 or 2),
/// so an even offset is 2-byte aligned. A frame whose bytes are not all in
/// the linear data (none the census records: its headers are) is read as
/// not foreign.
#[inline(always)]
fn be32_at(ctx: &TcContext, offset: usize) -> Option<u32> {
    let (data, end) = (ctx.data(), ctx.data_end());
    if data + offset + 4 > end {
        return None;
    }
    // SAFETY: bounds checked just above (the verifier sees the same check);
    // 2-byte aligned, see above.
    let (hi, lo) = unsafe {
        (
            core::ptr::read((data + offset) as *const u16),
            core::ptr::read((data + offset + 2) as *const u16),
        )
    };
    Some((u32::from(u16::from_be(hi)) << 16) | u32::from(u16::from_be(lo)))
}

/// Whether `slot` may stand for a foreign LB IP: a clear bit proves it does
/// not. An unreadable word counts as clear: the census only observes, so
/// its safe direction is to record nothing.
#[inline(always)]
fn may_be_foreign((word, bit): (u32, u64)) -> bool {
    FOREIGN_FILTER.get(word).is_some_and(|w| *w & bit != 0)
}

/// An IPv4 packet for `dst`, which may be a foreign LB IP.
#[inline(always)]
fn misdirected_v4(ctx: &TcContext, dst: u32) {
    // SAFETY: a plain lookup; LB_IPS values are written whole by userspace.
    let Some(entry) = (unsafe { LB_IPS.get(&dst) }) else {
        return;
    };
    if entry.state != Ownership::Foreign as u8 {
        return;
    }
    if let Some((mac, src)) = clients::client_v4(&Skb(ctx)) {
        record_client(ctx, v4_key(dst), mac, src);
    }
}

/// An IPv6 packet whose destination may be a foreign LB IP.
#[inline(always)]
fn misdirected_v6(ctx: &TcContext) {
    let Some(dst) = clients::v6_destination(&Skb(ctx)) else {
        return;
    };
    // SAFETY: a plain lookup; LB_IPS6 values are written whole by userspace.
    let Some(entry) = (unsafe { LB_IPS6.get(&dst) }) else {
        return;
    };
    if entry.state != Ownership::Foreign as u8 {
        return;
    }
    if let Some((mac, src)) = clients::client_v6(&Skb(ctx)) {
        record_client(ctx, dst, mac, src);
    }
}

/// Record a packet for the foreign LB IP `ip` from (`mac`, `src`), when it
/// was addressed to this host.
#[inline(always)]
fn record_client(ctx: &TcContext, ip: IpKey, mac: [u8; 6], src: IpKey) {
    let skb = ctx.skb.skb;
    // SAFETY: ctx.skb.skb is the kernel's __sk_buff for this invocation.
    let (pkt_type, ifindex, vlan_present, tci) = unsafe {
        (
            (*skb).pkt_type,
            (*skb).ifindex,
            (*skb).vlan_present,
            (*skb).vlan_tci,
        )
    };
    if pkt_type != clients::PACKET_HOST {
        bump_client(ClientStat::OtherHost);
        return;
    }
    let vlan = if vlan_present != 0 {
        (tci as u16) & VID_MASK
    } else {
        0
    };
    // SAFETY: bpf_ktime_get_ns has no preconditions.
    let now = unsafe { aya_ebpf::helpers::bpf_ktime_get_ns() };
    let key = ClientKey::new(ip, mac);
    match CLIENTS.get_ptr_mut(&key) {
        Some(v) => {
            let window = CONFIG.get(0).map_or(0, |c| c.census_window_ns);
            // SAFETY: a live element of the map. Two CPUs updating one entry
            // at the same instant may lose one count, never the client.
            unsafe { clients::record(&mut *v, now, src, ifindex, vlan, window) };
        }
        None => {
            let fresh = clients::first(now, src, ifindex, vlan);
            if CLIENTS.insert(&key, &fresh, 0).is_err() {
                bump_client(ClientStat::InsertFailed);
                return;
            }
            bump_client(ClientStat::NewClient);
        }
    }
    bump_client(ClientStat::Recorded);
}

#[inline(always)]
fn bump_client(stat: ClientStat) {
    if let Some(v) = CLIENT_STATS.get_ptr_mut(stat as u32) {
        // SAFETY: this CPU's slot of a per-CPU array; nothing else writes it now.
        unsafe { *v += 1 };
    }
}
