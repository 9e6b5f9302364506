//! The parser's front door: an outgoing Ethernet frame, looked through up
//! to [`MAX_VLAN_TAGS`] tags, handed to the ARP reader ([`parse_arp`]) or
//! the IPv6 Neighbor Discovery reader ([`parse_ipv6`]). Both readers and
//! what they return ([`Parsed`]) stand below it, in `frame` and `ndp`.

use crate::{
    frame::{
        be16, is_vlan, parse_arp, FrameReader, Parsed, ARP_LEN, ETH_HLEN, ETH_P_ARP, MAX_VLAN_TAGS,
        VID_MASK, VLAN_HLEN,
    },
    ndp::{parse_ipv6, ETH_P_IPV6},
};

/// Parse an Ethernet frame. `ethertype` is the frame's outer ethertype
/// (bytes 12..14), which the caller has already read on its fast path.
#[inline(always)]
pub fn parse<R: FrameReader + ?Sized>(r: &R, ethertype: u16) -> Parsed {
    let mut proto = ethertype;
    let mut offset = ETH_HLEN;
    let mut tags = 0u8;
    let mut vids = [0u16; MAX_VLAN_TAGS];
    // Bounded loop, unrolled: the verifier sees at most MAX_VLAN_TAGS reads.
    let mut i = 0;
    while i < MAX_VLAN_TAGS {
        if !is_vlan(proto) {
            break;
        }
        // The tag is TCI (2 bytes) + inner ethertype (2 bytes).
        let Some(tag) = r.read::<4>(offset) else {
            return Parsed::Other;
        };
        vids[i] = be16([tag[0], tag[1]]) & VID_MASK;
        proto = be16([tag[2], tag[3]]);
        offset += VLAN_HLEN;
        tags += 1;
        i += 1;
    }
    if proto == ETH_P_IPV6 {
        return parse_ipv6(r, offset, tags, vids);
    }
    if proto != ETH_P_ARP {
        return Parsed::Other;
    }
    let Some(arp) = r.read::<ARP_LEN>(offset) else {
        return Parsed::Malformed;
    };
    match parse_arp(&arp, offset, tags) {
        Parsed::Arp(mut f) => {
            f.vids = vids;
            Parsed::Arp(f)
        }
        other => other,
    }
}
