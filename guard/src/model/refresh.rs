//! Healing stale clients (opt-in, `--refresh-stale-clients`), pure: a
//! client whose traffic for an LB IP still arrives here although another
//! node owns it has a cache that points here. This node may send that
//! client one unicast ARP reply (IPv6: an overriding Neighbor
//! Advertisement) that teaches the **owner's** MAC:
//!
//! - only when the owner's MAC is known with certainty ([`OwnerMac`]): the
//!   census saw exactly one MAC, not this node's, begin claiming the IP since the
//!   move (and no conflict), while the ownership source says another node
//!   owns it; with presence, the owner node's own record confirms that MAC
//!   or, for a silent owner nobody else claims for, names its only MAC
//!   ([`owner_with_presence`]: presence confirms or vetoes, never overrules
//!   the census);
//! - never for an IP that is not `foreign` here, and never while the guard
//!   is blind (its `foreign` may be old news);
//! - never with one of this node's MACs (that is exactly what the guard
//!   exists to prevent);
//! - at most `per_minute` times per client and IP.
//!
//! The Ethernet source of a refresh is this node's interface (a switch must
//! keep learning the owner's MAC on the owner's port); the ARP sender
//! hardware address (NDP: the target link-layer option) is the owner's:
//! what a neighbour caches.

use std::{
    collections::{BTreeSet, HashMap, VecDeque},
    net::IpAddr,
};

use guard_common::Ownership;

/// One client whose packets for `ip` arrive here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Client {
    /// The LB IP its packets are for.
    pub ip: IpAddr,
    /// Its MAC (the frames' source) and IP (their source).
    pub mac: [u8; 6],
    pub client_ip: IpAddr,
    /// Where its packets arrive, and their VLAN ID (0: untagged).
    pub ifindex: u32,
    pub vlan: u16,
}

/// How well the owner's MAC is known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OwnerMac {
    /// Known: this MAC, and why.
    Certain { mac: [u8; 6], evidence: Evidence },
    /// Not known well enough to teach anyone: why not.
    Uncertain(&'static str),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Evidence {
    /// The census saw the owner announce it since the move, alone.
    Census,
    /// The owner node's own presence record lists it.
    Presence,
}

impl Evidence {
    pub fn as_str(self) -> &'static str {
        match self {
            Evidence::Census => "census",
            Evidence::Presence => "presence",
        }
    }
}

/// What presence tells about an IP's owner: the MACs of its node's live
/// record (empty: it has none), and every live guard's uplink MACs.
#[derive(Debug, Clone, Copy)]
pub struct Presence<'a> {
    pub owner: &'a BTreeSet<[u8; 6]>,
    pub uplink_macs: &'a BTreeSet<[u8; 6]>,
}

/// The owner's MAC with presence beside a census that was read
/// (`census`: what [`owner_from_census`] found). Presence confirms or
/// vetoes, it never overrules what the census saw:
///
/// - one of the owner's MACs (its node's live record) claimed the IP since
///   the move, alone among them: that MAC (a rogue beside it is not taught);
/// - none of them did: its only MAC, if no other MAC began claiming since
///   the move either (a silent owner); a MAC outside the record claiming
///   means the record or the segment is not what it says: nothing;
/// - no record of the owner: the census's answer, unless it names another
///   guarded node's MAC (a rogue node).
///
/// The owner's own MACs count by their latest claim (it may have claimed
/// the IP before, at an earlier turn); others by the start of their run.
pub fn owner_with_presence(
    census: OwnerMac,
    claimants: &[Claimant],
    since_ns: u64,
    local: &BTreeSet<[u8; 6]>,
    p: Presence<'_>,
) -> OwnerMac {
    let certain = |mac| OwnerMac::Certain {
        mac,
        evidence: Evidence::Presence,
    };
    if p.owner.is_empty() {
        return match census {
            OwnerMac::Certain { mac, .. } if p.uplink_macs.contains(&mac) => {
                OwnerMac::Uncertain("the only claimant is another guarded node's MAC (a rogue)")
            }
            other => other,
        };
    }
    let mut owners: Vec<[u8; 6]> = (claimants.iter())
        .filter(|c| c.last_ns >= since_ns && p.owner.contains(&c.mac))
        .map(|c| c.mac)
        .collect();
    owners.sort_unstable();
    owners.dedup();
    let others = (claimants.iter())
        .any(|c| c.first_ns >= since_ns && !p.owner.contains(&c.mac) && !local.contains(&c.mac));
    match (owners.as_slice(), p.owner.len()) {
        ([mac], _) => certain(*mac),
        ([], 1) if !others => p.owner.iter().next().map_or(census, |m| certain(*m)),
        ([], _) if others => OwnerMac::Uncertain(
            "a MAC outside the owner's presence record claims the IP, and none of the owner's",
        ),
        _ => OwnerMac::Uncertain("the owner's presence record does not say which of its MACs"),
    }
}

