//! ARP on egress: the sender IP is looked up in the LB set (after the
//! filter that spares most node addresses the lookup), the frame's kind
//! named, then judged and acted on exactly as NDP is ([`act`]).

use aya_ebpf::programs::TcContext;
use guard_common::{classify, v4_key, ArpFrame, Stat};

use crate::{
    act::act,
    claim::Claim,
    maps::{may_be_lb, LB_IPS},
    report::bump,
    skb::PASS,
};

#[inline(always)]
pub(crate) fn judge(ctx: &TcContext, arp: &ArpFrame) -> i32 {
    if !may_be_lb(arp.spa) {
        bump(Stat::NotLb);
        return PASS;
    }
    let Some(entry) = LB_IPS.get_ptr_mut(&arp.spa) else {
        bump(Stat::NotLb);
        return PASS;
    };
    let Some(kind) = classify(arp) else {
        return PASS;
    };
    let claim = Claim {
        ip: v4_key(arp.spa),
        kind,
        entry,
        requester_ip: v4_key(arp.tpa),
        requester_mac: arp.tha,
        spa: arp.spa,
        rewrite_at: arp.spa_offset(),
        vlan_tags: arp.vlan_tags,
        vids: arp.vids,
    };
    act(ctx, &claim)
}
