//! The responder census: who claims each LB IP on the segment, as seen
//! arriving at this node. The TC ingress program records every ARP reply,
//! gratuitous ARP and announcement whose sender IP is an LB IP, keyed by the
//! sender hardware address (what a neighbour's cache learns), and every
//! IPv6 Neighbor Advertisement (or solicitation with a source link-layer
//! option) about an IPv6 LB IP, keyed by its Ethernet source; the host turns
//! the table into responders and conflicts. Observe-only: the program never
//! changes or stops a frame.
//!
//! [`claim`] is the one place that says which frames are claims, and
//! [`record`] how one is folded into its entry; the program calls both on the
//! real skb, the unit tests on plain values.

use crate::{
    frame::ArpFrame,
    maps::IpKey,
    verdict::{classify, Kind},
};

/// LRU hash of [`ResponderKey`] -> [`ResponderValue`]: when full, the least
/// recently claimed entries make room.
pub const MAP_RESPONDERS: &str = "RESPONDERS";
/// Capacity of [`MAP_RESPONDERS`]. Preallocated: about 100 bytes of kernel
/// memory per entry (key, value, hash element), 1.6 MiB in all.
pub const MAX_RESPONDERS: u32 = 16_384;
/// Per-CPU array of u64 indexed by [`CensusStat`].
pub const MAP_CENSUS_STATS: &str = "CENSUS_STATS";

/// One claimant of one LB IP.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ResponderKey {
    /// The LB IP claimed (ARP SPA; an NA's target, an NS's source), as an
    /// [`IpKey`] (IPv4-mapped for IPv4).
    pub ip: IpKey,
    /// Who claims it (ARP SHA; NDP: the Ethernet source, which speakers and
    /// the kernel also put in the link-layer option): the MAC a neighbour
    /// would cache.
    pub mac: [u8; 6],
    pub _pad: [u8; 2],
}

impl ResponderKey {
    #[inline(always)]
    pub const fn new(ip: IpKey, mac: [u8; 6]) -> Self {
        ResponderKey {
            ip,
            mac,
            _pad: [0; 2],
        }
    }
}

/// What is known of one claimant.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ResponderValue {
    /// Start of the current run of claims (CLOCK_MONOTONIC ns): a silence
    /// longer than the census window starts a new run, so a node that
    /// claims the IP again long after a failover is not mistaken for one
    /// that kept claiming it throughout.
    pub first_ns: u64,
    /// The latest claim.
    pub last_ns: u64,
    /// Claims since the entry was created.
    pub count: u64,
    /// The interface the latest claim arrived on.
    pub ifindex: u32,
    /// One bit per [`Kind`] seen (`1 << kind`).
    pub kinds: u8,
    pub _pad: [u8; 3],
}

/// Indexes into [`MAP_CENSUS_STATS`].
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CensusStat {
    /// ARP frames the census program parsed.
    Arp = 0,
    /// Claims of an LB IP recorded.
    Claims = 1,
    /// A claim that could not be recorded (the map refused the insert).
    InsertFailed = 2,
    /// NDP messages (NS, NA) the census program parsed.
    Ndp = 3,
}

impl CensusStat {
    pub const ALL: &'static [CensusStat] = &[
        CensusStat::Arp,
        CensusStat::Claims,
        CensusStat::InsertFailed,
        CensusStat::Ndp,
    ];
    pub const COUNT: u32 = Self::ALL.len() as u32;

    pub const fn as_str(self) -> &'static str {
        match self {
            CensusStat::Arp => "arp",
            CensusStat::Claims => "claims",
            CensusStat::InsertFailed => "insert_failed",
            CensusStat::Ndp => "ndp",
        }
    }
}

/// Is this arriving ARP frame a claim of its sender IP, and of what kind?
/// The same three kinds the egress guard stops: each one teaches whoever
/// receives it "SPA is at SHA". (Whether SPA is an LB IP is the caller's
/// map lookup.) A probe (SPA 0.0.0.0) claims nothing.
#[inline(always)]
pub fn claim_kind(arp: &ArpFrame) -> Option<Kind> {
    if arp.spa == 0 {
        return None;
    }
    classify(arp)
}

/// A fresh entry for a first claim.
#[inline(always)]
pub fn first(now_ns: u64, kind: Kind, ifindex: u32) -> ResponderValue {
    ResponderValue {
        first_ns: now_ns,
        last_ns: now_ns,
        count: 1,
        ifindex,
        kinds: 1 << (kind as u8),
        _pad: [0; 3],
    }
}

/// Fold one more claim into `v`. A silence longer than `window_ns` since
/// the last claim starts a new run.
#[inline(always)]
pub fn record(v: &mut ResponderValue, now_ns: u64, kind: Kind, ifindex: u32, window_ns: u64) {
    if now_ns.saturating_sub(v.last_ns) > window_ns {
        v.first_ns = now_ns;
    }
    v.last_ns = now_ns;
    v.count = v.count.saturating_add(1);
    v.ifindex = ifindex;
    v.kinds |= 1 << (kind as u8);
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY: repr(C), integers and byte arrays only, padding spelled out
    // as fields: every bit pattern is valid.
    unsafe impl aya::Pod for super::ResponderKey {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::ResponderValue {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{ARPOP_REPLY, ARPOP_REQUEST};

    fn arp(op: u16, spa: u32, tpa: u32) -> ArpFrame {
        ArpFrame {
            op,
            sha: [2, 0, 0, 0, 0, 1],
            spa,
            tha: [0; 6],
            tpa,
            arp_offset: 14,
            vlan_tags: 0,
            vids: [0; crate::frame::MAX_VLAN_TAGS],
        }
    }

    #[test]
    fn claims_are_what_teaches_a_neighbour() {
        assert_eq!(claim_kind(&arp(ARPOP_REPLY, 7, 9)), Some(Kind::Reply));
        assert_eq!(claim_kind(&arp(ARPOP_REPLY, 7, 7)), Some(Kind::Gratuitous));
        assert_eq!(
            claim_kind(&arp(ARPOP_REQUEST, 7, 7)),
            Some(Kind::Gratuitous)
        );
        assert_eq!(
            claim_kind(&arp(ARPOP_REQUEST, 7, 9)),
            Some(Kind::AnnounceLeak)
        );
        // RFC 5227 probe: "who has 7?" from nobody.
        assert_eq!(claim_kind(&arp(ARPOP_REQUEST, 0, 7)), None);
        assert_eq!(claim_kind(&arp(3, 7, 9)), None);
    }

    #[test]
    fn a_long_silence_starts_a_new_run() {
        let s = 1_000_000_000u64;
        let mut v = first(10 * s, Kind::Gratuitous, 3);
        record(&mut v, 20 * s, Kind::Reply, 4, 60 * s);
        assert_eq!((v.first_ns, v.last_ns, v.count), (10 * s, 20 * s, 2));
        assert_eq!(v.kinds, 0b11);
        assert_eq!(v.ifindex, 4);
        record(&mut v, 200 * s, Kind::Reply, 4, 60 * s);
        assert_eq!((v.first_ns, v.last_ns, v.count), (200 * s, 200 * s, 3));
        // A clock that went backwards is not a silence.
        record(&mut v, 100 * s, Kind::Reply, 4, 60 * s);
        assert_eq!(v.first_ns, 200 * s);
        assert_eq!(core::mem::size_of::<ResponderKey>(), 24);
        assert_eq!(core::mem::size_of::<ResponderValue>(), 32);
    }
}
