//! The frame as both programs see it: read through [`Skb`] (the same
//! parser the host tests run on byte slices), let go after the fewest reads
//! when it cannot matter ([`worth_parsing`]), and the answers a TC program
//! gives for it.

use aya_ebpf::{
    bindings::{TC_ACT_SHOT, TC_ACT_UNSPEC},
    programs::TcContext,
};
use guard_common::{
    frame::ETH_HLEN,
    ndp::{may_be_ndp, ETH_P_IPV6},
    FrameReader,
};

/// "No opinion": lets later programs in the TCX chain (or later cls_bpf
/// filters) run, and passes the frame at the end of the chain.
pub(crate) const PASS: i32 = TC_ACT_UNSPEC;
pub(crate) const DROP: i32 = TC_ACT_SHOT as i32;

pub(crate) struct Skb<'a>(pub(crate) &'a TcContext);

impl FrameReader for Skb<'_> {
    /// Straight from the linear data when the bytes are there (no helper
    /// call: a bounds check the verifier also sees); through
    /// `bpf_skb_load_bytes` when they are not (a frame in paged fragments).
    /// Benchmarks: a helper call here cost about 25 ns per read.
    #[inline(always)]
    fn read<const N: usize>(&self, offset: usize) -> Option<[u8; N]> {
        let (data, end) = (self.0.data(), self.0.data_end());
        if data + offset + N <= end {
            // SAFETY: bounds checked just above; the verifier sees the same check.
            return Some(unsafe { core::ptr::read_unaligned((data + offset) as *const [u8; N]) });
        }
        self.0.load::<[u8; N]>(offset).ok()
    }
}

/// The fast path of both programs: anything that is neither ARP, VLAN-tagged,
/// nor IPv6 that may be NDP (ICMPv6 or an extension header first) is not
/// parsed at all.
#[inline(always)]
pub(crate) fn worth_parsing(ctx: &TcContext, ethertype: u16) -> bool {
    if ethertype == ETH_P_IPV6 {
        ipv6_next_header(ctx).is_some_and(may_be_ndp)
    } else {
        ethertype == guard_common::frame::ETH_P_ARP || guard_common::frame::is_vlan(ethertype)
    }
}

/// The next-header byte of an untagged IPv6 packet, from the linear data.
#[inline(always)]
fn ipv6_next_header(ctx: &TcContext) -> Option<u8> {
    // Next header and hop limit: two bytes, as a one-byte read compiles to
    // a bounds check the verifier cannot use.
    Skb(ctx).read::<2>(ETH_HLEN + 6).map(|b| b[0])
}

/// The outer ethertype, read straight from the linear data when it is there.
#[inline(always)]
pub(crate) fn outer_ethertype(ctx: &TcContext) -> Option<u16> {
    let (data, end) = (ctx.data(), ctx.data_end());
    if data + ETH_HLEN <= end {
        // SAFETY: bounds checked just above; the verifier sees the same check.
        let b = unsafe { core::ptr::read_unaligned((data + 12) as *const [u8; 2]) };
        return Some(u16::from_be_bytes(b));
    }
    ctx.load::<[u8; 2]>(12).ok().map(u16::from_be_bytes)
}
