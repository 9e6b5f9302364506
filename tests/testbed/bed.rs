//! The standard two-namespace bed of the integration tests: a node running
//! the guard on its uplink `eth0`, and a neighbour (`peer`) on the segment.
//!
//! ```text
//!  [peer ns] eth0 198.51.100.1/24  <-- veth -->  eth0 198.51.100.11/24 [node ns]
//!                                                 + .104 .105 .106 (LB IPs on the uplink)
//!                                                kube-ipvs0 (veth stand-in, NOARP, down)
//!                                                 .101 .102 .103 (LB IPs, as kube-proxy puts them)
//! ```
//! The node keeps arp_ignore=0 / arp_announce=0, the defaults that cause the
//! incident, so its kernel answers ARP for every LB IP. The segment is built
//! once ([`Bed::with_plan`]); what differs between the IPv4 bed and the IPv6
//! one ([`crate::bed6`]) is only the address [`Plan`].

use std::{
    net::{IpAddr, Ipv4Addr},
    path::{Path, PathBuf},
};

use anyhow::{Context as _, Result};
use serde_json::Value;

use crate::{
    daemon::Daemon,
    guard_binary,
    netns::{kube_ipvs0, veth},
    Netns,
};

pub const NODE: &str = "node-a";
pub const OTHER: &str = "node-b";
pub const NODE_IP: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 11);
pub const PEER_IP: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 1);
/// On kube-ipvs0; owned by this node.
pub const OWNED: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 101);
/// On kube-ipvs0; owned by another node.
pub const FOREIGN: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 102);
/// On kube-ipvs0; no owner known.
pub const UNKNOWN: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 103);
/// On the uplink itself; no owner known (the arp_ignore=1 exception).
pub const UNKNOWN_ON_EGRESS: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 104);
/// On the uplink itself; owned by another node.
pub const FOREIGN_ON_EGRESS: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 105);
/// On the uplink itself; owned by this node.
pub const OWNED_ON_EGRESS: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 106);

/// The ownership file every node of the bed reads.
pub fn default_owners() -> String {
    format!(
        "# test bed ownership\nips:\n  - ip: {OWNED}\n    owner: {NODE}\n  - ip: {FOREIGN}\n    owner: {OTHER}\n  - ip: {UNKNOWN}\n  \
         - ip: {UNKNOWN_ON_EGRESS}\n    owner: null\n  - ip: {FOREIGN_ON_EGRESS}\n    owner: {OTHER}\n  - ip: {OWNED_ON_EGRESS}\n    owner: {NODE}\n"
    )
}

/// A directory removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> Result<Self> {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let p =
            std::env::temp_dir().join(format!("arp-guard-test-{}-{n}-{tag}", std::process::id()));
        std::fs::create_dir_all(&p)?;
        Ok(TempDir(p))
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The addresses a bed gives its two namespaces: one [`Bed`] segment, two
/// address plans (IPv4 here, IPv6 in [`crate::bed6`]). A plan in IPv6 keeps
/// IPv6 on and adds its addresses without duplicate address detection; a
/// plan in IPv4 turns IPv6 off (no chatter on the segment: the tests read
/// every frame).
pub struct Plan {
    /// The node's primary address on eth0, and the peer's, with their prefix length.
    pub node: (IpAddr, u8),
    pub peer: (IpAddr, u8),
    /// LB IPs on the uplink itself (host routes on the node's eth0).
    pub on_uplink: Vec<IpAddr>,
    /// LB IPs on kube-ipvs0, as kube-proxy puts them.
    pub on_kube_ipvs0: Vec<IpAddr>,
    /// The ownership file the node's daemon reads.
    pub owners: String,
}

impl Plan {
    /// The IPv4 plan of the picture above.
    pub fn ipv4() -> Plan {
        Plan {
            node: (NODE_IP.into(), 24),
            peer: (PEER_IP.into(), 24),
            on_uplink: [UNKNOWN_ON_EGRESS, FOREIGN_ON_EGRESS, OWNED_ON_EGRESS]
                .map(IpAddr::from)
                .to_vec(),
            on_kube_ipvs0: [OWNED, FOREIGN, UNKNOWN].map(IpAddr::from).to_vec(),
            owners: default_owners(),
        }
    }
}