/// A MAC that claimed an LB IP on the segment, as the census saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claimant {
    pub mac: [u8; 6],
    /// The start of its current run of claims, and its latest claim
    /// (CLOCK_MONOTONIC ns).
    pub first_ns: u64,
    pub last_ns: u64,
}

/// The owner's MAC from the census: exactly one MAC that is not this
/// node's began claiming the IP since `since_ns` (the move, less the hold
/// window: the new owner's first announcements can precede the move as the
/// feed saw it), and the census sees no conflict for it. A MAC that was
/// already claiming before the move (the old owner answering still, a rogue
/// that never stopped) never qualifies.
pub fn owner_from_census(
    claimants: &[Claimant],
    conflict: bool,
    since_ns: u64,
    local: &BTreeSet<[u8; 6]>,
) -> OwnerMac {
    if conflict {
        return OwnerMac::Uncertain("the census sees a conflict for the IP");
    }
    let mut since: Vec<[u8; 6]> = claimants
        .iter()
        .filter(|c| c.first_ns >= since_ns && !local.contains(&c.mac))
        .map(|c| c.mac)
        .collect();
    since.sort_unstable();
    since.dedup();
    match since.as_slice() {
        [mac] => OwnerMac::Certain {
            mac: *mac,
            evidence: Evidence::Census,
        },
        [] => OwnerMac::Uncertain("no announcement of the IP seen since the move"),
        _ => OwnerMac::Uncertain("more than one MAC announced the IP since the move"),
    }
}

#[cfg(test)]
mod presence_tests {
    use super::*;

    const X: [u8; 6] = [2, 0, 0, 0, 0, 0xa];
    const Y: [u8; 6] = [2, 0, 0, 0, 0, 0xb];
    const R: [u8; 6] = [2, 0, 0, 0, 0, 0x66];

    fn claim(mac: [u8; 6], last_ns: u64) -> Claimant {
        Claimant {
            mac,
            first_ns: last_ns,
            last_ns,
        }
    }

    #[test]
    fn the_owners_record_makes_its_mac_certain_and_a_rogue_node_is_never_taught() {
        let census_r = OwnerMac::Certain {
            mac: R,
            evidence: Evidence::Census,
        };
        let none = BTreeSet::new();
        let one = BTreeSet::from([X]);
        let two = BTreeSet::from([X, Y]);
        let uplink_macs = BTreeSet::from([X, Y, R]);
        let p = |owner| Presence {
            owner,
            uplink_macs: &uplink_macs,
        };
        let local = BTreeSet::new();
        let with = |census, claims: &[Claimant], owner| {
            owner_with_presence(census, claims, 5, &local, p(owner))
        };
        // The owner's MAC claimed since the move: certain, rogue beside it
        // or not.
        let both = [claim(X, 10), claim(R, 10)];
        assert_eq!(
            with(census_r, &both, &one),
            OwnerMac::Certain {
                mac: X,
                evidence: Evidence::Presence
            }
        );
        // Two MACs in its record: the one that claimed since the move.
        assert_eq!(
            with(census_r, &[claim(Y, 10), claim(X, 1)], &two),
            OwnerMac::Certain {
                mac: Y,
                evidence: Evidence::Presence
            }
        );
        // A silent owner with one MAC: that MAC, while nobody else claims.
        assert_eq!(
            with(OwnerMac::Uncertain("none"), &[], &one),
            OwnerMac::Certain {
                mac: X,
                evidence: Evidence::Presence
            }
        );
        // A silent owner while another MAC claims (a rogue node, or the
        // owner announcing from a NIC its record does not list): nothing.
        assert!(matches!(
            with(census_r, &[claim(R, 10)], &one),
            OwnerMac::Uncertain(_)
        ));
        let stranger_mac = [2, 0, 0, 0, 0, 0x77];
        let census_s = OwnerMac::Certain {
            mac: stranger_mac,
            evidence: Evidence::Census,
        };
        assert!(matches!(
            with(census_s, &[claim(stranger_mac, 10)], &one),
            OwnerMac::Uncertain(_)
        ));
        // One that claimed before the move does not stop a silent owner.
        let old = Claimant {
            mac: R,
            first_ns: 1,
            last_ns: 10,
        };
        assert!(matches!(
            with(census_r, &[old], &one),
            OwnerMac::Certain { mac: X, .. }
        ));
        // Two MACs, none seen: nothing.
        assert!(matches!(
            with(census_r, &[claim(R, 10)], &two),
            OwnerMac::Uncertain(_)
        ));
        // No record of the owner: the census stands unless it names a guarded node.
        assert!(matches!(
            with(census_r, &[], &none),
            OwnerMac::Uncertain(why) if why.contains("rogue")
        ));
        assert_eq!(with(census_s, &[], &none), census_s);
    }
}

