//! The bed of the side-by-side comparison (issue 12, part 4), shared by
//! `tests/alternatives.rs` (the coverage facts, asserted) and
//! `benches/alternatives.rs` (coverage, cost per frame, throughput).
//!
//! ```text
//!  [peer ns] eth0 198.51.100.1/24 <-- veth --> eth0 198.51.100.11/24 [node ns]
//!                                               + uplink LB IPs (/32, as kube-vip puts them)
//!                                              kube-ipvs0 (veth stand-in, NOARP, down)
//!                                               + LB IPs from 203.0.113.0/24 (as kube-proxy puts them)
//! ```
//! The node keeps arp_ignore=0 / arp_announce=0 (the defaults that cause the
//! incident), so its kernel answers ARP for every LB IP. One approach at a
//! time is put on it: nothing, arp-guard (the real daemon, the IPs foreign in
//! its ownership file), an nftables `arp` output chain with a set of the same
//! IPs, or kube-proxy's strictARP sysctls. Everything lives in the two
//! namespaces (nft tables and sysctls included) and goes with them on drop.

#![allow(dead_code)] // each of the two users needs a part

use std::{net::Ipv4Addr, time::Duration};

use anyhow::{Context as _, Result};
use testbed::{
    bed::TempDir,
    netns::{kube_ipvs0, veth},
    ArpSpec, Captured, Daemon, Netns, RawSocket,
};

#[path = "fixture_responder.rs"]
mod fixture_responder;

pub const NODE: &str = "node-a";
pub const OTHER: &str = "node-b";
pub const NODE_IP: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 11);
pub const PEER_IP: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 1);
/// The fixture responder's MAC (a Cilium-like TC ingress ARP responder).
pub const RESPONDER_MAC: [u8; 6] = [0x02, 0, 0x5e, 0, 0x53, 0xaa];
/// A speaker's MAC for the AF_PACKET frames (MetalLB/kube-vip send their own).
pub const SPEAKER_MAC: [u8; 6] = [0x02, 0, 0x5e, 0, 0x53, 0xa1];
/// How long a frame that should arrive may take.
pub const ARRIVE: Duration = Duration::from_secs(2);
/// How long we listen for a frame that must not arrive.
pub const QUIET: Duration = Duration::from_millis(300);
/// How long a probe waits for its frame (it returns as soon as the frame
/// comes; locally that is well under a millisecond).
pub const WAIT: Duration = Duration::from_millis(500);

/// What a user would pick to keep a node from answering for LB IPs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Approach {
    /// Nothing: the floor.
    Nothing,
    ArpGuard,
    /// `table arp` output chain, `arp saddr ip @lb drop`.
    Nftables,
    /// kube-proxy's strictARP: arp_ignore=1, arp_announce=2.
    StrictArp,
}

pub const APPROACHES: [Approach; 4] = [
    Approach::Nothing,
    Approach::ArpGuard,
    Approach::Nftables,
    Approach::StrictArp,
];

impl Approach {
    /// A snake_case token (the bench's RESULT lines).
    pub fn name(self) -> &'static str {
        match self {
            Approach::Nothing => "nothing",
            Approach::ArpGuard => "arp_guard",
            Approach::Nftables => "nftables",
            Approach::StrictArp => "strict_arp",
        }
    }
}

/// The address plan of one bed.
pub struct Plan {
    /// On kube-ipvs0, owned by another node (in the nft set).
    pub foreign: Vec<Ipv4Addr>,
    /// On kube-ipvs0, owned by this node (not in the nft set).
    pub owned: Vec<Ipv4Addr>,
    /// On the uplink eth0 itself, owned by another node (in the nft set).
    pub foreign_on_uplink: Vec<Ipv4Addr>,
    /// Extra foreign entries in the ownership file and the nft set only, to
    /// size the tables: never on an interface, never in a frame.
    pub table_only: u32,
}

/// The `i`-th table-only entry (10.64.0.0/10, as the datapath bench uses):
/// a key in a table, never an address of any interface or frame.
pub fn table_only_ip(i: u32) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 64, 0, 0)) + i)
}

/// `n` LB IPs for the wire: 203.0.113.1..=254, then 198.51.100.101..=200.
pub fn wire_ips(n: usize) -> Vec<Ipv4Addr> {
    let a = (1..=254u8).map(|i| Ipv4Addr::new(203, 0, 113, i));
    let b = (101..=200u8).map(|i| Ipv4Addr::new(198, 51, 100, i));
    let all: Vec<Ipv4Addr> = a.chain(b).collect();
    assert!(n <= all.len(), "at most {} LB IPs on the wire", all.len());
    all[..n].to_vec()
}

