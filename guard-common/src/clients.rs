//! Misdirected clients: IPv4 and IPv6 packets that arrive at this node for
//! an LB IP another node owns (`foreign` here). A client whose neighbour
//! cache still holds this node's MAC for the IP (a failover it has not
//! followed yet, or this node's kernel answered ARP for an IP it never
//! owned) sends its packets here. The census program records them by (LB
//! IP, client MAC) in an LRU map; the host turns the table into misdirected
//! and stale clients. Observe-only: the program never changes or stops a
//! frame.
//!
//! The cost is paid by foreign traffic only: every other packet (a node's
//! own traffic, an owned LB IP's: the bulk) is proven "not foreign" by one
//! bit of [`MAP_FOREIGN_FILTER`] (an inlined array read), before any hash
//! lookup. [`foreign_slot`] is the one place that says which bit stands for
//! an address; [`record`] how a packet is folded into its entry. The program
//! calls both on the real skb, the unit tests on plain values.

use crate::{
    frame::{FrameReader, ETH_HLEN},
    maps::{lb_filter_slot, IpKey, LB_FILTER_WORDS},
};

/// LRU hash of [`ClientKey`] -> [`ClientValue`]: when full, the least
/// recently seen clients make room (a flood of forged MACs cannot grow it).
pub const MAP_CLIENTS: &str = "CLIENTS";
/// Capacity of [`MAP_CLIENTS`]. Preallocated: about 130 bytes of kernel
/// memory per entry (key, value, hash element, LRU node), 1 MiB in all. A
/// client here is a MAC on the segment (a host, or the router in front of
/// many), per LB IP: a segment's worth is far below it.
pub const MAX_CLIENTS: u32 = 8_192;
/// Per-CPU array of u64 indexed by [`ClientStat`].
pub const MAP_CLIENT_STATS: &str = "CLIENT_STATS";
/// Array of [`FOREIGN_FILTER_WORDS`] u64: one bit per hash of an address
/// ([`foreign_slot`]), set for every LB IP of either family whose state is
/// `foreign`. A clear bit proves "not a foreign LB IP". Written by the
/// daemon after each write of the LB maps; never pinned.
pub const MAP_FOREIGN_FILTER: &str = "FOREIGN_FILTER";
/// 2^20 bits (128 KiB), as the LB filter.
pub const FOREIGN_FILTER_WORDS: u32 = LB_FILTER_WORDS;

/// Offsets in an untagged Ethernet frame. The program reads a destination
/// (IPv4) or its last four bytes (IPv6) at these on every packet, as a
/// big-endian u32.
const IPV4_SRC: usize = ETH_HLEN + 12;
pub const IPV4_DST: usize = ETH_HLEN + 16;
const IPV6_SRC: usize = ETH_HLEN + 8;
const IPV6_DST: usize = ETH_HLEN + 24;
/// The last four bytes of the IPv6 destination (what [`foreign_slot`] hashes).
pub const IPV6_DST_LOW: usize = IPV6_DST + 12;
/// Linux's PACKET_HOST: the frame was addressed to this host's MAC.
pub const PACKET_HOST: u32 = 0;

/// The bit of [`MAP_FOREIGN_FILTER`] that stands for `ip`: the LB
/// filter's hash of its last four bytes (the IPv4 address of an
/// IPv4-mapped key, so an IPv4 LB IP has the same bit in both filters).
/// The addresses of a pool differ in their low bits; two addresses that
/// share them (one per prefix) share a bit, which costs a hash lookup,
/// never a packet. Four bytes read, not sixteen: the program reads them on
/// every IPv6 packet.
#[inline(always)]
pub fn foreign_slot(ip: &IpKey) -> (u32, u64) {
    lb_filter_slot(u32::from_be_bytes([ip[12], ip[13], ip[14], ip[15]]))
}

/// [`foreign_slot`] of an IPv4 address (host order).
#[inline(always)]
pub fn foreign_slot_v4(ip: u32) -> (u32, u64) {
    lb_filter_slot(ip)
}

/// The IPv6 destination of an untagged IPv6 frame.
#[inline(always)]
pub fn v6_destination<R: FrameReader + ?Sized>(r: &R) -> Option<IpKey> {
    r.read::<16>(IPV6_DST)
}

