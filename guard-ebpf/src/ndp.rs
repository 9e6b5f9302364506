//! IPv6 Neighbor Discovery on egress: the claimed address is looked up in
//! the IPv6 LB set, then judged and acted on exactly as ARP is
//! ([`act`]). Only a solicitation from an LB IP has its
//! options read (for the source link-layer address); nothing else is
//! computed that the verdict does not need.

use aya_ebpf::programs::TcContext;
use guard_common::{classify_nd, NdClass, NdFrame, Stat};

use crate::{
    act::act,
    claim::OutgoingClaim,
    maps::LB_IPS6,
    report::bump,
    skb::{Skb, PASS},
};

/// The program's NDP path: an IPv6 LB IP's NDP message becomes an
/// [`OutgoingClaim`] for the shared verdict ([`act`]); NDP for other IPs
/// passes (`ndp_not_lb`).
#[inline(always)]
pub(crate) fn egress(ctx: &TcContext, nd: &NdFrame) -> i32 {
    let Some(ip) = nd.claimed() else {
        bump(Stat::NdpNotLb);
        return PASS;
    };
    let Some(entry) = LB_IPS6.get_ptr_mut(&ip) else {
        bump(Stat::NdpNotLb);
        return PASS;
    };
    let kind = match classify_nd(&Skb(ctx), nd) {
        NdClass::Announces(kind) => kind,
        NdClass::Nothing => return PASS,
        NdClass::Malformed => {
            bump(Stat::NdpMalformed);
            return PASS;
        }
    };
    let claim = OutgoingClaim {
        ip,
        kind,
        entry,
        requester_ip: nd.dst,
        requester_mac: nd.eth_dst,
        lb_ipv4: 0,
        rewrite_at: 0,
        vlan_tags: nd.vlan_tags,
        vids: nd.vids,
    };
    act(ctx, &claim)
}
