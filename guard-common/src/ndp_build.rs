//! Writing an NDP frame (Neighbor Solicitation or Advertisement over IPv6,
//! with a valid ICMPv6 checksum so that a real neighbour believes it): the
//! builder the unit tests, the differential fuzzing and the integration
//! tests share. [`crate::ndp::parse_ipv6`] reads what this writes.

use crate::ndp::{
    ETH_P_IPV6, IPV6_HLEN, ND_MIN_LEN, ND_NEIGHBOR_ADVERT, ND_NEIGHBOR_SOLICIT, ND_OPT_SOURCE_LL,
    ND_OPT_TARGET_LL, NEXTHDR_DEST, NEXTHDR_ICMPV6,
};

/// Room for a frame with two tags, [`crate::ndp::MAX_EXT_HEADERS`] + 1
/// extension headers and one option.
pub const ND_FRAME_BUF: usize = 160;

/// An NDP message to write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NdSpec {
    pub eth_src: [u8; 6],
    pub eth_dst: [u8; 6],
    /// VLAN tags in the frame data, outermost first: (TPID, TCI).
    pub tags: [Option<(u16, u16)>; 2],
    pub src: [u8; 16],
    pub dst: [u8; 16],
    pub icmp_type: u8,
    /// NA flags (R, S, O).
    pub flags: u8,
    pub target: [u8; 16],
    /// Carry the link-layer address option (source for an NS, target for
    /// an NA) with `eth_src`.
    pub sll: bool,
    /// Empty destination-options headers before ICMPv6.
    pub ext_headers: u8,
    pub hop_limit: u8,
}

/// The solicited-node multicast address of `ip` (ff02::1:ffXX:XXXX).
pub fn solicited_node(ip: [u8; 16]) -> [u8; 16] {
    let mut a = [0u8; 16];
    a[0] = 0xff;
    a[1] = 0x02;
    a[11] = 0x01;
    a[12] = 0xff;
    a[13..].copy_from_slice(&ip[13..]);
    a
}

/// The Ethernet address of an IPv6 multicast group (33:33 + its last 32 bits).
pub fn multicast_mac(group: [u8; 16]) -> [u8; 6] {
    [0x33, 0x33, group[12], group[13], group[14], group[15]]
}

/// ff02::1, all nodes.
pub const ALL_NODES: [u8; 16] = [0xff, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];

impl NdSpec {
    /// "`target` is at `mac`", to `dst` (at `eth_dst`), with `flags`; the
    /// source is the target itself, as the kernel answers.
    pub fn advert(
        mac: [u8; 6],
        target: [u8; 16],
        eth_dst: [u8; 6],
        dst: [u8; 16],
        flags: u8,
    ) -> Self {
        NdSpec {
            eth_src: mac,
            eth_dst,
            tags: [None, None],
            src: target,
            dst,
            icmp_type: ND_NEIGHBOR_ADVERT,
            flags,
            target,
            sll: true,
            ext_headers: 0,
            hop_limit: 255,
        }
    }

    /// An unsolicited advertisement with the override flag to all nodes:
    /// what a speaker sends when it takes an address over.
    pub fn unsolicited(mac: [u8; 6], target: [u8; 16]) -> Self {
        Self::advert(
            mac,
            target,
            multicast_mac(ALL_NODES),
            ALL_NODES,
            crate::ndp::NA_FLAG_OVERRIDE,
        )
    }

    /// "Who has `target`? Tell `src` (at `mac`)", to the solicited-node group.
    pub fn solicit(mac: [u8; 6], src: [u8; 16], target: [u8; 16]) -> Self {
        let group = solicited_node(target);
        NdSpec {
            eth_src: mac,
            eth_dst: multicast_mac(group),
            tags: [None, None],
            src,
            dst: group,
            icmp_type: ND_NEIGHBOR_SOLICIT,
            flags: 0,
            target,
            sll: true,
            ext_headers: 0,
            hop_limit: 255,
        }
    }
}

