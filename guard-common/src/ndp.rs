//! IPv6 Neighbor Discovery: reading the Neighbor Advertisements and
//! Solicitations that leave an uplink, as far as the verdict needs.
//!
//! An NDP message teaches a neighbour "IPv6 address -> link-layer address"
//! the way ARP does: a Neighbor Advertisement about its target (solicited,
//! or unsolicited with the override flag to all-nodes), and a Neighbor
//! Solicitation about its source when it carries a source link-layer
//! address option (RFC 4861 7.2.3: the receiver creates or updates the
//! sender's entry). The parser follows the IPv6 extension-header chain a
//! bounded number of steps (verifier-friendly) and checks some of what a
//! receiver checks before it believes the message (RFC 4861 7.1.1 / 7.1.2:
//! hop limit 255, code 0, length; not the checksum): a message a receiver
//! would discard announces nothing, so it passes, counted as malformed. A
//! chain longer than the parser follows passes too, counted apart
//! ([`Parsed::Ipv6Unfollowed`]): that one is a fail-open limit.

use crate::frame::{FrameReader, NdFrame, Parsed, MAX_VLAN_TAGS};

pub const ETH_P_IPV6: u16 = 0x86dd;
/// The fixed IPv6 header.
pub const IPV6_HLEN: usize = 40;
pub const NEXTHDR_HOP: u8 = 0;
pub const NEXTHDR_ROUTING: u8 = 43;
pub const NEXTHDR_FRAGMENT: u8 = 44;
pub const NEXTHDR_DEST: u8 = 60;
pub const NEXTHDR_ICMPV6: u8 = 58;
pub const ND_NEIGHBOR_SOLICIT: u8 = 135;
pub const ND_NEIGHBOR_ADVERT: u8 = 136;
/// NA flags (the first byte after the ICMPv6 header): Router, Solicited, Override.
pub const NA_FLAG_ROUTER: u8 = 0x80;
pub const NA_FLAG_SOLICITED: u8 = 0x40;
pub const NA_FLAG_OVERRIDE: u8 = 0x20;
/// Option types: source / target link-layer address.
pub const ND_OPT_SOURCE_LL: u8 = 1;
pub const ND_OPT_TARGET_LL: u8 = 2;
/// Extension headers (hop-by-hop, routing, destination options) looked
/// through before ICMPv6. The kernel's own NDP has none; MLD has one.
pub const MAX_EXT_HEADERS: usize = 4;
/// Options looked at in a Neighbor Solicitation. The kernel sends one
/// (the source link-layer address), first.
pub const MAX_ND_OPTIONS: usize = 4;
/// ICMPv6 header (4) + reserved/flags (4) + target (16): the shortest NS/NA.
pub const ND_MIN_LEN: usize = 24;

// The type stands in `frame`, beside ARP's, so that a parse can return
// either; what it teaches is read here.
impl NdFrame {
    pub fn is_advert(&self) -> bool {
        self.icmp_type == ND_NEIGHBOR_ADVERT
    }

    /// The address whose link-layer mapping the message may teach: an
    /// advertisement's target, a solicitation's source (the unspecified
    /// source of duplicate address detection teaches nothing: `None`).
    #[inline(always)]
    pub fn claimed(&self) -> Option<[u8; 16]> {
        if self.is_advert() {
            Some(self.target)
        } else if self.src == [0; 16] {
            None
        } else {
            Some(self.src)
        }
    }
}

#[inline(always)]
fn is_ext(nh: u8) -> bool {
    nh == NEXTHDR_HOP || nh == NEXTHDR_ROUTING || nh == NEXTHDR_DEST
}

/// Whether an IPv6 packet whose first next-header is `nh` may be NDP: the
/// fast path lets every other IPv6 packet (TCP, UDP, fragments...) go
/// after one byte.
#[inline(always)]
pub fn may_be_ndp(nh: u8) -> bool {
    nh == NEXTHDR_ICMPV6 || is_ext(nh)
}

