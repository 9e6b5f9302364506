//! A bonded uplink (bond0 over eth0 and eth1, the node's address on bond0):
//! where to put the guard. On the bond, every frame the node sends passes
//! its egress exactly once, whichever slave carries it, before and after a
//! failover, and the bond's addresses are the egress interface's. On a
//! slave, only that slave's frames are seen: after a failover to the other
//! slave the kernel's replies leave unguarded. Active-backup and 802.3ad
//! (with an LACP partner bond on the neighbour). Needs bonding: runs in
//! `cargo xtask vm-test`.

use std::{net::Ipv4Addr, time::Duration};

use testbed::{
    bed::{default_owners, TempDir, FOREIGN, NODE, NODE_IP, OWNED, PEER_IP, UNKNOWN},
    kernel,
    netns::kube_ipvs0,
    wait_until, ArpSpec, Daemon, Netns, RawSocket,
};

struct BondBed {
    _dir: TempDir,
    owners: String,
    node_mac: [u8; 6],
    peer_mac: [u8; 6],
    node: Netns,
    peer: Netns,
    /// The neighbour's interface: a bridge over both links (active-backup)
    /// or its own 802.3ad bond.
    peer_if: &'static str,
}

fn bond_bed(tag: &str, mode: &str) -> BondBed {
    let node = Netns::new(&format!("{tag}-n")).unwrap();
    let peer = Netns::new(&format!("{tag}-p")).unwrap();
    let mut opts = vec!["mode", mode, "miimon", "100"];
    if mode == "802.3ad" {
        opts.extend(["lacp_rate", "fast"]);
    }
    let mut add = vec!["link", "add", "bond0", "type", "bond"];
    add.extend(&opts);
    node.ip(&add).unwrap();
    let peer_if = if mode == "802.3ad" {
        peer.ip(&add).unwrap();
        "bond0"
    } else {
        peer.ip(&["link", "add", "br0", "type", "bridge"]).unwrap();
        "br0"
    };
    for (n, p) in [("eth0", "p0"), ("eth1", "p1")] {
        node.ip(&[
            "link", "add", n, "type", "veth", "peer", "name", p, "netns", &peer.name,
        ])
        .unwrap();
        node.ip(&["link", "set", n, "master", "bond0"]).unwrap();
        peer.ip(&["link", "set", p, "master", peer_if]).unwrap();
        node.ip(&["link", "set", n, "up"]).unwrap();
        peer.ip(&["link", "set", p, "up"]).unwrap();
    }
    node.ip(&["link", "set", "bond0", "up"]).unwrap();
    peer.ip(&["link", "set", peer_if, "up"]).unwrap();
    node.ip(&["addr", "add", &format!("{NODE_IP}/24"), "dev", "bond0"])
        .unwrap();
    peer.ip(&["addr", "add", &format!("{PEER_IP}/24"), "dev", peer_if])
        .unwrap();
    kube_ipvs0(&node, &[OWNED, FOREIGN, UNKNOWN]).unwrap();
    for ns in [&node, &peer] {
        ns.sysctl("net.ipv6.conf.all.disable_ipv6", "1").unwrap();
    }
    let dir = TempDir::new(tag).unwrap();
    let owners = dir.path().join("owners.yaml");
    std::fs::write(&owners, default_owners()).unwrap();
    let bed = BondBed {
        owners: owners.to_string_lossy().into_owned(),
        _dir: dir,
        node_mac: node.mac("bond0").unwrap(),
        peer_mac: peer.mac(peer_if).unwrap(),
        node,
        peer,
        peer_if,
    };
    // The bond is up (802.3ad: LACP has agreed) when the peer reaches the node.
    assert!(
        wait_until(Duration::from_secs(30), || {
            bed.peer.flush_neigh(peer_if).unwrap();
            bed.peer.poke(&NODE_IP.to_string()).unwrap();
            std::thread::sleep(Duration::from_millis(300));
            bed.peer
                .cached_mac(peer_if, &NODE_IP.to_string())
                .unwrap()
                .is_some()
        }),
        "the {mode} bond carries traffic"
    );
    bed
}

impl BondBed {
    fn guard(&self, iface: &str) -> Daemon {
        #[rustfmt::skip]
        let args = [
            "-i", iface, "--node-name", NODE, "--ownership-file", &self.owners,
            "--lb-ips-from", "kube-ipvs0", "--file-poll", "200ms",
        ];
        Daemon::start(&self.node, &args).unwrap()
    }

    /// One ARP request from the neighbour for each IP; who answered.
    fn answers(&self, ips: &[Ipv4Addr]) -> Vec<bool> {
        let sock = RawSocket::open(&self.peer, self.peer_if).unwrap();
        ips.iter()
            .map(|ip| {
                sock.drain();
                let req = ArpSpec::request(self.peer_mac, PEER_IP, *ip);
                sock.send(&req.to_bytes()).unwrap();
                sock.wait_arp(Duration::from_secs(2), |c| {
                    c.op == 2 && c.spa == *ip && c.sha == self.node_mac
                })
                .unwrap()
                .is_some()
            })
            .collect()
    }