pub struct AltBed {
    // Drop order (top to bottom): the daemon before the namespaces.
    pub guard: Option<Daemon>,
    pub dir: TempDir,
    pub owners: std::path::PathBuf,
    pub nft_file: std::path::PathBuf,
    pub plan: Plan,
    pub node_mac: [u8; 6],
    pub peer_mac: [u8; 6],
    pub node: Netns,
    pub peer: Netns,
}

impl AltBed {
    pub fn new(tag: &str, plan: Plan) -> Result<Self> {
        let node = Netns::new(&format!("{tag}-n"))?;
        let peer = Netns::new(&format!("{tag}-p"))?;
        veth(&node, "eth0", &peer, "eth0")?;
        node.ip(&["addr", "add", &format!("{NODE_IP}/24"), "dev", "eth0"])?;
        peer.ip(&["addr", "add", &format!("{PEER_IP}/24"), "dev", "eth0"])?;
        for ip in &plan.foreign_on_uplink {
            node.ip(&["addr", "add", &format!("{ip}/32"), "dev", "eth0"])?;
        }
        kube_ipvs0(&node, &[])?;
        // Many addresses: one `ip -batch` instead of one process each.
        let batch: String = plan
            .foreign
            .iter()
            .chain(&plan.owned)
            .map(|ip| format!("addr add {ip}/32 dev kube-ipvs0\n"))
            .collect();
        let dir = TempDir::new(tag)?;
        let batch_file = dir.path().join("addrs.batch");
        std::fs::write(&batch_file, batch)?;
        node.ip(&["-batch", batch_file.to_str().context("path")?])?;
        for ns in [&node, &peer] {
            // No IPv6 chatter on the segment: the probes read every frame.
            ns.sysctl("net.ipv6.conf.all.disable_ipv6", "1")?;
        }
        node.sysctl("net.ipv4.conf.all.arp_ignore", "0")?;
        node.sysctl("net.ipv4.conf.all.arp_announce", "0")?;
        let owners = dir.path().join("owners.yaml");
        let nft_file = dir.path().join("arpguard.nft");
        let foreign: Vec<Ipv4Addr> = plan
            .foreign
            .iter()
            .chain(&plan.foreign_on_uplink)
            .copied()
            .chain((0..plan.table_only).map(table_only_ip))
            .collect();
        let mut yaml = String::from("ips:\n");
        for ip in &foreign {
            yaml.push_str(&format!("  - ip: {ip}\n    owner: {OTHER}\n"));
        }
        for ip in &plan.owned {
            yaml.push_str(&format!("  - ip: {ip}\n    owner: {NODE}\n"));
        }
        std::fs::write(&owners, yaml)?;
        let elements: Vec<String> = foreign.iter().map(Ipv4Addr::to_string).collect();
        std::fs::write(
            &nft_file,
            format!(
                "table arp arpguard {{\n  set lb {{ type ipv4_addr; elements = {{ {} }}; }}\n  \
                 chain out {{ type filter hook output priority 0; policy accept; arp saddr ip @lb counter drop; }}\n}}\n",
                elements.join(", ")
            ),
        )?;
        let node_mac = node.mac("eth0")?;
        let peer_mac = peer.mac("eth0")?;
        Ok(AltBed {
            guard: None,
            dir,
            owners,
            nft_file,
            plan,
            node_mac,
            peer_mac,
            node,
            peer,
        })
    }

    /// Put `a` on the node (after [`AltBed::clear`] of whatever was there).
    pub fn apply(&mut self, a: Approach) -> Result<()> {
        self.clear()?;
        match a {
            Approach::Nothing => {}
            Approach::ArpGuard => {
                let owners = self.owners.to_str().context("path")?;
                self.guard = Some(Daemon::start(
                    &self.node,
                    &[
                        "-i",
                        "eth0",
                        "--node-name",
                        NODE,
                        "--ownership-file",
                        owners,
                    ],
                )?);
            }
            Approach::Nftables => {
                self.node
                    .exec(&["nft", "-f", self.nft_file.to_str().context("path")?])?;
            }
            Approach::StrictArp => {
                for conf in ["all", "eth0"] {
                    self.node
                        .sysctl(&format!("net.ipv4.conf.{conf}.arp_ignore"), "1")?;
                    self.node
                        .sysctl(&format!("net.ipv4.conf.{conf}.arp_announce"), "2")?;
                }
            }
        }
        Ok(())
    }

    /// Back to nothing: no daemon, no nft table, default sysctls.
    pub fn clear(&mut self) -> Result<()> {
        if let Some(mut g) = self.guard.take() {
            g.stop(libc::SIGTERM, Duration::from_secs(10))?;
        }
        let _ = self
            .node
            .exec_output(&["nft", "delete", "table", "arp", "arpguard"]);
        for conf in ["all", "eth0"] {
            self.node
                .sysctl(&format!("net.ipv4.conf.{conf}.arp_ignore"), "0")?;
            self.node
                .sysctl(&format!("net.ipv4.conf.{conf}.arp_announce"), "0")?;
        }
        Ok(())
    }
}

