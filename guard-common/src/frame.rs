//! What an outgoing Ethernet frame is to the policy: the reader it is
//! read through, the ARP fields the policy needs and their parser, and what
//! a parse finds ([`Parsed`], ARP or Neighbor Discovery). The walk through
//! VLAN tags that chooses between ARP and IPv6 is `parse`; IPv6 Neighbor
//! Discovery is read by `ndp`.
//!
//! The parser is generic over [`FrameReader`] so that the BPF program (reading
//! the skb with `bpf_skb_load_bytes`) and host tests (reading a `&[u8]`) run the
//! same code. Every read is of a fixed size at an offset bounded by
//! [`MAX_VLAN_TAGS`], which keeps the BPF verifier happy.

/// Ethernet header length without VLAN tags.
pub const ETH_HLEN: usize = 14;
/// Length of one 802.1Q / 802.1ad tag.
pub const VLAN_HLEN: usize = 4;
/// Length of an Ethernet/IPv4 ARP payload (RFC 826 with hlen=6, plen=4).
pub const ARP_LEN: usize = 28;
/// Offset of the sender protocol address inside the ARP payload.
pub const ARP_SPA_OFFSET: usize = 14;
/// Tags in the frame data that are looked through (QinQ: outer 802.1ad + inner 802.1Q).
pub const MAX_VLAN_TAGS: usize = 2;
/// The VLAN ID bits of a tag's TCI (the rest is priority and DEI).
pub const VID_MASK: u16 = 0x0fff;

pub const ETH_P_ARP: u16 = 0x0806;
pub const ETH_P_8021Q: u16 = 0x8100;
pub const ETH_P_8021AD: u16 = 0x88a8;
pub const ARPHRD_ETHER: u16 = 1;
pub const ETH_P_IP: u16 = 0x0800;
pub const ARPOP_REQUEST: u16 = 1;
pub const ARPOP_REPLY: u16 = 2;

/// Read access to a frame. `read` copies `N` bytes at `offset`, or returns
/// `None` when the frame is shorter.
pub trait FrameReader {
    fn read<const N: usize>(&self, offset: usize) -> Option<[u8; N]>;
}

impl FrameReader for [u8] {
    #[inline(always)]
    fn read<const N: usize>(&self, offset: usize) -> Option<[u8; N]> {
        let end = offset.checked_add(N)?;
        let bytes = self.get(offset..end)?;
        let mut out = [0u8; N];
        out.copy_from_slice(bytes);
        Some(out)
    }
}

/// The fields of an Ethernet/IPv4 ARP packet, addresses as host-order `u32`
/// (so `u32::from(Ipv4Addr)` on the host gives the same key).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArpFrame {
    pub op: u16,
    pub sha: [u8; 6],
    pub spa: u32,
    pub tha: [u8; 6],
    pub tpa: u32,
    /// Offset of the ARP payload in the frame (14, 18 or 22).
    pub arp_offset: usize,
    /// Number of VLAN tags found in the frame data.
    pub vlan_tags: u8,
    /// Their VLAN IDs, outermost first (0 past `vlan_tags`): which VLAN
    /// device the frame belongs to, for the egress-interface rule.
    pub vids: [u16; MAX_VLAN_TAGS],
}

impl ArpFrame {
    /// Offset of the SPA field in the frame, where a rewrite writes.
    #[inline(always)]
    pub fn spa_offset(&self) -> usize {
        self.arp_offset + ARP_SPA_OFFSET
    }
}

/// The fields of a Neighbor Solicitation or Advertisement the verdict needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NdFrame {
    /// 135 (a solicitation) or 136 (an advertisement): `ND_NEIGHBOR_SOLICIT`
    /// or `ND_NEIGHBOR_ADVERT` of the ndp module.
    pub icmp_type: u8,
    /// The NA flags byte (R, S, O); 0 for a solicitation.
    pub flags: u8,
    pub src: [u8; 16],
    pub dst: [u8; 16],
    pub target: [u8; 16],
    /// The Ethernet destination: the neighbour the message is for.
    pub eth_dst: [u8; 6],
    /// The Ethernet source: the sender (the census's claimant).
    pub eth_src: [u8; 6],
    /// Offset of the options in the frame, and their length in bytes.
    pub opts_offset: usize,
    pub opts_len: usize,
    pub vlan_tags: u8,
    pub vids: [u16; MAX_VLAN_TAGS],
}