/// Why a client was not refreshed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Skip {
    /// The IP is not `foreign` here (owned: the client is right; unknown:
    /// nobody knows the owner).
    NotForeign,
    /// The ownership feed is blind or degraded.
    Blind,
    /// The owner's MAC is not known with certainty.
    OwnerUncertain(&'static str),
    /// The MAC to teach is one of this node's.
    OwnMac,
    /// The client had its refreshes for this minute.
    RateLimited,
}

impl Skip {
    /// The `outcome` label of the refresh counter.
    pub fn as_str(self) -> &'static str {
        match self {
            Skip::NotForeign => "not_foreign",
            Skip::Blind => "blind",
            Skip::OwnerUncertain(_) => "owner_uncertain",
            Skip::OwnMac => "own_mac",
            Skip::RateLimited => "rate_limited",
        }
    }
}

/// What the decision needs about the IP, now.
#[derive(Debug, Clone, Copy)]
pub struct RefreshFacts<'a> {
    pub state: Ownership,
    /// The ownership source cannot be trusted now (blind or degraded feed).
    pub blind: bool,
    pub owner: OwnerMac,
    /// Every MAC of this node.
    pub local: &'a BTreeSet<[u8; 6]>,
}

/// The refresh for `c`: "the LB IP is at `owner`", unicast to the client,
/// from this node's interface (`ours`), tagged as the client's packets
/// came (its VLAN). IPv4: an ARP reply whose sender hardware address is the
/// owner's; IPv6: an unsolicited, overriding advertisement whose target
/// link-layer option is the owner's, addressed to all nodes at the IPv6
/// layer (a router's packets carry a remote source: an advertisement
/// addressed to it would be forwarded, not read) but to the client's MAC
/// only. None when the families do not match.
pub fn refresh_frame(c: &Client, owner: [u8; 6], ours: [u8; 6]) -> Option<Vec<u8>> {
    const TPID_8021Q: u16 = 0x8100;
    let tag = (c.vlan != 0).then_some((TPID_8021Q, c.vlan & 0x0fff));
    match (c.ip, c.client_ip) {
        (IpAddr::V4(lb), IpAddr::V4(client)) => {
            use guard_common::build::{write_arp, ArpPacket, Ethernet, FRAME_BUF};
            let tags: Vec<(u16, u16)> = tag.into_iter().collect();
            let eth = Ethernet {
                dst: c.mac,
                src: ours,
                tags: &tags,
            };
            let arp = ArpPacket::reply(owner, u32::from(lb), c.mac, u32::from(client));
            let mut buf = [0u8; FRAME_BUF];
            let n = write_arp(&mut buf, &eth, &arp)?;
            Some(buf[..n].to_vec())
        }
        (IpAddr::V6(lb), IpAddr::V6(_)) => {
            use guard_common::{
                ndp::NA_FLAG_OVERRIDE,
                ndp_build::{write_nd, NdSpec, ALL_NODES, ND_FRAME_BUF},
            };
            // The builder puts its Ethernet source into the option: build
            // with the owner's, then put ours in the Ethernet header (the
            // ICMPv6 checksum does not cover it).
            let spec = NdSpec {
                tags: [tag, None],
                ..NdSpec::advert(owner, lb.octets(), c.mac, ALL_NODES, NA_FLAG_OVERRIDE)
            };
            let mut buf = [0u8; ND_FRAME_BUF];
            let n = write_nd(&mut buf, &spec);
            if n == 0 {
                return None;
            }
            buf[6..12].copy_from_slice(&ours);
            Some(buf[..n].to_vec())
        }
        _ => None,
    }
}

