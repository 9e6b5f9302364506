//! The egress entry point: the frame's outer ethertype, the fast path,
//! one parse, and the frame handed to the ARP or the NDP path
//! (`arp.rs`, `ndp.rs`), which act on it alike (`act.rs`).

use aya_ebpf::{macros::classifier, programs::TcContext};
use guard_common::{parse, Parsed, Stat};

use crate::{
    arp, ndp,
    report::bump,
    skb::{outer_ethertype, worth_parsing, Skb, PASS},
};

#[classifier]
pub fn arp_guard_egress(ctx: TcContext) -> i32 {
    bump(Stat::Frames);
    let ethertype = match outer_ethertype(&ctx) {
        Some(t) => t,
        None => return PASS,
    };
    if !worth_parsing(&ctx, ethertype) {
        return PASS;
    }
    let arp = match parse(&Skb(&ctx), ethertype) {
        Parsed::Other => return PASS,
        Parsed::Malformed => {
            bump(Stat::Arp);
            bump(Stat::ArpMalformed);
            return PASS;
        }
        Parsed::NdMalformed => {
            bump(Stat::Ndp);
            bump(Stat::NdpMalformed);
            return PASS;
        }
        Parsed::Ipv6Unfollowed => {
            bump(Stat::Ipv6Unfollowed);
            return PASS;
        }
        Parsed::Nd(nd) => {
            bump(Stat::Ndp);
            return ndp::egress(&ctx, &nd);
        }
        Parsed::Arp(arp) => arp,
    };
    bump(Stat::Arp);
    // A tag in metadata leaves the data untagged: the frame is judged exactly
    // like an untagged one; we only count that it happened.
    // SAFETY: ctx.skb.skb is the kernel's __sk_buff for this invocation.
    if unsafe { (*ctx.skb.skb).vlan_present } != 0 {
        bump(Stat::VlanInMetadata);
    }
    arp::egress(&ctx, &arp)
}