/// Write `spec` into `out`; returns the frame's length, or 0 when `out` is
/// shorter than [`ND_FRAME_BUF`] or `ext_headers` does not fit.
pub fn write_nd(out: &mut [u8], spec: &NdSpec) -> usize {
    if out.len() < ND_FRAME_BUF || spec.ext_headers > 6 {
        return 0;
    }
    out[..ND_FRAME_BUF].fill(0);
    out[0..6].copy_from_slice(&spec.eth_dst);
    out[6..12].copy_from_slice(&spec.eth_src);
    let mut at = 12;
    for (tpid, tci) in spec.tags.iter().flatten() {
        out[at..at + 2].copy_from_slice(&tpid.to_be_bytes());
        out[at + 2..at + 4].copy_from_slice(&tci.to_be_bytes());
        at += 4;
    }
    out[at..at + 2].copy_from_slice(&ETH_P_IPV6.to_be_bytes());
    let ip = at + 2;
    let ext = spec.ext_headers as usize * 8;
    let icmp_len = ND_MIN_LEN + if spec.sll { 8 } else { 0 };
    out[ip] = 0x60;
    out[ip + 4..ip + 6].copy_from_slice(&((ext + icmp_len) as u16).to_be_bytes());
    out[ip + 6] = if ext > 0 {
        NEXTHDR_DEST
    } else {
        NEXTHDR_ICMPV6
    };
    out[ip + 7] = spec.hop_limit;
    out[ip + 8..ip + 24].copy_from_slice(&spec.src);
    out[ip + 24..ip + 40].copy_from_slice(&spec.dst);
    let mut h = ip + IPV6_HLEN;
    for i in 0..spec.ext_headers {
        // Next header, length 0 (8 bytes), PadN of 4 bytes.
        out[h] = if i + 1 == spec.ext_headers {
            NEXTHDR_ICMPV6
        } else {
            NEXTHDR_DEST
        };
        out[h + 2] = 1;
        out[h + 3] = 4;
        h += 8;
    }
    let icmp = h;
    out[icmp] = spec.icmp_type;
    out[icmp + 4] = spec.flags;
    out[icmp + 8..icmp + 24].copy_from_slice(&spec.target);
    if spec.sll {
        out[icmp + 24] = if spec.icmp_type == ND_NEIGHBOR_ADVERT {
            ND_OPT_TARGET_LL
        } else {
            ND_OPT_SOURCE_LL
        };
        out[icmp + 25] = 1;
        out[icmp + 26..icmp + 32].copy_from_slice(&spec.eth_src);
    }
    let sum = checksum(&spec.src, &spec.dst, &out[icmp..icmp + icmp_len]);
    out[icmp + 2..icmp + 4].copy_from_slice(&sum.to_be_bytes());
    icmp + icmp_len
}

/// The ICMPv6 checksum (RFC 4443 2.3: over the pseudo-header and the message).
pub fn checksum(src: &[u8; 16], dst: &[u8; 16], msg: &[u8]) -> u16 {
    let mut sum: u32 = 0;
    let mut add = |b: &[u8]| {
        for c in b.chunks(2) {
            let hi = u32::from(c[0]) << 8;
            sum += hi | c.get(1).map_or(0, |&l| u32::from(l));
        }
    };
    add(src);
    add(dst);
    add(&(msg.len() as u32).to_be_bytes());
    add(&[0, 0, 0, NEXTHDR_ICMPV6]);
    add(msg);
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksum_verifies_to_zero() {
        let mut buf = [0u8; ND_FRAME_BUF];
        let n = write_nd(
            &mut buf,
            &NdSpec::solicit([2, 0, 0, 0, 0, 1], [0xfd; 16], [0xfd; 16]),
        );
        let (src, dst) = (
            buf[22..38].try_into().unwrap(),
            buf[38..54].try_into().unwrap(),
        );
        // Summing a message with its checksum in gives all ones (0 inverted).
        assert_eq!(checksum(&src, &dst, &buf[54..n]), 0);
        assert_eq!(
            solicited_node([0xfd; 16])[11..],
            [1, 0xff, 0xfd, 0xfd, 0xfd]
        );
    }
}