/// Parse the IPv6 packet at `offset` (after the Ethernet header and any
/// tags) far enough to find a Neighbor Solicitation or Advertisement.
#[inline(always)]
pub fn parse_ipv6<R: FrameReader + ?Sized>(
    r: &R,
    offset: usize,
    vlan_tags: u8,
    vids: [u16; MAX_VLAN_TAGS],
) -> Parsed {
    match follow_chain(r, offset) {
        Chain::Icmpv6(icmp) => read_nd(r, offset, &icmp, vlan_tags, vids),
        Chain::NotNdp => Parsed::Other,
        Chain::Unfollowed => Parsed::Ipv6Unfollowed,
    }
}

/// An ICMPv6 message found after the IPv6 header and its extension headers.
struct Icmpv6At {
    /// Offset of the ICMPv6 header in the frame.
    off: usize,
    /// Bytes of extension headers before it.
    ext: usize,
    /// The IPv6 payload length and hop limit, for the receiver's checks.
    payload: usize,
    hop_limit: u8,
}

/// Where the IPv6 extension-header chain leads.
enum Chain {
    Icmpv6(Icmpv6At),
    /// Not IPv6, or an upper layer other than ICMPv6.
    NotNdp,
    /// Longer than the parser follows, or cut short: it may be NDP.
    Unfollowed,
}

/// Follow the IPv6 packet at `offset` through at most [`MAX_EXT_HEADERS`]
/// extension headers to its upper layer.
#[inline(always)]
fn follow_chain<R: FrameReader + ?Sized>(r: &R, offset: usize) -> Chain {
    // Version/class/flow (4), payload length (2), next header, hop limit.
    let Some(h) = r.read::<8>(offset) else {
        return Chain::NotNdp;
    };
    if h[0] >> 4 != 6 {
        return Chain::NotNdp;
    }
    let payload = u16::from_be_bytes([h[4], h[5]]) as usize;
    let (mut nh, hop_limit) = (h[6], h[7]);
    if !may_be_ndp(nh) {
        return Chain::NotNdp;
    }
    let start = offset + IPV6_HLEN;
    let mut off = start;
    // Bounded loop, unrolled: at most MAX_EXT_HEADERS reads.
    let mut i = 0;
    while i < MAX_EXT_HEADERS {
        if !is_ext(nh) {
            break;
        }
        let Some(e) = r.read::<2>(off) else {
            return Chain::Unfollowed;
        };
        nh = e[0];
        off += (e[1] as usize + 1) * 8;
        i += 1;
    }
    if is_ext(nh) {
        // More headers than we follow: we cannot tell what it carries.
        return Chain::Unfollowed;
    }
    if nh != NEXTHDR_ICMPV6 {
        // Includes fragments: a fragmented NDP message is discarded by its
        // receiver (RFC 6980), so it teaches nothing.
        return Chain::NotNdp;
    }
    Chain::Icmpv6(Icmpv6At {
        off,
        ext: off - start,
        payload,
        hop_limit,
    })
}

/// The Neighbor Solicitation or Advertisement at `at`, if the ICMPv6
/// message is one and passes what every receiver checks before it believes
/// it; `offset` is the IPv6 header's.
#[inline(always)]
fn read_nd<R: FrameReader + ?Sized>(
    r: &R,
    offset: usize,
    at: &Icmpv6At,
    vlan_tags: u8,
    vids: [u16; MAX_VLAN_TAGS],
) -> Parsed {
    let (off, ext, payload) = (at.off, at.ext, at.payload);
    let Some(icmp) = r.read::<4>(off) else {
        return Parsed::Ipv6Unfollowed;
    };
    let icmp_type = icmp[0];
    if icmp_type != ND_NEIGHBOR_SOLICIT && icmp_type != ND_NEIGHBOR_ADVERT {
        return Parsed::Other;
    }
    // What every receiver checks before it believes the message.
    if at.hop_limit != 255 || icmp[1] != 0 || payload < ext + ND_MIN_LEN {
        return Parsed::NdMalformed;
    }
    let (Some(addrs), Some(flags), Some(target), Some(eth)) = (
        r.read::<32>(offset + 8),
        // Flags and the first reserved bytes: a one-byte read at a variable
        // offset compiles to a bounds check the verifier cannot use.
        r.read::<4>(off + 4),
        r.read::<16>(off + 8),
        r.read::<12>(0),
    ) else {
        return Parsed::NdMalformed;
    };
    let mut src = [0u8; 16];
    let mut dst = [0u8; 16];
    src.copy_from_slice(&addrs[..16]);
    dst.copy_from_slice(&addrs[16..]);
    let mut eth_dst = [0u8; 6];
    let mut eth_src = [0u8; 6];
    eth_dst.copy_from_slice(&eth[..6]);
    eth_src.copy_from_slice(&eth[6..]);
    Parsed::Nd(NdFrame {
        icmp_type,
        flags: if icmp_type == ND_NEIGHBOR_ADVERT {
            flags[0]
        } else {
            0
        },
        src,
        dst,
        target,
        eth_dst,
        eth_src,
        opts_offset: off + ND_MIN_LEN,
        opts_len: payload - ext - ND_MIN_LEN,
        vlan_tags,
        vids,
    })
}

