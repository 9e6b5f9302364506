//! The IPv6 bed of the Neighbor Discovery tests: the two-namespace layout of
//! [`crate::bed`] with IPv6 on (fd00:1::/64), the LB IPs as IPv6 addresses.
//!
//! ```text
//!  [peer ns] eth0 fd00:1::1/64  <-- veth -->  eth0 fd00:1::11/64 [node ns]
//!                                              + ::104 ::105 (LB IPs on the uplink)
//!                                             kube-ipvs0 (down): ::101 ::102 ::103
//! ```

use std::{net::Ipv6Addr, time::Duration};

use anyhow::{Context as _, Result};
use guard_common::{ndp_build::NdSpec, parse, Parsed};

use crate::{
    bed::{TempDir, NODE, OTHER},
    daemon::Daemon,
    deploy::daemonset_wrapper,
    frames::nd_bytes,
    guard_binary,
    netns::{kube_ipvs0, veth},
    Netns, RawSocket,
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

pub struct Bed6 {
    pub dir: TempDir,
    pub owners: std::path::PathBuf,
    pub node_mac: [u8; 6],
    pub peer_mac: [u8; 6],
    pub node: Netns,
    pub peer: Netns,
}

impl Bed6 {
    pub fn new(tag: &str) -> Result<Self> {
        let node = Netns::new(&format!("{tag}-n"))?;
        let peer = Netns::new(&format!("{tag}-p"))?;
        veth(&node, "eth0", &peer, "eth0")?;
        let add = |ns: &Netns, ip: Ipv6Addr, len: u8, dev: &str| {
            ns.ip(&[
                "-6",
                "addr",
                "add",
                &format!("{ip}/{len}"),
                "dev",
                dev,
                "nodad",
            ])
        };
        add(&node, NODE6, 64, "eth0")?;
        add(&peer, PEER6, 64, "eth0")?;
        for ip in [UNKNOWN6_ON_EGRESS, FOREIGN6_ON_EGRESS] {
            add(&node, ip, 128, "eth0")?;
        }
        kube_ipvs0(&node, &[])?;
        for ip in [OWNED6, FOREIGN6, UNKNOWN6] {
            add(&node, ip, 128, "kube-ipvs0")?;
        }
        let dir = TempDir::new(tag)?;
        let owners = dir.path().join("owners.yaml");
        std::fs::write(
            &owners,
            format!(
                "ips:\n  - ip: {OWNED6}\n    owner: {NODE}\n  - ip: {FOREIGN6}\n    owner: {OTHER}\n  - ip: {UNKNOWN6}\n  \
                 - ip: {UNKNOWN6_ON_EGRESS}\n  - ip: {FOREIGN6_ON_EGRESS}\n    owner: {OTHER}\n"
            ),
        )?;
        Ok(Bed6 {
            node_mac: node.mac("eth0")?,
            peer_mac: peer.mac("eth0")?,
            dir,
            owners,
            node,
            peer,
        })
    }

    /// The daemon on eth0 with the DaemonSet's capabilities, then `extra`.
    pub fn start(&self, extra: &[&str]) -> Result<Daemon> {
        let owners = self.owners.to_string_lossy().into_owned();
        let mut args = vec![
            "-i",
            "eth0",
            "--node-name",
            NODE,
            "--ownership-file",
            &owners,
            "--lb-ips-from",
            "kube-ipvs0",
            "--file-poll",
            "200ms",
        ];
        args.extend_from_slice(extra);
        Daemon::start_wrapped(&self.node, &daemonset_wrapper(), &args)
    }

    /// Packets counted for (LB IP, kind, origin, verdict), from `arp-guard counters`.
    pub fn packets(&self, ip: Ipv6Addr, kind: &str, origin: &str, verdict: &str) -> Result<u64> {
        let c = crate::daemon::counters_json(&self.node, &guard_binary(), "eth0")?;
        let rows = c["counters"].as_array().context("counters array")?;
        Ok(rows
            .iter()
            .filter(|r| {
                r["lb_ip"] == ip.to_string()
                    && r["family"] == "ipv6"
                    && r["kind"] == kind
                    && r["origin"] == origin
                    && r["verdict"] == verdict
            })
            .map(|r| r["packets"].as_u64().unwrap_or(0))
            .sum())
    }

    pub fn total(&self, name: &str) -> Result<u64> {
        let c = crate::daemon::counters_json(&self.node, &guard_binary(), "eth0")?;
        c["totals"][name]
            .as_u64()
            .with_context(|| format!("no total {name}"))
    }

    /// Give the peer an entry for `ip` at `mac` (state STALE, as after an
    /// earlier exchange), so that an override advertisement can change it.
    pub fn peer_knows(&self, ip: Ipv6Addr, mac: [u8; 6]) -> Result<()> {
        let mac = crate::netns::fmt_mac(&mac);
        let ip = ip.to_string();
        self.peer.ip(&[
            "-6", "neigh", "replace", &ip, "lladdr", &mac, "dev", "eth0", "nud", "stale",
        ])?;
        Ok(())
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