/// Who sent a packet: the Ethernet source (what the client's neighbour
/// cache answered for the LB IP's next hop: the client itself, or the
/// router in front of it) and the IP source, as an [`IpKey`]. `None` when
/// the IP header is not of the family its ethertype says.
#[inline(always)]
pub fn client_v4<R: FrameReader + ?Sized>(r: &R) -> Option<([u8; 6], IpKey)> {
    let [version, ..] = r.read::<2>(ETH_HLEN)?;
    if version >> 4 != 4 {
        return None;
    }
    let src = u32::from_be_bytes(r.read::<4>(IPV4_SRC)?);
    Some((r.read::<6>(6)?, crate::maps::v4_key(src)))
}

/// [`client_v4`] for IPv6.
#[inline(always)]
pub fn client_v6<R: FrameReader + ?Sized>(r: &R) -> Option<([u8; 6], IpKey)> {
    let [version, ..] = r.read::<2>(ETH_HLEN)?;
    if version >> 4 != 6 {
        return None;
    }
    Some((r.read::<6>(6)?, r.read::<16>(IPV6_SRC)?))
}

/// One client of one LB IP.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClientKey {
    /// The LB IP the packets were for, as an [`IpKey`] (IPv4-mapped for IPv4).
    pub ip: IpKey,
    /// The client's MAC: the Ethernet source of its packets.
    pub mac: [u8; 6],
    pub _pad: [u8; 2],
}

impl ClientKey {
    #[inline(always)]
    pub const fn new(ip: IpKey, mac: [u8; 6]) -> Self {
        ClientKey {
            ip,
            mac,
            _pad: [0; 2],
        }
    }
}

/// What is known of one client.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ClientValue {
    /// Start of the current run of packets (CLOCK_MONOTONIC ns): a silence
    /// longer than the census window starts a new run.
    pub first_ns: u64,
    /// The latest packet.
    pub last_ns: u64,
    /// Packets since the entry was created.
    pub packets: u64,
    /// The IP source of the latest packet.
    pub client_ip: IpKey,
    /// The interface it arrived on.
    pub ifindex: u32,
    /// The VLAN ID of the tag the kernel took off the frame before TC
    /// ingress (skb metadata); 0: untagged.
    pub vlan: u16,
    pub _pad: [u8; 2],
}

/// Indexes into [`MAP_CLIENT_STATS`].
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientStat {
    /// Packets to a foreign LB IP recorded.
    Recorded = 0,
    /// Clients (LB IP, MAC) new to the table.
    NewClient = 1,
    /// A packet that could not be recorded (the map refused the insert).
    InsertFailed = 2,
    /// Packets to a foreign LB IP addressed to another host's MAC (a switch
    /// flooding unknown unicast, a promiscuous interface): not misdirected
    /// here, not recorded.
    OtherHost = 3,
}

impl ClientStat {
    pub const ALL: &'static [ClientStat] = &[
        ClientStat::Recorded,
        ClientStat::NewClient,
        ClientStat::InsertFailed,
        ClientStat::OtherHost,
    ];
    pub const COUNT: u32 = Self::ALL.len() as u32;

    pub const fn as_str(self) -> &'static str {
        match self {
            ClientStat::Recorded => "recorded",
            ClientStat::NewClient => "new_client",
            ClientStat::InsertFailed => "insert_failed",
            ClientStat::OtherHost => "other_host",
        }
    }
}

/// A fresh entry for a client's first packet.
#[inline(always)]
pub fn first(now_ns: u64, client_ip: IpKey, ifindex: u32, vlan: u16) -> ClientValue {
    ClientValue {
        first_ns: now_ns,
        last_ns: now_ns,
        packets: 1,
        client_ip,
        ifindex,
        vlan,
        _pad: [0; 2],
    }
}

