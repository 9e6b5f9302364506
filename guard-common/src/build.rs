//! Writing an Ethernet/IPv4 ARP frame: the one builder that `arp-guard probe`
//! (its requests), the test bed (`ArpSpec`, every frame the integration tests
//! send) and the unit tests share. The parser ([`crate::parse::parse`]) reads
//! what this writes; the test bed reads it back with its own, independently
//! written decoder, so the two are never checked only against each other.
//!
//! No allocation and no panics: it writes into a fixed array and returns the
//! length, or `None` when the tags do not fit.

use crate::frame::{ARPHRD_ETHER, ARPOP_REPLY, ARPOP_REQUEST, ARP_LEN, ETH_P_ARP, ETH_P_IP};

/// The shortest Ethernet frame without FCS; shorter frames are zero-padded
/// to it, as a NIC would.
pub const ETH_ZLEN: usize = 60;
/// The buffer a frame is written into: room for an ARP frame with up to
/// [`MAX_BUILD_TAGS`] VLAN tags.
pub const FRAME_BUF: usize = 64;
/// VLAN tags a built frame may carry (tests send three to check that the
/// parser stops at two).
pub const MAX_BUILD_TAGS: usize = 5;
/// The Ethernet broadcast address.
pub const BROADCAST: [u8; 6] = [0xff; 6];

/// The Ethernet header of a frame to build.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ethernet<'a> {
    pub dst: [u8; 6],
    pub src: [u8; 6],
    /// VLAN tags in the frame data, outermost first: (TPID, TCI).
    pub tags: &'a [(u16, u16)],
}

/// The fields of an Ethernet/IPv4 ARP packet; addresses as host-order `u32`,
/// as [`crate::frame::ArpFrame`] has them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArpPacket {
    pub op: u16,
    pub sha: [u8; 6],
    pub spa: u32,
    pub tha: [u8; 6],
    pub tpa: u32,
}

impl ArpPacket {
    /// "Who has `tpa`? Tell `spa`" (`spa` 0: an RFC 5227 ARP probe).
    pub fn request(sha: [u8; 6], spa: u32, tpa: u32) -> Self {
        ArpPacket {
            op: ARPOP_REQUEST,
            sha,
            spa,
            tha: [0; 6],
            tpa,
        }
    }

    /// "`spa` is at `sha`", to the requester `tha`/`tpa`.
    pub fn reply(sha: [u8; 6], spa: u32, tha: [u8; 6], tpa: u32) -> Self {
        ArpPacket {
            op: ARPOP_REPLY,
            sha,
            spa,
            tha,
            tpa,
        }
    }

    /// Gratuitous ARP (SPA = TPA = `ip`, THA broadcast), op 1 or 2.
    pub fn gratuitous(op: u16, mac: [u8; 6], ip: u32) -> Self {
        ArpPacket {
            op,
            sha: mac,
            spa: ip,
            tha: BROADCAST,
            tpa: ip,
        }
    }
}

/// Copy `src` into `out` at `at`; false when it does not fit.
#[inline(always)]
fn put(out: &mut [u8], at: usize, src: &[u8]) -> bool {
    match at
        .checked_add(src.len())
        .and_then(|end| out.get_mut(at..end))
    {
        Some(dst) => {
            dst.copy_from_slice(src);
            true
        }
        None => false,
    }
}