/// What [`crate::parse::parse`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parsed {
    /// Neither ARP nor NDP (after looking through up to two VLAN tags), or
    /// too short to carry an Ethernet header. Passed untouched.
    Other,
    /// ARP ethertype, but truncated, not Ethernet/IPv4, or an opcode other than
    /// request/reply. Passed untouched and counted.
    Malformed,
    Arp(ArpFrame),
    /// A Neighbor Solicitation or Advertisement (read by `ndp`).
    Nd(NdFrame),
    /// An NDP message its receiver would discard (hop limit, code, length)
    /// or cut short after its ICMPv6 type. Passed untouched and counted.
    NdMalformed,
    /// IPv6 the parser could not follow to its upper layer: more extension
    /// headers than it looks through, or cut before the ICMPv6 type. It may
    /// be NDP (a receiver accepts extension headers before an NDP message):
    /// a fail-open limit, passed untouched and counted on its own so that it
    /// can be alerted on.
    Ipv6Unfollowed,
}

#[inline(always)]
pub(crate) fn be16(b: [u8; 2]) -> u16 {
    u16::from_be_bytes(b)
}

/// The ethertype at `offset` and whether it is a VLAN tag protocol.
#[inline(always)]
pub fn is_vlan(ethertype: u16) -> bool {
    ethertype == ETH_P_8021Q || ethertype == ETH_P_8021AD
}