const MINUTE_NS: u64 = 60_000_000_000;

/// The refreshes sent, per (LB IP, client MAC), within the last minute.
#[derive(Debug)]
pub struct Refresher {
    per_minute: u32,
    sent: HashMap<(IpAddr, [u8; 6]), VecDeque<u64>>,
}

impl Refresher {
    pub fn new(per_minute: u32) -> Self {
        Refresher {
            per_minute: per_minute.max(1),
            sent: HashMap::new(),
        }
    }

    /// Whether to refresh `c` now, and with which MAC; a refresh decided is
    /// counted against the client's minute.
    pub fn decide(
        &mut self,
        c: &Client,
        f: &RefreshFacts<'_>,
        now_ns: u64,
    ) -> Result<[u8; 6], Skip> {
        if f.state != Ownership::Foreign {
            return Err(Skip::NotForeign);
        }
        if f.blind {
            return Err(Skip::Blind);
        }
        let mac = match f.owner {
            OwnerMac::Certain { mac, .. } => mac,
            OwnerMac::Uncertain(why) => return Err(Skip::OwnerUncertain(why)),
        };
        if f.local.contains(&mac) {
            return Err(Skip::OwnMac);
        }
        // A group or all-zero address is nobody's interface.
        if mac[0] & 1 != 0 || mac == [0; 6] {
            return Err(Skip::OwnerUncertain("not a unicast MAC"));
        }
        let times = self.sent.entry((c.ip, c.mac)).or_default();
        while times
            .front()
            .is_some_and(|t| now_ns.saturating_sub(*t) >= MINUTE_NS)
        {
            times.pop_front();
        }
        if times.len() >= self.per_minute as usize {
            return Err(Skip::RateLimited);
        }
        times.push_back(now_ns);
        Ok(mac)
    }

    /// Forget clients with no refresh in the last minute (what is kept is
    /// bounded by the clients seen in a minute, themselves bounded by the
    /// census's client table).
    pub fn prune(&mut self, now_ns: u64) {
        self.sent.retain(|_, times| {
            times
                .back()
                .is_some_and(|t| now_ns.saturating_sub(*t) < MINUTE_NS)
        });
    }

