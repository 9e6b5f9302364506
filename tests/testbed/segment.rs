//! An L2 segment for `arp-guard probe`: a client and N nodes on one bridge
//! (in a namespace of its own, the switch), each node with LB IPs on a
//! kube-ipvs0 stand-in and arp_ignore=0, so every node holding an IP answers
//! ARP for it. IPv6 is off unless asked for ([`Segment::with_ipv6`]): then
//! every host has an address in fd00:2::/64 and the nodes hold their IPv6
//! LB IPs on eth0 itself (as kube-vip does; the kernel answers Neighbor
//! Solicitations only for addresses on the receiving interface), without
//! duplicate address detection, so that two nodes can hold one (a split
//! brain). Optional: a TCP listener on a node, SYNs dropped on a node
//! (externalTrafficPolicy: Local without an endpoint), the guard on every
//! node with an ownership file.
//!
//! ```text
//!  client 203.0.113.1 fd00:2::1 -+- node1 203.0.113.11 fd00:2::11
//!                                +- node2 203.0.113.12 fd00:2::12   ...
//! ```
//! No link to the root namespace, no default route; everything is removed on
//! drop, also when a test fails (daemons and listeners first).

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::Duration,
};

use anyhow::{Context as _, Result};

use crate::{
    bed::TempDir,
    netns::{kube_ipvs0, veth},
    Daemon, Netns,
};

pub const CLIENT_IP: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 1);
pub const CLIENT_IP6: Ipv6Addr = Ipv6Addr::new(0xfd00, 2, 0, 0, 0, 0, 0, 1);

/// IPv6 on, without duplicate address detection (set before the links
/// come up, so that their link-local addresses are usable at once).
fn ipv6_on(ns: &Netns) -> Result<()> {
    for conf in ["all", "default"] {
        ns.sysctl(&format!("net.ipv6.conf.{conf}.disable_ipv6"), "0")?;
        ns.sysctl(&format!("net.ipv6.conf.{conf}.accept_dad"), "0")?;
    }
    Ok(())
}

fn add6(ns: &Netns, ip: Ipv6Addr, len: u8) -> Result<()> {
    let ip = format!("{ip}/{len}");
    ns.ip(&["-6", "addr", "add", &ip, "dev", "eth0", "nodad"])
        .map(|_| ())
}

pub struct Node {
    pub name: String,
    pub ip: Ipv4Addr,
    pub mac: [u8; 6],
    pub ns: Netns,
}

pub struct Segment {
    // Drop order (top to bottom): guards and listeners before namespaces.
    pub guards: Vec<Daemon>,
    stop_listeners: Arc<AtomicBool>,
    pub dir: TempDir,
    pub nodes: Vec<Node>,
    pub client: Netns,
    _switch: Netns,
}

impl Drop for Segment {
    fn drop(&mut self) {
        self.stop_listeners.store(true, Ordering::SeqCst);
        self.guards.clear();
    }
}

impl Segment {
    /// A client and `lb_ips.len()` nodes; node i (from 1) carries
    /// `lb_ips[i - 1]` on its kube-ipvs0.
    pub fn new(tag: &str, lb_ips: &[&[Ipv4Addr]]) -> Result<Self> {
        Self::build(tag, lb_ips, None)
    }

    /// The same with IPv6 on: node i (from 1) also holds `lb_ips6[i - 1]`
    /// on its eth0 (a node past `lb_ips` carries no IPv4 LB IP).
    pub fn with_ipv6(tag: &str, lb_ips: &[&[Ipv4Addr]], lb_ips6: &[&[Ipv6Addr]]) -> Result<Self> {
        Self::build(tag, lb_ips, Some(lb_ips6))
    }