/// `ip addr add ip/len dev dev` in `ns` (IPv6 without duplicate address detection).
fn add_addr(ns: &Netns, ip: IpAddr, len: u8, dev: &str) -> Result<()> {
    let addr = format!("{ip}/{len}");
    match ip {
        IpAddr::V4(_) => ns.ip(&["addr", "add", &addr, "dev", dev]),
        IpAddr::V6(_) => ns.ip(&["-6", "addr", "add", &addr, "dev", dev, "nodad"]),
    }
    .map(|_| ())
}

pub struct Bed {
    // Field order matters for drop: namespaces go after nothing uses them.
    pub dir: TempDir,
    pub owners: PathBuf,
    pub node_mac: [u8; 6],
    pub peer_mac: [u8; 6],
    pub node: Netns,
    pub peer: Netns,
}

impl Bed {
    /// The IPv4 bed ([`Plan::ipv4`]).
    pub fn new(tag: &str) -> Result<Self> {
        Self::with_plan(tag, &Plan::ipv4())
    }

    /// The segment: node and peer joined by a veth pair (eth0 both sides),
    /// kube-ipvs0 on the node, the addresses and ownership file of `plan`.
    pub fn with_plan(tag: &str, plan: &Plan) -> Result<Self> {
        let node = Netns::new(&format!("{tag}-n"))?;
        let peer = Netns::new(&format!("{tag}-p"))?;
        veth(&node, "eth0", &peer, "eth0")?;
        add_addr(&node, plan.node.0, plan.node.1, "eth0")?;
        add_addr(&peer, plan.peer.0, plan.peer.1, "eth0")?;
        let host = |ip: &IpAddr| if ip.is_ipv4() { 32 } else { 128 };
        for ip in &plan.on_uplink {
            add_addr(&node, *ip, host(ip), "eth0")?;
        }
        kube_ipvs0(&node, &[])?;
        for ip in &plan.on_kube_ipvs0 {
            add_addr(&node, *ip, host(ip), "kube-ipvs0")?;
        }
        if plan.node.0.is_ipv4() {
            for ns in [&node, &peer] {
                // No IPv6 chatter on the segment: the tests read every frame.
                ns.sysctl("net.ipv6.conf.all.disable_ipv6", "1")?;
            }
        }
        let dir = TempDir::new(tag)?;
        let owners = dir.path().join("owners.yaml");
        std::fs::write(&owners, &plan.owners)?;
        let node_mac = node.mac("eth0")?;
        let peer_mac = peer.mac("eth0")?;
        Ok(Bed {
            dir,
            owners,
            node_mac,
            peer_mac,
            node,
            peer,
        })
    }

    /// The ownership file becomes `yaml`, replaced whole and atomically
    /// ([`crate::replace_file`]).
    pub fn replace_owners(&self, yaml: &str) -> Result<()> {
        Ok(crate::replace_file(&self.owners, yaml)?)
    }

    /// The usual daemon's arguments: guard eth0, ownership file, LB IPs
    /// from kube-ipvs0, then `extra`.
    pub fn args(&self, extra: &[&str]) -> Vec<String> {
        self.args_guarding("eth0", extra)
    }

    /// The same guarding `uplinks` (`--interface`: `auto`, names, globs).
    pub fn args_guarding(&self, uplinks: &str, extra: &[&str]) -> Vec<String> {
        let owners = self.owners.to_string_lossy().into_owned();
        let mut args: Vec<String> = [
            "-i",
            uplinks,
            "--node-name",
            NODE,
            "--ownership-file",
            &owners,
            "--lb-ips-from",
            "kube-ipvs0",
            "--file-poll",
            "200ms",
        ]
        .map(str::to_owned)
        .to_vec();
        args.extend(extra.iter().map(|s| s.to_string()));
        args
    }

    /// The usual daemon (see [`Bed::args`]).
    pub fn start(&self, extra: &[&str]) -> Result<Daemon> {
        self.start_by(extra, Daemon::start)
    }

    /// The usual daemon run through `wrapper` (with the DaemonSet's
    /// capabilities: [`crate::deploy::daemonset_wrapper`]).
    pub fn start_wrapped(&self, wrapper: &[String], extra: &[&str]) -> Result<Daemon> {
        self.start_by(extra, |ns, args| Daemon::start_wrapped(ns, wrapper, args))
    }