/// What reached the neighbour of a frame the node sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Arrived as sent.
    Passed,
    /// Did not arrive.
    Dropped,
    /// Arrived with another sender IP (the node's own): the LB IP not taught.
    Rewritten,
}

impl Outcome {
    pub fn name(self) -> &'static str {
        match self {
            Outcome::Passed => "passed",
            Outcome::Dropped => "dropped",
            Outcome::Rewritten => "rewritten",
        }
    }

    /// Whether the LB IP was kept from the neighbour.
    pub fn stopped(self) -> bool {
        self != Outcome::Passed
    }
}

/// The frame kinds of the coverage table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The kernel's reply to a request for an LB IP on kube-ipvs0.
    KernelReply,
    /// The same for an LB IP on the uplink itself.
    KernelReplyUplink,
    /// The kernel's gratuitous ARP (arp_notify on a MAC change) for an LB
    /// IP on the uplink.
    KernelGratuitous,
    /// The kernel's request for the neighbour with SPA = an LB IP (a packet
    /// from the LB IP, arp_announce=0).
    AnnounceLeak,
    /// A speaker's gratuitous ARP sent on an AF_PACKET socket.
    SpeakerGratuitous,
    /// A speaker's reply sent on an AF_PACKET socket.
    SpeakerReply,
    /// A reply made by a TC ingress program and redirected out (Cilium-like).
    RedirectReply,
    /// The kernel's reply for an IP this node owns (must pass).
    OwnedReply,
}

pub const KINDS: [Kind; 8] = [
    Kind::KernelReply,
    Kind::KernelReplyUplink,
    Kind::KernelGratuitous,
    Kind::AnnounceLeak,
    Kind::SpeakerGratuitous,
    Kind::SpeakerReply,
    Kind::RedirectReply,
    Kind::OwnedReply,
];

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::KernelReply => "kernel_reply",
            Kind::KernelReplyUplink => "kernel_reply_uplink",
            Kind::KernelGratuitous => "kernel_gratuitous",
            Kind::AnnounceLeak => "announce_leak",
            Kind::SpeakerGratuitous => "speaker_gratuitous",
            Kind::SpeakerReply => "speaker_reply",
            Kind::RedirectReply => "redirect_reply",
            Kind::OwnedReply => "owned_reply",
        }
    }
}

/// The coverage bed: one foreign and one owned LB IP on kube-ipvs0, one
/// foreign LB IP on the uplink.
pub fn coverage_bed(tag: &str) -> Result<AltBed> {
    AltBed::new(
        tag,
        Plan {
            foreign: vec![Ipv4Addr::new(203, 0, 113, 10)],
            owned: vec![Ipv4Addr::new(203, 0, 113, 11)],
            foreign_on_uplink: vec![Ipv4Addr::new(203, 0, 113, 12)],
            table_only: 0,
        },
    )
}

/// Produce one frame of `kind` on the node (whatever approach is applied)
/// and say what reached the neighbour.
pub fn probe(bed: &AltBed, cap: &RawSocket, kind: Kind) -> Result<Outcome> {
    let foreign = bed.plan.foreign[0];
    cap.drain();
    match kind {
        Kind::KernelReply => ask(bed, cap, foreign, bed.node_mac),
        Kind::KernelReplyUplink => ask(bed, cap, bed.plan.foreign_on_uplink[0], bed.node_mac),
        Kind::OwnedReply => ask(bed, cap, bed.plan.owned[0], bed.node_mac),
        Kind::KernelGratuitous => kernel_gratuitous(bed, cap),
        Kind::AnnounceLeak => announce_leak(bed, cap, foreign),
        Kind::SpeakerGratuitous => {
            let spec = ArpSpec::gratuitous(1, SPEAKER_MAC, foreign);
            speak(bed, cap, &spec)
        }
        Kind::SpeakerReply => {
            let spec = ArpSpec::reply(SPEAKER_MAC, foreign, bed.peer_mac, PEER_IP);
            speak(bed, cap, &spec)
        }
        Kind::RedirectReply => {
            let _responder =
                fixture_responder::attach(&bed.node, "eth0", vec![foreign], RESPONDER_MAC, true);
            ask(bed, cap, foreign, RESPONDER_MAC)
        }
    }
}