    fn build(tag: &str, lb_ips: &[&[Ipv4Addr]], lb_ips6: Option<&[&[Ipv6Addr]]>) -> Result<Self> {
        let switch = Netns::new(&format!("{tag}-sw"))?;
        switch.ip(&["link", "add", "br0", "type", "bridge"])?;
        // Multicast (the solicitations) reaches every port, MLD or not.
        switch.ip(&[
            "link",
            "set",
            "br0",
            "type",
            "bridge",
            "mcast_snooping",
            "0",
        ])?;
        switch.ip(&["link", "set", "br0", "up"])?;
        let client = Netns::new(&format!("{tag}-c"))?;
        let v6 = lb_ips6.is_some();
        if v6 {
            ipv6_on(&client)?;
        }
        veth(&client, "eth0", &switch, "port0")?;
        switch.ip(&["link", "set", "port0", "master", "br0"])?;
        client.ip(&["addr", "add", &format!("{CLIENT_IP}/24"), "dev", "eth0"])?;
        let six = lb_ips6.unwrap_or_default();
        if v6 {
            add6(&client, CLIENT_IP6, 64)?;
        }
        let mut nodes = Vec::new();
        for i in 0..lb_ips.len().max(six.len()) {
            let name = format!("node{}", i + 1);
            let ns = Netns::new(&format!("{tag}-{}", i + 1))?;
            if v6 {
                ipv6_on(&ns)?;
            }
            let port = format!("port{}", i + 1);
            veth(&ns, "eth0", &switch, &port)?;
            switch.ip(&["link", "set", &port, "master", "br0"])?;
            let ip = Ipv4Addr::new(203, 0, 113, 11 + i as u8);
            ns.ip(&["addr", "add", &format!("{ip}/24"), "dev", "eth0"])?;
            kube_ipvs0(&ns, lb_ips.get(i).copied().unwrap_or_default())?;
            if v6 {
                add6(
                    &ns,
                    Ipv6Addr::new(0xfd00, 2, 0, 0, 0, 0, 0, 0x11 + i as u16),
                    64,
                )?;
                for ip in six.get(i).copied().unwrap_or_default() {
                    add6(&ns, *ip, 128)?;
                }
            }
            ns.sysctl("net.ipv4.conf.all.arp_ignore", "0")?;
            ns.sysctl("net.ipv4.conf.all.arp_announce", "0")?;
            let mac = ns.mac("eth0")?;
            nodes.push(Node { name, ip, mac, ns });
        }
        let quiet: Vec<&Netns> = if v6 {
            vec![&switch]
        } else {
            nodes
                .iter()
                .map(|n| &n.ns)
                .chain([&client, &switch])
                .collect()
        };
        for ns in quiet {
            // No IPv6 chatter on the segment (the bridge takes no part).
            ns.sysctl("net.ipv6.conf.all.disable_ipv6", "1")?;
        }
        Ok(Segment {
            guards: Vec::new(),
            stop_listeners: Arc::new(AtomicBool::new(false)),
            dir: TempDir::new(tag)?,
            nodes,
            client,
            _switch: switch,
        })
    }

    /// The node whose eth0 has `mac`.
    pub fn node_of(&self, mac: &str) -> Option<&str> {
        let mac = crate::netns::parse_mac(mac).ok()?;
        self.nodes
            .iter()
            .find(|n| n.mac == mac)
            .map(|n| n.name.as_str())
    }

    /// Accept (and close) TCP connections on `ip:port` on node `i` (from 0).
    pub fn listen(&self, i: usize, ip: impl Into<IpAddr>, port: u16) -> Result<()> {
        let addr = SocketAddr::from((ip.into(), port));
        let listener = self.nodes[i]
            .ns
            .enter(move || Ok(TcpListener::bind(addr)?))?;
        listener.set_nonblocking(true)?;
        let stop = self.stop_listeners.clone();
        std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                if listener.accept().is_err() {
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
        });
        Ok(())
    }

    /// Node `i` silently drops SYNs to `ip:port`: externalTrafficPolicy
    /// Local on a node without an endpoint.
    pub fn drop_syns(&self, i: usize, ip: Ipv4Addr, port: u16) -> Result<()> {
        let ns = &self.nodes[i].ns;
        ns.exec(&["nft", "add table inet probe"])?;
        ns.exec(&[
            "nft",
            "add chain inet probe input { type filter hook input priority 0 ; }",
        ])?;
        ns.exec(&[
            "nft",
            &format!("add rule inet probe input ip daddr {ip} tcp dport {port} drop"),
        ])?;
        Ok(())
    }

    /// Start the guard on every node's eth0 with an ownership file saying
    /// `owners` (LB IP, node name), LB IPs from kube-ipvs0.
    pub fn guard(&mut self, owners: &[(IpAddr, &str)]) -> Result<()> {
        let path = self.dir.path().join("owners.yaml");
        let mut file = String::from("ips:\n");
        for (ip, owner) in owners {
            file.push_str(&format!("  - ip: {ip}\n    owner: {owner}\n"));
        }
        std::fs::write(&path, file)?;
        let path = path.to_string_lossy().into_owned();
        for n in &self.nodes {
            let d = Daemon::start(
                &n.ns,
                &[
                    "-i",
                    "eth0",
                    "--node-name",
                    &n.name,
                    "--ownership-file",
                    &path,
                    "--lb-ips-from",
                    "kube-ipvs0",
                ],
            )
            .with_context(|| format!("starting arp-guard on {}", n.name))?;
            self.guards.push(d);
        }
        Ok(())
    }
}
