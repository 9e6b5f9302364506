//! Building and reading ARP frames. Frames are built by guard-common's
//! builder (shared with `arp-guard probe`); [`Captured::parse`] reads them
//! with a decoder written independently of the guard's parser, so that tests
//! do not check the parser against itself.

use std::net::Ipv4Addr;

pub use guard_common::build::BROADCAST;

/// An Ethernet/IPv4 ARP frame to send.
#[derive(Debug, Clone)]
pub struct ArpSpec {
    pub eth_dst: [u8; 6],
    pub eth_src: [u8; 6],
    /// Tags in the frame data, outermost first: (TPID, VLAN id).
    pub vlans: Vec<(u16, u16)>,
    pub op: u16,
    pub sha: [u8; 6],
    pub spa: Ipv4Addr,
    pub tha: [u8; 6],
    pub tpa: Ipv4Addr,
}

impl ArpSpec {
    /// "spa is at mac", sent to `dst` (reply: op 2, SPA != TPA).
    pub fn reply(mac: [u8; 6], spa: Ipv4Addr, dst_mac: [u8; 6], tpa: Ipv4Addr) -> Self {
        ArpSpec {
            eth_dst: dst_mac,
            eth_src: mac,
            vlans: vec![],
            op: 2,
            sha: mac,
            spa,
            tha: dst_mac,
            tpa,
        }
    }

    /// Gratuitous ARP (SPA = TPA), as MetalLB sends it: op 1 or 2, broadcast.
    pub fn gratuitous(op: u16, mac: [u8; 6], ip: Ipv4Addr) -> Self {
        ArpSpec {
            eth_dst: BROADCAST,
            eth_src: mac,
            vlans: vec![],
            op,
            sha: mac,
            spa: ip,
            tha: BROADCAST,
            tpa: ip,
        }
    }

    /// An ordinary request "who has tpa? tell spa".
    pub fn request(mac: [u8; 6], spa: Ipv4Addr, tpa: Ipv4Addr) -> Self {
        ArpSpec {
            eth_dst: BROADCAST,
            eth_src: mac,
            vlans: vec![],
            op: 1,
            sha: mac,
            spa,
            tha: [0; 6],
            tpa,
        }
    }

    pub fn tagged(mut self, tags: &[(u16, u16)]) -> Self {
        self.vlans = tags.to_vec();
        self
    }

    /// The frame, written by guard-common's builder (the one `arp-guard
    /// probe` sends with), padded to the Ethernet minimum as a NIC would.
    pub fn to_bytes(&self) -> Vec<u8> {
        use guard_common::build::{write_arp, ArpPacket, Ethernet, FRAME_BUF};
        let tags: Vec<(u16, u16)> = self
            .vlans
            .iter()
            .map(|(tpid, vid)| (*tpid, vid & 0x0fff))
            .collect();
        let mut buf = [0u8; FRAME_BUF];
        let eth = Ethernet {
            dst: self.eth_dst,
            src: self.eth_src,
            tags: &tags,
        };
        let arp = ArpPacket {
            op: self.op,
            sha: self.sha,
            spa: u32::from(self.spa),
            tha: self.tha,
            tpa: u32::from(self.tpa),
        };
        let n = write_arp(&mut buf, &eth, &arp).expect("at most 5 VLAN tags");
        buf[..n].to_vec()
    }
}

/// An ARP frame seen on the wire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Captured {
    pub eth_src: [u8; 6],
    /// VLAN ids found in the data. A receiving kernel moves the outer tag to
    /// metadata before packet sockets see the frame, so captures usually show
    /// one tag fewer than was sent.
    pub vlans: Vec<u16>,
    pub op: u16,
    pub sha: [u8; 6],
    pub spa: Ipv4Addr,
    pub tha: [u8; 6],
    pub tpa: Ipv4Addr,
}

