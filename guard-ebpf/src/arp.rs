//! ARP on egress: the sender IP is looked up in the LB set (after the
//! filter that spares most node addresses the lookup), the frame's kind
//! named, then judged and acted on exactly as NDP is ([`act`]).

use aya_ebpf::programs::TcContext;
use guard_common::{classify, v4_key, ArpFrame, Stat};

use crate::{
    act::act,
    claim::OutgoingClaim,
    maps::{may_be_lb, LB_IPS},
    report::bump,
    skb::PASS,
};

/// The program's ARP path: an LB IP's ARP frame becomes an [`OutgoingClaim`]
/// for the shared verdict ([`act`]); ARP for other IPs passes (`not_lb`).
#[inline(always)]
pub(crate) fn egress(ctx: &TcContext, arp: &ArpFrame) -> i32 {
    if !may_be_lb(arp.spa) {
        bump(Stat::ArpNotLb);
        return PASS;
    }
    let Some(entry) = LB_IPS.get_ptr_mut(&arp.spa) else {
        bump(Stat::ArpNotLb);
        return PASS;
    };
    let Some(kind) = classify(arp) else {
        return PASS;
    };
    let claim = OutgoingClaim {
        ip: v4_key(arp.spa),
        kind,
        entry,
        requester_ip: v4_key(arp.tpa),
        requester_mac: arp.tha,
        lb_ipv4: arp.spa,
        rewrite_at: arp.spa_offset(),
        vlan_tags: arp.vlan_tags,
        vids: arp.vids,
    };
    act(ctx, &claim)
}