    fn dropped(&self, iface: &str, ip: Ipv4Addr) -> u64 {
        testbed::daemon::dropped(&self.node, iface, ip).unwrap()
    }

    /// Fail the active slave over to the other one.
    fn fail_over(&self) {
        let active = self
            .node
            .exec(&["cat", "/sys/class/net/bond0/bonding/active_slave"])
            .unwrap();
        let active = active.trim().to_owned();
        self.node.ip(&["link", "set", &active, "down"]).unwrap();
        assert!(wait_until(Duration::from_secs(5), || {
            let now = self
                .node
                .exec(&["cat", "/sys/class/net/bond0/bonding/active_slave"])
                .unwrap();
            !now.trim().is_empty() && now.trim() != active
        }));
    }
}

fn require_bonding() -> bool {
    testbed::require_root();
    kernel::require("bonding", kernel::has_link_kind("bond"))
}

#[test]
fn active_backup_guard_on_the_bond_sees_each_frame_once_across_failover() {
    if !require_bonding() {
        return;
    }
    let bed = bond_bed("bond-ab", "active-backup");
    let _guard = bed.guard("bond0");
    for round in ["before failover", "after failover"] {
        let before = bed.dropped("bond0", FOREIGN);
        assert_eq!(
            bed.answers(&[OWNED, FOREIGN, UNKNOWN]),
            vec![true, false, false],
            "{round}: only the owned LB IP is answered"
        );
        assert_eq!(
            bed.dropped("bond0", FOREIGN) - before,
            1,
            "{round}: one request, one reply, counted once on the bond"
        );
        if round == "before failover" {
            bed.fail_over();
        }
    }
}

#[test]
fn active_backup_guard_on_a_slave_misses_the_other_slave() {
    if !require_bonding() {
        return;
    }
    let bed = bond_bed("bond-sl", "active-backup");
    let active = bed
        .node
        .exec(&["cat", "/sys/class/net/bond0/bonding/active_slave"])
        .unwrap();
    let _guard = bed.guard(active.trim());
    assert_eq!(
        bed.answers(&[OWNED, FOREIGN]),
        vec![true, false],
        "on the active slave the guard stops the foreign reply"
    );
    bed.fail_over();
    assert_eq!(
        bed.answers(&[OWNED, FOREIGN]),
        vec![true, true],
        "after a failover the other slave carries the reply past the guard"
    );
}

#[test]
fn lacp_guard_on_the_bond_stops_foreign_replies_on_every_slave() {
    if !require_bonding() {
        return;
    }
    let bed = bond_bed("bond-ad", "802.3ad");
    let _guard = bed.guard("bond0");
    let before = bed.dropped("bond0", FOREIGN);
    for _ in 0..4 {
        assert_eq!(
            bed.answers(&[OWNED, FOREIGN, UNKNOWN]),
            vec![true, false, false]
        );
    }
    assert_eq!(bed.dropped("bond0", FOREIGN) - before, 4);
}

/// Both slaves of the bond lose carrier (issue 45): the bond has none, and
/// the guard on it, owning two LB IPs (the default ownership file), says
/// so at once (the status line, the gauge the ArpGuardOwnerLinkDown alert
/// reads); carrier back on one slave, it is clear again. The guard still passes everything the owner
/// sends (nothing to send on a dead link; the verdicts do not change).
#[test]
fn a_bond_whose_slaves_all_lose_carrier_is_an_owner_link_down() {
    if !require_bonding() {
        return;
    }
    let bed = bond_bed("bond-lc", "active-backup");
    let guard = bed.guard("bond0");
    let gauge = "arp_guard_owned_ips_without_carrier";
    assert_eq!(testbed::counter(&bed.node, gauge), 0.0);
    for slave in ["eth0", "eth1"] {
        bed.node.ip(&["link", "set", slave, "down"]).unwrap();
    }
    let down = wait_until(Duration::from_secs(5), || {
        testbed::counter(&bed.node, gauge) == 2.0
    });
    let bin = testbed::guard_binary();
    let out = bed
        .node
        .exec_output(&[bin.to_str().unwrap(), "status"])
        .unwrap();
    let status = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(down, "{status}\n{}", guard.log_text());
    assert!(
        status.contains("OWNER LINK DOWN") && status.contains("NO CARRIER"),
        "{status}"
    );
    bed.node.ip(&["link", "set", "eth0", "up"]).unwrap();
    assert!(wait_until(Duration::from_secs(10), || testbed::counter(
        &bed.node, gauge
    ) == 0.0));
    assert_eq!(bed.answers(&[OWNED]), vec![true], "the owner answers again");
}
