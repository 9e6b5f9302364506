//! The IPv6 bed of the Neighbor Discovery tests: the two-namespace segment
//! of [`crate::bed`] with another address plan, IPv6 on (fd00:1::/64), the
//! LB IPs as IPv6 addresses.
//!
//! ```text
//!  [peer ns] eth0 fd00:1::1/64  <-- veth -->  eth0 fd00:1::11/64 [node ns]
//!                                              + ::104 ::105 (LB IPs on the uplink)
//!                                             kube-ipvs0 (down): ::101 ::102 ::103
//! ```

use std::{
    net::{IpAddr, Ipv6Addr},
    time::Duration,
};

use anyhow::Result;
use guard_common::{ndp_build::NdSpec, parse, Parsed};

use crate::{
    bed::{Bed, Plan, NODE, OTHER},
    daemon::Daemon,
    deploy::daemonset_wrapper,
    frames::nd_bytes,
    RawSocket,
};

const fn v6(last: u16) -> Ipv6Addr {
    Ipv6Addr::new(0xfd00, 1, 0, 0, 0, 0, 0, last)
}
pub const PEER6: Ipv6Addr = v6(0x1);
pub const NODE6: Ipv6Addr = v6(0x11);
/// On kube-ipvs0: owned here, owned elsewhere, no owner known.
pub const OWNED6: Ipv6Addr = v6(0x101);
pub const FOREIGN6: Ipv6Addr = v6(0x102);
pub const UNKNOWN6: Ipv6Addr = v6(0x103);
/// On the uplink itself: no owner known; owned elsewhere.
pub const UNKNOWN6_ON_EGRESS: Ipv6Addr = v6(0x104);
pub const FOREIGN6_ON_EGRESS: Ipv6Addr = v6(0x105);
/// The MAC the neighbour has for an IP before a test (the real owner's).
pub const OWNER_MAC: [u8; 6] = [2, 0, 0, 0, 0, 0xbb];

/// The IPv6 plan of the picture above.
pub fn plan() -> Plan {
    Plan {
        node: (NODE6.into(), 64),
        peer: (PEER6.into(), 64),
        on_uplink: [UNKNOWN6_ON_EGRESS, FOREIGN6_ON_EGRESS]
            .map(IpAddr::from)
            .to_vec(),
        on_kube_ipvs0: [OWNED6, FOREIGN6, UNKNOWN6].map(IpAddr::from).to_vec(),
        owners: format!(
            "ips:\n  - ip: {OWNED6}\n    owner: {NODE}\n  - ip: {FOREIGN6}\n    owner: {OTHER}\n  - ip: {UNKNOWN6}\n  \
             - ip: {UNKNOWN6_ON_EGRESS}\n  - ip: {FOREIGN6_ON_EGRESS}\n    owner: {OTHER}\n"
        ),
    }
}

/// The [`Bed`] segment with the IPv6 [`plan`], whose daemon runs with the
/// DaemonSet's capabilities; what it has beyond [`Bed`] is Neighbor
/// Discovery's.
pub struct Bed6(Bed);

impl std::ops::Deref for Bed6 {
    type Target = Bed;
    fn deref(&self) -> &Bed {
        &self.0
    }
}

impl Bed6 {
    pub fn new(tag: &str) -> Result<Self> {
        Bed::with_plan(tag, &plan()).map(Bed6)
    }

    /// The daemon on eth0 with the DaemonSet's capabilities ([`Bed::args`]
    /// then `extra`).
    pub fn start(&self, extra: &[&str]) -> Result<Daemon> {
        self.start_wrapped(&daemonset_wrapper(), extra)
    }

    /// Give the peer an entry for `ip` at `mac` (state STALE, as after an
    /// earlier exchange), so that an override advertisement can change it.
    pub fn peer_knows(&self, ip: Ipv6Addr, mac: [u8; 6]) -> Result<()> {
        self.peer.set_neigh("eth0", ip, &mac, "stale")
    }

    /// The MAC the peer has for `ip` now.
    pub fn peer_entry(&self, ip: Ipv6Addr) -> Result<Option<[u8; 6]>> {
        self.peer.cached_mac("eth0", &ip.to_string())
    }

    /// A unicast solicitation from the peer for `target`, as its kernel
    /// sends one to confirm a cached entry.
    pub fn solicit_from_peer(&self, target: Ipv6Addr) -> Vec<u8> {
        let spec = NdSpec {
            dst: target.octets(),
            eth_dst: self.node_mac,
            ..NdSpec::solicit(self.peer_mac, PEER6.octets(), target.octets())
        };
        nd_bytes(&spec)
    }
}

/// The advertisements for `target` that `cap` receives within `window`.
pub fn adverts_for(cap: &RawSocket, target: Ipv6Addr, window: Duration) -> Result<Vec<Vec<u8>>> {
    Ok(cap
        .collect(window)?
        .into_iter()
        .filter(|f| is_advert_for(f, target))
        .collect())
}

/// The first advertisement for `target` within `timeout`.
pub fn wait_advert(
    cap: &RawSocket,
    target: Ipv6Addr,
    timeout: Duration,
) -> Result<Option<Vec<u8>>> {
    let deadline = std::time::Instant::now() + timeout;
    while let Some(left) = deadline.checked_duration_since(std::time::Instant::now()) {
        match cap.recv_raw(left)? {
            Some(f) if is_advert_for(&f, target) => return Ok(Some(f)),
            Some(_) => {}
            None => break,
        }
    }
    Ok(None)
}

fn is_advert_for(f: &[u8], target: Ipv6Addr) -> bool {
    f.len() > 14
        && matches!(
            parse(f, u16::from_be_bytes([f[12], f[13]])),
            Parsed::Nd(nd) if nd.is_advert() && nd.target == target.octets()
        )
}