/// Validate and decode a 28-byte ARP payload.
#[inline(always)]
pub fn parse_arp(arp: &[u8; ARP_LEN], arp_offset: usize, vlan_tags: u8) -> Parsed {
    let htype = be16([arp[0], arp[1]]);
    let ptype = be16([arp[2], arp[3]]);
    let hlen = arp[4];
    let plen = arp[5];
    let op = be16([arp[6], arp[7]]);
    if htype != ARPHRD_ETHER || ptype != ETH_P_IP || hlen != 6 || plen != 4 {
        return Parsed::Malformed;
    }
    if op != ARPOP_REQUEST && op != ARPOP_REPLY {
        return Parsed::Malformed;
    }
    Parsed::Arp(ArpFrame {
        op,
        sha: [arp[8], arp[9], arp[10], arp[11], arp[12], arp[13]],
        spa: u32::from_be_bytes([arp[14], arp[15], arp[16], arp[17]]),
        tha: [arp[18], arp[19], arp[20], arp[21], arp[22], arp[23]],
        tpa: u32::from_be_bytes([arp[24], arp[25], arp[26], arp[27]]),
        arp_offset,
        vlan_tags,
        vids: [0; MAX_VLAN_TAGS],
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::parse;

    fn arp(op: u16, spa: [u8; 4], tpa: [u8; 4]) -> [u8; ARP_LEN] {
        let mut a = [0u8; ARP_LEN];
        a[0..2].copy_from_slice(&ARPHRD_ETHER.to_be_bytes());
        a[2..4].copy_from_slice(&ETH_P_IP.to_be_bytes());
        a[4] = 6;
        a[5] = 4;
        a[6..8].copy_from_slice(&op.to_be_bytes());
        a[8..14].copy_from_slice(&[2, 0, 0, 0, 0, 1]);
        a[14..18].copy_from_slice(&spa);
        a[18..24].copy_from_slice(&[0xff; 6]);
        a[24..28].copy_from_slice(&tpa);
        a
    }

    fn frame(tags: &[u16], payload: &[u8]) -> ([u8; 64], usize) {
        let mut f = [0u8; 64];
        f[0..6].copy_from_slice(&[0xff; 6]);
        f[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 1]);
        let mut off = 12;
        for t in tags {
            f[off..off + 2].copy_from_slice(&t.to_be_bytes());
            // TCI: priority 5 and VLAN 7 + the tag's position (the VID is masked out).
            let vid = 7 + (off as u16 - 12) / 4;
            f[off + 2..off + 4].copy_from_slice(&(0xa000 | vid).to_be_bytes());
            off += 4;
        }
        f[off..off + 2].copy_from_slice(&ETH_P_ARP.to_be_bytes());
        off += 2;
        f[off..off + payload.len()].copy_from_slice(payload);
        (f, off + payload.len())
    }

    fn run(f: &[u8]) -> Parsed {
        let et = u16::from_be_bytes([f[12], f[13]]);
        parse(f, et)
    }

    #[test]
    fn untagged_reply() {
        let (f, n) = frame(&[], &arp(2, [198, 51, 100, 10], [198, 51, 100, 1]));
        let Parsed::Arp(a) = run(&f[..n]) else {
            panic!("not parsed")
        };
        assert_eq!(a.op, 2);
        assert_eq!(a.spa, u32::from_be_bytes([198, 51, 100, 10]));
        assert_eq!(a.tpa, u32::from_be_bytes([198, 51, 100, 1]));
        assert_eq!(a.arp_offset, 14);
        assert_eq!(a.spa_offset(), 28);
        assert_eq!(a.vlan_tags, 0);
    }

    #[test]
    fn single_and_double_tagged() {
        for (tags, off) in [
            (&[ETH_P_8021Q][..], 18),
            (&[ETH_P_8021AD][..], 18),
            (&[ETH_P_8021AD, ETH_P_8021Q][..], 22),
            (&[ETH_P_8021Q, ETH_P_8021Q][..], 22),
        ] {
            let (f, n) = frame(tags, &arp(1, [1, 2, 3, 4], [1, 2, 3, 4]));
            let Parsed::Arp(a) = run(&f[..n]) else {
                panic!("tags {tags:x?} not parsed")
            };
            assert_eq!(a.arp_offset, off);
            assert_eq!(a.vlan_tags as usize, tags.len());
            let want: [u16; MAX_VLAN_TAGS] = match tags.len() {
                1 => [7, 0],
                _ => [7, 8],
            };
            assert_eq!(a.vids, want, "VIDs outermost first, priority bits masked");
        }
    }

    #[test]
    fn three_tags_are_not_looked_through() {
        let (f, n) = frame(
            &[ETH_P_8021AD, ETH_P_8021Q, ETH_P_8021Q],
            &arp(2, [1; 4], [2; 4]),
        );
        assert_eq!(run(&f[..n]), Parsed::Other);
    }

    #[test]
    fn truncated_at_every_offset() {
        let (f, n) = frame(&[ETH_P_8021Q], &arp(2, [1; 4], [2; 4]));
        for len in 14..n {
            let got = run(&f[..len]);
            // Before the inner ethertype is complete we cannot tell it is ARP.
            let want = if len < 18 {
                Parsed::Other
            } else {
                Parsed::Malformed
            };
            assert_eq!(got, want, "len {len}");
        }
    }

    #[test]
    fn wrong_types_lengths_and_ops_are_malformed() {
        let good = arp(2, [1; 4], [2; 4]);
        let mut cases = [good; 6];
        cases[0][1] = 6; // htype 6 (IEEE 802)
        cases[1][2] = 0x86; // ptype 0x86dd
        cases[2][4] = 8; // hlen
        cases[3][5] = 16; // plen
        cases[4][7] = 3; // RARP request
        cases[5][7] = 0;
        for (i, c) in cases.iter().enumerate() {
            let (f, n) = frame(&[], c);
            assert_eq!(run(&f[..n]), Parsed::Malformed, "case {i}");
        }
    }

    #[test]
    fn non_arp_is_not_arp() {
        let (mut f, n) = frame(&[], &arp(2, [1; 4], [2; 4]));
        f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
        assert_eq!(run(&f[..n]), Parsed::Other);
    }
}