/// Fold one more packet into `v`. A silence longer than `window_ns` since
/// the last packet starts a new run.
#[inline(always)]
pub fn record(
    v: &mut ClientValue,
    now_ns: u64,
    client_ip: IpKey,
    ifindex: u32,
    vlan: u16,
    window_ns: u64,
) {
    if now_ns.saturating_sub(v.last_ns) > window_ns {
        v.first_ns = now_ns;
    }
    v.last_ns = now_ns;
    v.packets = v.packets.saturating_add(1);
    v.client_ip = client_ip;
    v.ifindex = ifindex;
    v.vlan = vlan;
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY: repr(C), integers and byte arrays only, padding spelled out
    // as fields: every bit pattern is valid.
    unsafe impl aya::Pod for super::ClientKey {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::ClientValue {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::maps::v4_key;

    #[test]
    fn one_slot_per_address_whatever_its_form() {
        for ip in [0xc633_6466u32, 0x0a40_0001, 0, u32::MAX] {
            assert_eq!(foreign_slot(&v4_key(ip)), foreign_slot_v4(ip));
        }
        // A pool of IPv6 LB IPs spreads like a pool of IPv4 ones.
        let mut seen: [(u32, u64); 256] = [(0, 0); 256];
        for (i, slot) in seen.iter_mut().enumerate() {
            let mut k = [0u8; 16];
            k[0] = 0xfd;
            k[15] = i as u8;
            *slot = foreign_slot(&k);
            assert!(slot.0 < FOREIGN_FILTER_WORDS);
        }
        seen.sort_unstable();
        assert!(seen.windows(2).all(|w| w[0] != w[1]));
    }

    fn v4_frame(src: [u8; 4], dst: [u8; 4]) -> [u8; 34] {
        let mut f = [0u8; 34];
        f[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 7]);
        f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
        f[14] = 0x45;
        f[26..30].copy_from_slice(&src);
        f[30..34].copy_from_slice(&dst);
        f
    }

    #[test]
    fn packets_name_their_client_and_destination() {
        let be32 = |f: &[u8], at| f.read::<4>(at).map(u32::from_be_bytes);
        let f = v4_frame([198, 51, 100, 1], [198, 51, 100, 102]);
        assert_eq!(be32(&f[..], IPV4_DST), Some(0xc633_6466));
        let (mac, ip) = client_v4(&f[..]).unwrap();
        assert_eq!(mac, [2, 0, 0, 0, 0, 7]);
        assert_eq!(ip, v4_key(0xc633_6401));
        // Not IPv4 inside: no client.
        let mut bad = f;
        bad[14] = 0x65;
        assert_eq!(client_v4(&bad[..]), None);
        // Cut short: no destination.
        assert_eq!(be32(&f[..33], IPV4_DST), None);
        let mut v6 = [0u8; 54];
        v6[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 8]);
        v6[14] = 0x60;
        v6[22] = 0xfd;
        v6[38] = 0xfd;
        v6[53] = 0x02;
        let dst = v6_destination(&v6[..]).unwrap();
        assert_eq!((dst[0], dst[15]), (0xfd, 2));
        assert_eq!(be32(&v6[..], IPV6_DST_LOW), Some(2));
        assert_eq!(foreign_slot(&dst), lb_filter_slot(2));
        let (mac, src) = client_v6(&v6[..]).unwrap();
        assert_eq!((mac[5], src[0]), (8, 0xfd));
        assert_eq!(client_v4(&v6[..]), None);
    }

    #[test]
    fn a_long_silence_starts_a_new_run() {
        let s = 1_000_000_000u64;
        let ip = v4_key(1);
        let mut v = first(10 * s, ip, 3, 0);
        record(&mut v, 20 * s, v4_key(2), 4, 7, 60 * s);
        assert_eq!((v.first_ns, v.last_ns, v.packets), (10 * s, 20 * s, 2));
        assert_eq!((v.client_ip, v.ifindex, v.vlan), (v4_key(2), 4, 7));
        record(&mut v, 200 * s, ip, 4, 0, 60 * s);
        assert_eq!((v.first_ns, v.packets), (200 * s, 3));
        // A clock that went backwards is not a silence.
        record(&mut v, 100 * s, ip, 4, 0, 60 * s);
        assert_eq!(v.first_ns, 200 * s);
        assert_eq!(core::mem::size_of::<ClientKey>(), 24);
        assert_eq!(core::mem::size_of::<ClientValue>(), 48);
    }
}