/// Whether the message carries an option of type `wanted` (a solicitation's
/// source link-layer address). `None` when the options are malformed (a
/// zero length, one running past the message; the receiver discards the
/// message) or there are more than [`MAX_ND_OPTIONS`] before it.
#[inline(always)]
pub fn has_option<R: FrameReader + ?Sized>(r: &R, nd: &NdFrame, wanted: u8) -> Option<bool> {
    let mut off = nd.opts_offset;
    let mut left = nd.opts_len;
    let mut i = 0;
    while i < MAX_ND_OPTIONS {
        if left == 0 {
            return Some(false);
        }
        let o = r.read::<2>(off)?;
        let len = o[1] as usize * 8;
        if len == 0 || len > left {
            return None;
        }
        if o[0] == wanted {
            return Some(true);
        }
        off += len;
        left -= len;
        i += 1;
    }
    if left == 0 {
        Some(false)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ndp_build::{write_nd, NdSpec, ND_FRAME_BUF};
    use crate::parse::parse;

    const LB: [u8; 16] = [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x01, 0x01];
    const PEER: [u8; 16] = [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x01];
    const MAC: [u8; 6] = [2, 0, 0, 0, 0, 9];

    fn run(f: &[u8]) -> Parsed {
        parse(f, u16::from_be_bytes([f[12], f[13]]))
    }

    fn na(flags: u8) -> NdSpec {
        NdSpec::advert(MAC, LB, [0xff; 6], PEER, flags)
    }

    #[test]
    fn advert_and_solicitation_fields() {
        let mut buf = [0u8; ND_FRAME_BUF];
        let n = write_nd(&mut buf, &na(NA_FLAG_SOLICITED | NA_FLAG_OVERRIDE));
        let Parsed::Nd(nd) = run(&buf[..n]) else {
            panic!("not parsed: {:?}", run(&buf[..n]))
        };
        assert!(nd.is_advert());
        assert_eq!(nd.claimed(), Some(LB));
        assert_eq!(nd.flags, NA_FLAG_SOLICITED | NA_FLAG_OVERRIDE);
        assert_eq!(nd.dst, PEER);
        assert_eq!(has_option(&buf[..n], &nd, ND_OPT_TARGET_LL), Some(true));
        let ns = NdSpec::solicit(MAC, LB, PEER);
        let n = write_nd(&mut buf, &ns);
        let Parsed::Nd(nd) = run(&buf[..n]) else {
            panic!("NS not parsed")
        };
        assert_eq!(nd.claimed(), Some(LB));
        assert_eq!(nd.flags, 0);
        assert_eq!(has_option(&buf[..n], &nd, ND_OPT_SOURCE_LL), Some(true));
        let dad = NdSpec {
            src: [0; 16],
            sll: false,
            ..ns
        };
        let n = write_nd(&mut buf, &dad);
        let Parsed::Nd(nd) = run(&buf[..n]) else {
            panic!("DAD NS not parsed")
        };
        assert_eq!(nd.claimed(), None);
        assert_eq!(has_option(&buf[..n], &nd, ND_OPT_SOURCE_LL), Some(false));
    }

    #[test]
    fn tags_and_extension_headers_are_followed() {
        let mut buf = [0u8; ND_FRAME_BUF];
        for tags in [
            &[][..],
            &[(0x8100u16, 7u16)][..],
            &[(0x88a8, 7), (0x8100, 8)][..],
        ] {
            for ext in 0..=MAX_EXT_HEADERS {
                let spec = NdSpec {
                    tags: [tags.first().copied(), tags.get(1).copied()],
                    ext_headers: ext as u8,
                    ..na(0)
                };
                let n = write_nd(&mut buf, &spec);
                let Parsed::Nd(nd) = run(&buf[..n]) else {
                    panic!("tags {tags:?} ext {ext}: {:?}", run(&buf[..n]))
                };
                assert_eq!(nd.vlan_tags as usize, tags.len());
                assert_eq!(nd.claimed(), Some(LB));
            }
            let spec = NdSpec {
                tags: [tags.first().copied(), tags.get(1).copied()],
                ext_headers: MAX_EXT_HEADERS as u8 + 1,
                ..na(0)
            };
            let n = write_nd(&mut buf, &spec);
            assert_eq!(run(&buf[..n]), Parsed::Ipv6Unfollowed, "too many headers");
        }
    }

    #[test]
    fn what_a_receiver_discards_is_malformed() {
        let mut buf = [0u8; ND_FRAME_BUF];
        let n = write_nd(&mut buf, &na(0));
        let good = buf;
        // Hop limit, code, a payload length too short for the message.
        for (at, v) in [(14 + 7, 64u8), (14 + 40 + 1, 1), (14 + 5, 20)] {
            let mut f = good;
            f[at] = v;
            assert_eq!(run(&f[..n]), Parsed::NdMalformed, "byte {at} = {v}");
        }
        // Truncated anywhere after the ICMPv6 type: malformed; before it, other.
        for len in 14..n {
            let got = run(&good[..len]);
            if len < 14 + 8 {
                assert_eq!(got, Parsed::Other, "len {len}");
            } else if (14 + 8..14 + 40 + 4).contains(&len) {
                assert_eq!(got, Parsed::Ipv6Unfollowed, "len {len}");
            } else if (14 + 40 + 4..14 + 40 + ND_MIN_LEN).contains(&len) {
                assert_eq!(got, Parsed::NdMalformed, "len {len}");
            }
        }
        // Other ICMPv6, TCP, a fragment: not NDP.
        for (at, v) in [(14 + 40, 128u8), (14 + 6, 6), (14 + 6, NEXTHDR_FRAGMENT)] {
            let mut f = good;
            f[at] = v;
            assert_eq!(run(&f[..n]), Parsed::Other, "byte {at} = {v}");
        }
    }

    #[test]
    fn classes_of_what_a_message_teaches() {
        use crate::verdict::{classify_nd, Kind, NdClass};
        let class = |spec: &NdSpec, zero_option: bool| {
            let mut buf = [0u8; ND_FRAME_BUF];
            let n = write_nd(&mut buf, spec);
            let Parsed::Nd(nd) = run(&buf[..n]) else {
                panic!("not parsed")
            };
            if zero_option {
                buf[nd.opts_offset + 1] = 0;
            }
            classify_nd(&buf[..n], &nd)
        };
        let solicited = na(NA_FLAG_SOLICITED);
        assert_eq!(
            class(&solicited, false),
            NdClass::Announces(Kind::NaSolicited)
        );
        assert_eq!(
            class(&na(NA_FLAG_OVERRIDE), false),
            NdClass::Announces(Kind::NaUnsolicited)
        );
        let ns = NdSpec::solicit(MAC, LB, PEER);
        assert_eq!(class(&ns, false), NdClass::Announces(Kind::NsLeak));
        assert_eq!(class(&NdSpec { sll: false, ..ns }, false), NdClass::Nothing);
        assert_eq!(class(&ns, true), NdClass::Malformed);
        // An advertisement's options are not read: they decide nothing.
        assert_eq!(
            class(&solicited, true),
            NdClass::Announces(Kind::NaSolicited)
        );
    }

    #[test]
    fn malformed_options() {
        let mut buf = [0u8; ND_FRAME_BUF];
        let n = write_nd(&mut buf, &NdSpec::solicit(MAC, LB, PEER));
        let Parsed::Nd(nd) = run(&buf[..n]) else {
            panic!()
        };
        let mut f = buf;
        f[nd.opts_offset + 1] = 0; // zero length
        assert_eq!(has_option(&f[..n], &nd, ND_OPT_SOURCE_LL), None);
        f[nd.opts_offset + 1] = 2; // runs past the message
        assert_eq!(has_option(&f[..n], &nd, ND_OPT_SOURCE_LL), None);
    }
}