/// Write `eth` + `arp` into `out` (zeroed first) and return the frame's
/// length: at least [`ETH_ZLEN`], padded with zeros. `None` when more than
/// [`MAX_BUILD_TAGS`] tags are asked for.
pub fn write_arp(out: &mut [u8; FRAME_BUF], eth: &Ethernet<'_>, arp: &ArpPacket) -> Option<usize> {
    if eth.tags.len() > MAX_BUILD_TAGS {
        return None;
    }
    *out = [0; FRAME_BUF];
    let mut ok = put(out, 0, &eth.dst) && put(out, 6, &eth.src);
    let mut at = 12;
    for (tpid, tci) in eth.tags {
        ok &= put(out, at, &tpid.to_be_bytes()) && put(out, at + 2, &tci.to_be_bytes());
        at += 4;
    }
    ok &= put(out, at, &ETH_P_ARP.to_be_bytes());
    at += 2;
    let mut payload = [0u8; ARP_LEN];
    ok &= put(&mut payload, 0, &ARPHRD_ETHER.to_be_bytes())
        && put(&mut payload, 2, &ETH_P_IP.to_be_bytes())
        && put(&mut payload, 4, &[6, 4])
        && put(&mut payload, 6, &arp.op.to_be_bytes())
        && put(&mut payload, 8, &arp.sha)
        && put(&mut payload, 14, &arp.spa.to_be_bytes())
        && put(&mut payload, 18, &arp.tha)
        && put(&mut payload, 24, &arp.tpa.to_be_bytes())
        && put(out, at, &payload);
    at += ARP_LEN;
    ok.then_some(if at < ETH_ZLEN { ETH_ZLEN } else { at })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{Parsed, ETH_P_8021AD, ETH_P_8021Q};
    use crate::parse::parse;

    const MAC: [u8; 6] = [2, 0, 0, 0, 0, 1];
    const IP_A: u32 = u32::from_be_bytes([198, 51, 100, 1]);
    const IP_B: u32 = u32::from_be_bytes([198, 51, 100, 100]);

    fn eth(tags: &[(u16, u16)]) -> Ethernet<'_> {
        Ethernet {
            dst: BROADCAST,
            src: MAC,
            tags,
        }
    }

    /// The bytes written out by hand (RFC 826), not derived from the code.
    #[test]
    fn request_matches_the_rfc_layout() {
        let mut buf = [0xaa; FRAME_BUF];
        let n = write_arp(&mut buf, &eth(&[]), &ArpPacket::request(MAC, IP_A, IP_B)).unwrap();
        assert_eq!(n, ETH_ZLEN);
        #[rustfmt::skip]
        let want: [u8; 42] = [
            0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 2, 0, 0, 0, 0, 1, 0x08, 0x06,
            0x00, 0x01, 0x08, 0x00, 6, 4, 0x00, 0x01,
            2, 0, 0, 0, 0, 1, 198, 51, 100, 1,
            0, 0, 0, 0, 0, 0, 198, 51, 100, 100,
        ];
        assert_eq!(&buf[..42], &want);
        assert!(
            buf[42..].iter().all(|b| *b == 0),
            "padding and the rest zeroed"
        );
    }

    #[test]
    fn tagged_frames_parse_back() {
        let tags = [(ETH_P_8021AD, 100), (ETH_P_8021Q, 7)];
        let mut buf = [0; FRAME_BUF];
        let arp = ArpPacket::reply(MAC, IP_B, [2, 0, 0, 0, 0, 9], IP_A);
        let n = write_arp(&mut buf, &eth(&tags), &arp).unwrap();
        assert_eq!(n, ETH_ZLEN);
        assert_eq!(&buf[12..16], &[0x88, 0xa8, 0, 100]);
        let Parsed::Arp(f) = parse(&buf[..n], ETH_P_8021AD) else {
            panic!("not parsed")
        };
        assert_eq!(
            (f.op, f.sha, f.spa, f.tha, f.tpa),
            (2, arp.sha, IP_B, arp.tha, IP_A)
        );
        assert_eq!((f.arp_offset, f.vlan_tags), (22, 2));
    }

    #[test]
    fn many_tags_fill_the_buffer_and_more_are_refused() {
        let tags = [(ETH_P_8021Q, 1); MAX_BUILD_TAGS + 1];
        let mut buf = [0; FRAME_BUF];
        let g = ArpPacket::gratuitous(1, MAC, IP_B);
        let n = write_arp(&mut buf, &eth(&tags[..MAX_BUILD_TAGS]), &g).unwrap();
        assert_eq!(n, 14 + 4 * MAX_BUILD_TAGS + ARP_LEN);
        assert!(n <= FRAME_BUF);
        assert_eq!(write_arp(&mut buf, &eth(&tags), &g), None);
    }
}