    /// Clients with a refresh in the last minute.
    #[cfg(test)]
    pub fn tracked(&self) -> usize {
        self.sent.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;
    const OWNER: [u8; 6] = [2, 0, 0, 0, 0, 0xb];
    const ROGUE: [u8; 6] = [2, 0, 0, 0, 0, 0x66];
    const OURS: [u8; 6] = [2, 0, 0, 0, 0, 0xa];

    fn client() -> Client {
        Client {
            ip: "198.51.100.100".parse().unwrap(),
            mac: [2, 0, 0, 0, 0, 1],
            client_ip: "198.51.100.1".parse().unwrap(),
            ifindex: 2,
            vlan: 0,
        }
    }

    #[test]
    fn the_owner_is_certain_only_alone_since_the_move() {
        let local = BTreeSet::from([OURS]);
        let c = |mac, last_ns| Claimant {
            mac,
            first_ns: last_ns,
            last_ns,
        };
        // The old owner (this node) and the new one: only the new one counts.
        assert_eq!(
            owner_from_census(&[c(OURS, 12 * S), c(OWNER, 11 * S)], false, 10 * S, &local),
            OwnerMac::Certain {
                mac: OWNER,
                evidence: Evidence::Census
            }
        );
        // A claimant from before the move is history.
        assert!(matches!(
            owner_from_census(&[c(ROGUE, 5 * S)], false, 10 * S, &local),
            OwnerMac::Uncertain(_)
        ));
        // Two since the move, or a conflict: nobody is taught.
        assert!(matches!(
            owner_from_census(&[c(OWNER, 11 * S), c(ROGUE, 12 * S)], false, 10 * S, &local),
            OwnerMac::Uncertain(_)
        ));
        assert!(matches!(
            owner_from_census(&[c(OWNER, 11 * S)], true, 10 * S, &local),
            OwnerMac::Uncertain(_)
        ));
        // A rogue (or the old owner) claiming since before the move and
        // still: it never qualifies; the new owner alone after it does.
        let since_before = Claimant {
            mac: ROGUE,
            first_ns: 5 * S,
            last_ns: 12 * S,
        };
        assert!(matches!(
            owner_from_census(&[since_before], false, 10 * S, &local),
            OwnerMac::Uncertain(_)
        ));
        assert_eq!(
            owner_from_census(&[since_before, c(OWNER, 11 * S)], false, 10 * S, &local),
            OwnerMac::Certain {
                mac: OWNER,
                evidence: Evidence::Census
            }
        );
    }

    #[test]
    fn a_refresh_teaches_the_owner_from_our_interface() {
        let c = client();
        let f = refresh_frame(&c, OWNER, OURS).unwrap();
        assert_eq!(&f[0..6], &c.mac, "unicast to the client");
        assert_eq!(&f[6..12], &OURS, "from this node's interface");
        let ethertype = u16::from_be_bytes([f[12], f[13]]);
        let guard_common::Parsed::Arp(arp) = guard_common::parse(&f[..], ethertype) else {
            panic!("not ARP")
        };
        assert_eq!((arp.op, arp.sha, arp.tha), (2, OWNER, c.mac));
        assert_eq!(arp.spa, u32::from_be_bytes([198, 51, 100, 100]));
        assert_eq!(arp.tpa, u32::from_be_bytes([198, 51, 100, 1]));
        // Tagged as the client's packets came.
        let tagged = refresh_frame(&Client { vlan: 100, ..c }, OWNER, OURS).unwrap();
        assert_eq!(&tagged[12..16], &[0x81, 0x00, 0, 100]);
        // IPv6: an overriding advertisement with the owner's MAC, to the
        // client's MAC only.
        let c6 = Client {
            ip: "fd00::100".parse().unwrap(),
            client_ip: "fd00::1".parse().unwrap(),
            ..c
        };
        let f = refresh_frame(&c6, OWNER, OURS).unwrap();
        assert_eq!(&f[0..6], &c6.mac);
        assert_eq!(&f[6..12], &OURS);
        let guard_common::Parsed::Nd(nd) = guard_common::parse(&f[..], 0x86dd) else {
            panic!("not NDP")
        };
        assert!(nd.is_advert());
        assert_eq!(
            nd.target,
            c6.ip
                .to_string()
                .parse::<std::net::Ipv6Addr>()
                .unwrap()
                .octets()
        );
        assert!(
            f.windows(6).any(|w| w == OWNER),
            "the option carries the owner's MAC"
        );
        // Mixed families: nothing.
        assert_eq!(
            refresh_frame(
                &Client {
                    client_ip: c6.client_ip,
                    ..c
                },
                OWNER,
                OURS
            ),
            None
        );
    }

    #[test]
    fn refreshes_are_safe_and_rate_limited() {
        let local = BTreeSet::from([OURS]);
        let certain = |mac| OwnerMac::Certain {
            mac,
            evidence: Evidence::Census,
        };
        let facts = |state, blind, owner| RefreshFacts {
            state,
            blind,
            owner,
            local: &local,
        };
        let mut r = Refresher::new(2);
        let c = client();
        let f = facts(Ownership::Foreign, false, certain(OWNER));
        assert_eq!(r.decide(&c, &f, S), Ok(OWNER));
        assert_eq!(r.decide(&c, &f, 2 * S), Ok(OWNER));
        assert_eq!(r.decide(&c, &f, 3 * S), Err(Skip::RateLimited));
        // A minute after the first, one more.
        assert_eq!(r.decide(&c, &f, 61 * S), Ok(OWNER));
        // Never unknown, owned, blind, uncertain, or with our own MAC.
        for (state, blind, owner, want) in [
            (Ownership::Unknown, false, certain(OWNER), Skip::NotForeign),
            (Ownership::Owned, false, certain(OWNER), Skip::NotForeign),
            (Ownership::Foreign, true, certain(OWNER), Skip::Blind),
            (
                Ownership::Foreign,
                false,
                OwnerMac::Uncertain("x"),
                Skip::OwnerUncertain("x"),
            ),
            (Ownership::Foreign, false, certain(OURS), Skip::OwnMac),
        ] {
            let mut r = Refresher::new(10);
            assert_eq!(r.decide(&c, &facts(state, blind, owner), S), Err(want));
            assert_eq!(r.tracked(), 0, "a skip is not counted against the client");
        }
        // Pruned once quiet for a minute.
        r.prune(200 * S);
        assert_eq!(r.tracked(), 0);
    }
}