    /// The daemon on the node with [`Bed::args`], started by `start`.
    fn start_by(
        &self,
        extra: &[&str],
        start: impl FnOnce(&Netns, &[&str]) -> Result<Daemon>,
    ) -> Result<Daemon> {
        let args = self.args(extra);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        start(&self.node, &args)
    }

    /// `arp-guard counters -i eth0 -o json` inside the node namespace.
    pub fn counters(&self) -> Result<Value> {
        crate::daemon::counters_json(&self.node, &guard_binary(), "eth0")
    }

    /// Packets counted for (LB IP, kind, origin, verdict), from `arp-guard counters`.
    pub fn packets(
        &self,
        ip: impl Into<IpAddr>,
        kind: &str,
        origin: &str,
        verdict: &str,
    ) -> Result<u64> {
        let ip = ip.into();
        let c = self.counters()?;
        Ok(c["counters"]
            .as_array()
            .context("counters array")?
            .iter()
            .filter(|r| {
                r["lb_ip"] == ip.to_string()
                    && (ip.is_ipv4() || r["family"] == "ipv6")
                    && r["kind"] == kind
                    && r["origin"] == origin
                    && r["verdict"] == verdict
            })
            .map(|r| r["packets"].as_u64().unwrap_or(0))
            .sum())
    }

    /// The peer asks for `ips` afresh (its cache flushed); what it learned
    /// for the first one within 3 s, and for the rest 300 ms after that.
    pub fn peer_learns(&self, ips: &[Ipv4Addr]) -> Result<Vec<Option<[u8; 6]>>> {
        self.peer.flush_neigh("eth0")?;
        for ip in ips {
            self.peer.poke(&ip.to_string())?;
        }
        let Some((first, rest)) = ips.split_first() else {
            return Ok(Vec::new());
        };
        let first = first.to_string();
        let mut out = vec![crate::wait_for(std::time::Duration::from_secs(3), || {
            self.peer.cached_mac("eth0", &first).ok().flatten()
        })];
        std::thread::sleep(std::time::Duration::from_millis(300));
        for ip in rest {
            out.push(self.peer.cached_mac("eth0", &ip.to_string())?);
        }
        Ok(out)
    }

    /// The peer's cache flushed, it asks for `ip`: the MAC it learned
    /// within 3 s, if any.
    pub fn resolve(&self, ip: &str) -> Option<[u8; 6]> {
        self.peer.flush_neigh("eth0").ok()?;
        self.peer.poke(ip).ok()?;
        crate::wait_for(std::time::Duration::from_secs(3), || {
            self.peer.cached_mac("eth0", ip).ok().flatten()
        })
    }

    /// Whether a guard program is attached to the node's eth0, asked of the
    /// kernel (TCX query, else arp-guard's netlink filter), not of an API or
    /// of pins.
    pub fn guard_attached(&self) -> bool {
        let bin = guard_binary();
        let mut cmd = vec![bin.to_str().unwrap_or_default(), "counters", "-i", "eth0"];
        cmd.extend(["--api", "127.0.0.1:1", "--pin-dir", "/nonexistent"]);
        self.node.exec(&cmd).is_ok()
    }

    pub fn total(&self, name: &str) -> Result<u64> {
        self.counters()?["totals"][name]
            .as_u64()
            .with_context(|| format!("no total {name}"))
    }
}

/// A private bpffs mounted in a temporary directory (the tests' pins never
/// touch /sys/fs/bpf); unmounted on drop, which releases every pin in it.
pub struct Bpffs {
    dir: TempDir,
}

impl Bpffs {
    pub fn new(tag: &str) -> Result<Self> {
        let dir = TempDir::new(tag)?;
        let out = std::process::Command::new("mount")
            .args(["-t", "bpf", "bpf"])
            .arg(dir.path())
            .output()?;
        anyhow::ensure!(
            out.status.success(),
            "mount -t bpf: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(Bpffs { dir })
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Lazily unmount it in the mount namespace of process `pid` (a daemon
    /// under `ip netns exec` has its own, where the root's unmount does not
    /// reach). The root namespace's mount goes on drop.
    pub fn unmount_for(&self, pid: u32) -> Result<()> {
        let out = std::process::Command::new("nsenter")
            .args(["-t", &pid.to_string(), "-m", "umount", "-l"])
            .arg(self.dir.path())
            .output()?;
        anyhow::ensure!(
            out.status.success(),
            "umount: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(())
    }
}

impl Drop for Bpffs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .output();
    }
}