/// The peer asks for `ip`; did a reply from `mac` arrive?
fn ask(bed: &AltBed, cap: &RawSocket, ip: Ipv4Addr, mac: [u8; 6]) -> Result<Outcome> {
    let req = ArpSpec::request(bed.peer_mac, PEER_IP, ip);
    anyhow::ensure!(cap.send(&req.to_bytes())?, "the peer could not send");
    let got = cap.wait_arp(WAIT, |c| c.op == 2 && c.spa == ip && c.sha == mac)?;
    Ok(if got.is_some() {
        Outcome::Passed
    } else {
        Outcome::Dropped
    })
}

/// A speaker on the node sends `spec` on an AF_PACKET socket.
fn speak(bed: &AltBed, cap: &RawSocket, spec: &ArpSpec) -> Result<Outcome> {
    let speaker = RawSocket::open(&bed.node, "eth0")?;
    // Ok(false): dropped at egress (sendto said ENOBUFS); we look anyway.
    let _ = speaker.send(&spec.to_bytes())?;
    let got = cap.wait_arp(WAIT, |c| {
        c.op == spec.op && c.spa == spec.spa && c.sha == spec.sha && c.tpa == spec.tpa
    })?;
    Ok(if got.is_some() {
        Outcome::Passed
    } else {
        Outcome::Dropped
    })
}

/// A speaker on the node sends `n` gratuitous ARPs for the first foreign
/// IP, 1 ms apart (as the issue's trial did with 100); how many reached the
/// neighbour.
pub fn speaker_burst(bed: &AltBed, cap: &RawSocket, n: usize) -> Result<usize> {
    let ip = bed.plan.foreign[0];
    let speaker = RawSocket::open(&bed.node, "eth0")?;
    cap.drain();
    let frame = ArpSpec::gratuitous(1, SPEAKER_MAC, ip).to_bytes();
    for _ in 0..n {
        let _ = speaker.send(&frame)?;
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(cap
        .collect_arp(QUIET)?
        .iter()
        .filter(|c| c.spa == ip && c.tpa == ip && c.sha == SPEAKER_MAC)
        .count())
}

/// arp_notify=1 and a new MAC: the kernel announces every address of the
/// uplink; the MAC goes back afterwards (announcing again, unobserved).
fn kernel_gratuitous(bed: &AltBed, cap: &RawSocket) -> Result<Outcome> {
    let ip = bed.plan.foreign_on_uplink[0];
    let temp = "02:00:5e:00:53:01";
    bed.node.sysctl("net.ipv4.conf.eth0.arp_notify", "1")?;
    bed.node.ip(&["link", "set", "eth0", "address", temp])?;
    // The node's own address is announced in the same burst: wait for it,
    // then look for the LB IP among what came.
    let own = cap.wait_arp(ARRIVE, |c| c.spa == NODE_IP && c.tpa == NODE_IP)?;
    let rest = cap.collect_arp(QUIET)?;
    let restore = testbed::netns::fmt_mac(&bed.node_mac);
    bed.node.ip(&["link", "set", "eth0", "address", &restore])?;
    bed.node.sysctl("net.ipv4.conf.eth0.arp_notify", "0")?;
    anyhow::ensure!(own.is_some(), "the node's own address was not announced");
    let announced = own
        .into_iter()
        .chain(rest)
        .any(|c: Captured| c.spa == ip && c.tpa == ip);
    std::thread::sleep(QUIET);
    cap.drain();
    Ok(if announced {
        Outcome::Passed
    } else {
        Outcome::Dropped
    })
}

/// A packet from `ip` to the peer: the kernel asks for the peer; with which
/// sender IP did the request arrive, if at all?
fn announce_leak(bed: &AltBed, cap: &RawSocket, ip: Ipv4Addr) -> Result<Outcome> {
    bed.node.flush_neigh("eth0")?;
    bed.node.poke_from(&ip.to_string(), &PEER_IP.to_string())?;
    let got = cap.wait_arp(WAIT, |c| {
        c.op == 1 && c.tpa == PEER_IP && c.sha == bed.node_mac
    })?;
    Ok(match got {
        None => Outcome::Dropped,
        Some(c) if c.spa == ip => Outcome::Passed,
        Some(_) => Outcome::Rewritten,
    })
}

/// One approach's row of the coverage table: what became of each kind.
pub type CoverageRow = (Approach, Vec<(Kind, Outcome)>);

/// Every kind under every approach, on one bed, in the order of
/// [`APPROACHES`] and [`KINDS`].
pub fn coverage(bed: &mut AltBed) -> Result<Vec<CoverageRow>> {
    let cap = RawSocket::open(&bed.peer, "eth0")?;
    let mut out = Vec::new();
    for a in APPROACHES {
        bed.apply(a)?;
        let mut row = Vec::new();
        for k in KINDS {
            let o = probe(bed, &cap, k).with_context(|| format!("{} {}", a.name(), k.name()))?;
            row.push((k, o));
        }
        out.push((a, row));
    }
    bed.clear()?;
    Ok(out)
}