impl Captured {
    /// Decode `f` if it is an Ethernet/IPv4 ARP frame (through any VLAN tags).
    pub fn parse(f: &[u8]) -> Option<Captured> {
        let mut off = 12;
        let mut vlans = vec![];
        loop {
            let et = u16::from_be_bytes([*f.get(off)?, *f.get(off + 1)?]);
            match et {
                0x8100 | 0x88a8 => {
                    vlans.push(u16::from_be_bytes([*f.get(off + 2)?, *f.get(off + 3)?]) & 0x0fff);
                    off += 4;
                }
                0x0806 => break,
                _ => return None,
            }
        }
        let a = f.get(off + 2..off + 30)?;
        if a[0..2] != [0, 1] || a[2..4] != [8, 0] || a[4] != 6 || a[5] != 4 {
            return None;
        }
        let mac = |s: &[u8]| -> [u8; 6] { s.try_into().unwrap() };
        Some(Captured {
            eth_src: mac(&f[6..12]),
            vlans,
            op: u16::from_be_bytes([a[6], a[7]]),
            sha: mac(&a[8..14]),
            spa: Ipv4Addr::new(a[14], a[15], a[16], a[17]),
            tha: mac(&a[18..24]),
            tpa: Ipv4Addr::new(a[24], a[25], a[26], a[27]),
        })
    }
}

/// An IPv4 or IPv6 packet as a frame from `src_mac` to `dst_mac`: a UDP
/// datagram to `port` (`Some`), else an ICMP echo request (ICMPv6 for
/// IPv6). Checksums are left zero but the IPv4 header's: the census reads
/// addresses, and a stack that checks them drops the rest, which no test
/// counts on.
pub fn ip_bytes(
    src_mac: [u8; 6],
    dst_mac: [u8; 6],
    src: std::net::IpAddr,
    dst: std::net::IpAddr,
    port: Option<u16>,
) -> Vec<u8> {
    use std::net::IpAddr::{V4, V6};
    let payload: Vec<u8> = match port {
        Some(p) => [40000u16, p, 12, 0]
            .iter()
            .flat_map(|w| w.to_be_bytes())
            .chain(*b"ping")
            .collect(),
        None => {
            let ty = if dst.is_ipv6() { 128 } else { 8 };
            vec![ty, 0, 0, 0, 0x12, 0x34, 0, 1]
        }
    };
    let mut f = Vec::new();
    f.extend_from_slice(&dst_mac);
    f.extend_from_slice(&src_mac);
    match (src, dst) {
        (V4(s), V4(d)) => {
            f.extend_from_slice(&0x0800u16.to_be_bytes());
            let len = (20 + payload.len()) as u16;
            let proto = if port.is_some() { 17 } else { 1 };
            let mut h = vec![0x45, 0];
            h.extend_from_slice(&len.to_be_bytes());
            h.extend_from_slice(&[0, 0, 0x40, 0, 64, proto, 0, 0]);
            h.extend_from_slice(&s.octets());
            h.extend_from_slice(&d.octets());
            let sum: u32 = h
                .chunks(2)
                .map(|c| u32::from(u16::from_be_bytes([c[0], c[1]])))
                .sum();
            let sum = (sum & 0xffff) + (sum >> 16);
            let sum = !((sum & 0xffff) + (sum >> 16)) as u16;
            h[10..12].copy_from_slice(&sum.to_be_bytes());
            f.extend_from_slice(&h);
        }
        (V6(s), V6(d)) => {
            f.extend_from_slice(&0x86ddu16.to_be_bytes());
            f.extend_from_slice(&[0x60, 0, 0, 0]);
            f.extend_from_slice(&(payload.len() as u16).to_be_bytes());
            f.push(if port.is_some() { 17 } else { 58 });
            f.push(64);
            f.extend_from_slice(&s.octets());
            f.extend_from_slice(&d.octets());
        }
        _ => panic!("ip_bytes: {src} and {dst} are of two families"),
    }
    f.extend_from_slice(&payload);
    if f.len() < 60 {
        f.resize(60, 0);
    }
    f
}

/// An NDP message (`guard_common`'s builder, with a real ICMPv6 checksum) as a frame.
pub fn nd_bytes(spec: &guard_common::ndp_build::NdSpec) -> Vec<u8> {
    let mut buf = [0u8; guard_common::ndp_build::ND_FRAME_BUF];
    let n = guard_common::ndp_build::write_nd(&mut buf, spec);
    buf[..n].to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_tagged() {
        let s = ArpSpec::gratuitous(2, [2, 0, 0, 0, 0, 1], Ipv4Addr::new(198, 51, 100, 10))
            .tagged(&[(0x88a8, 100), (0x8100, 7)]);
        let b = s.to_bytes();
        assert_eq!(b.len(), 60);
        let c = Captured::parse(&b).unwrap();
        assert_eq!(c.vlans, vec![100, 7]);
        assert_eq!((c.op, c.spa, c.tpa), (2, s.spa, s.tpa));
    }
}
