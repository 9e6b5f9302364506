//! Test fixtures, never loaded by the daemon: they live in their own object
//! (`arp-guard-fixtures`), so the production object holds only the guard.

use aya_ebpf::{
    bindings::TC_ACT_UNSPEC,
    macros::{classifier, map},
    maps::{Array, HashMap},
    programs::TcContext,
};
use guard_common::{
    frame::{ARPOP_REPLY, ARPOP_REQUEST, ARP_LEN, ETH_HLEN, ETH_P_8021Q, ETH_P_ARP},
    Parsed,
};

const PASS: i32 = TC_ACT_UNSPEC;

/// Test fixture, never attached by the daemon: pushes an 802.1Q tag (VLAN 7)
/// into skb metadata, as a VLAN device or VLAN-filtering bridge above the
/// interface would. The test suite places it before the guard in the TCX
/// chain because this kernel has neither VLAN devices nor act_vlan.
#[classifier]
pub fn fixture_vlan_meta(ctx: TcContext) -> i32 {
    // SAFETY: helper call on this invocation's skb; failure leaves it untagged.
    let _ = unsafe { aya_ebpf::helpers::bpf_skb_vlan_push(ctx.skb.skb, ETH_P_8021Q.to_be(), 7) };
    PASS
}

/// Benchmark floor, never attached by the daemon: does nothing. What a TC
/// program costs before it reads a byte (the test-run loop included).
#[classifier]
pub fn fixture_empty(_ctx: TcContext) -> i32 {
    PASS
}

/// Test fixture maps: IPs the fixture responder answers for, and the MAC it
/// answers with (index 0, 6 bytes + 2 padding).
#[map(name = "FIXTURE_RESPOND")]
static FIXTURE_RESPOND: HashMap<u32, u8> = HashMap::with_max_entries(64, 0);
#[map(name = "FIXTURE_MAC")]
static FIXTURE_MAC: Array<[u8; 8]> = Array::with_max_entries(1, 0);

/// Test fixture, never attached by the daemon: a datapath ARP responder in
/// the manner of Cilium's L2 announcements. At TC ingress it turns an ARP
/// request for an IP in FIXTURE_RESPOND into the reply in place and
/// redirects it out of the device it came in on, so the reply reaches the
/// device's egress with no socket and with `ingress_ifindex` set.
#[classifier]
pub fn fixture_arp_responder(ctx: TcContext) -> i32 {
    const ARP: usize = ETH_HLEN;
    let Ok(ethertype) = ctx.load::<[u8; 2]>(12) else {
        return PASS;
    };
    if u16::from_be_bytes(ethertype) != ETH_P_ARP {
        return PASS;
    }
    let Ok(arp) = ctx.load::<[u8; ARP_LEN]>(ARP) else {
        return PASS;
    };
    let Parsed::Arp(a) = guard_common::frame::parse_arp(&arp, ARP, 0) else {
        return PASS;
    };
    // SAFETY: plain lookups of Copy values.
    if a.op != ARPOP_REQUEST || unsafe { FIXTURE_RESPOND.get(&a.tpa) }.is_none() {
        return PASS;
    }
    let Some(m) = FIXTURE_MAC.get(0).copied() else {
        return PASS;
    };
    let mac = [m[0], m[1], m[2], m[3], m[4], m[5]];
    let ok = ctx.store(0, &a.sha, 0).is_ok()
        && ctx.store(6, &mac, 0).is_ok()
        && ctx.store(ARP + 6, &ARPOP_REPLY.to_be_bytes(), 0).is_ok()
        && ctx.store(ARP + 8, &mac, 0).is_ok()
        && ctx.store(ARP + 14, &a.tpa.to_be_bytes(), 0).is_ok()
        && ctx.store(ARP + 18, &a.sha, 0).is_ok()
        && ctx.store(ARP + 24, &a.spa.to_be_bytes(), 0).is_ok();
    if !ok {
        return PASS;
    }
    // SAFETY: ctx.skb.skb is this invocation's __sk_buff.
    let ifindex = unsafe { (*ctx.skb.skb).ifindex };
    // SAFETY: helper call with a valid ifindex; flags 0 = out of its egress.
    unsafe { aya_ebpf::helpers::bpf_redirect(ifindex, 0) as i32 }
}
