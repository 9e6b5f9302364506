//! `cargo xtask lab`: the incident from the field, reproduced in network
//! namespaces, then stopped by arp-guard.
//!
//! ```text
//!                       +-- node1 198.51.100.11  owner: listens on LB:443
//!  client 198.51.100.1 -+-- node2 198.51.100.12  no endpoint: drops SYNs (eTP: Local)
//!   (HAProxy stand-in)  +-- node3 198.51.100.13  no endpoint: drops SYNs
//!        (one bridge in its own namespace is the switch)
//! ```
//! Every node carries the LB IP on a kube-ipvs0 stand-in with arp_ignore=0,
//! as kube-proxy in IPVS mode with strictARP: false leaves it, so all three
//! kernels answer the client's ARP request. Every NIC processes its receive
//! queue in its own kernel thread (threaded NAPI), so the three kernels answer
//! concurrently, as three machines would, and which reply reaches the client
//! first is decided by the scheduler: the race is real, not scripted.

use std::{
    collections::BTreeMap,
    io::Read as _,
    net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream},
    path::PathBuf,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use crate::{
    bed::TempDir,
    netns::{fmt_mac, kube_ipvs0, veth},
    Daemon, Netns,
};
use anyhow::{bail, Context as _, Result};
use serde_json::Value;

pub const LB_IP: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 100);
const CLIENT_IP: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 1);
const PORT: u16 = 443;
const NODES: usize = 3;
/// How long one connect attempt may take; a dropped SYN shows as a timeout.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(800);

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// Ctrl-C / SIGTERM end the current attempt; everything is then torn down.
pub fn install_interrupt_handler() {
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe {
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
    }
}

fn check_interrupted() -> Result<()> {
    if INTERRUPTED.load(Ordering::SeqCst) {
        bail!("interrupted; tearing the lab down");
    }
    Ok(())
}

pub struct Options {
    /// Attempts per phase (one per second).
    pub attempts: u32,
    pub binary: PathBuf,
}

/// What one phase saw.
#[derive(Debug, Clone, Default)]
pub struct Phase {
    pub attempts: u32,
    pub successes: u32,
    /// Node name (or "none") -> (times its MAC was learned, successes then).
    pub learned: BTreeMap<String, (u32, u32)>,
    /// Node name -> the guard's counters JSON (phase 2 only).
    pub counters: BTreeMap<String, Value>,
}

struct Node {
    name: String,
    ip: Ipv4Addr,
    mac: [u8; 6],
    ns: Netns,
}

pub struct Lab {
    // Drop order: daemons before namespaces (fields drop top to bottom).
    daemons: Vec<Daemon>,
    stop_listener: Arc<AtomicBool>,
    dir: TempDir,
    nodes: Vec<Node>,
    client: Netns,
    _switch: Netns,
}

impl Drop for Lab {
    fn drop(&mut self) {
        self.stop_listener.store(true, Ordering::SeqCst);
        self.daemons.clear();
    }
}

/// Run `ethtool`/sysfs settings that give a veth end its own receive thread.
fn threaded_napi(ns: &Netns, dev: &str) -> Result<()> {
    // GRO enables veth's NAPI path; without TSO ARP frames are eligible for it.
    ns.exec(&["ethtool", "-K", dev, "gro", "on", "tso", "off"])?;
    ns.exec(&[
        "sh",
        "-c",
        &format!("echo 1 > /sys/class/net/{dev}/threaded"),
    ])?;
    Ok(())
}

impl Lab {
    pub fn build() -> Result<Self> {
        let switch = Netns::new("lab-switch")?;
        switch.ip(&["link", "add", "br0", "type", "bridge"])?;
        switch.ip(&["link", "set", "br0", "up"])?;
        let client = Netns::new("lab-client")?;
        veth(&client, "eth0", &switch, "port0")?;
        switch.ip(&["link", "set", "port0", "master", "br0"])?;
        client.ip(&["addr", "add", &format!("{CLIENT_IP}/24"), "dev", "eth0"])?;
        threaded_napi(&client, "eth0")?;
        threaded_napi(&switch, "port0")?;
        let mut nodes = Vec::new();
        for i in 1..=NODES {
            let name = format!("node{i}");
            let ns = Netns::new(&format!("lab-{name}"))?;
            let port = format!("port{i}");
            veth(&ns, "eth0", &switch, &port)?;
            switch.ip(&["link", "set", &port, "master", "br0"])?;
            let ip = Ipv4Addr::new(198, 51, 100, 10 + i as u8);
            ns.ip(&["addr", "add", &format!("{ip}/24"), "dev", "eth0"])?;
            // kube-ipvs0 stand-in holding the LB IP, like kube-proxy's dummy.
            kube_ipvs0(&ns, &[LB_IP])?;
            // strictARP: false leaves the kernel defaults.
            ns.sysctl("net.ipv4.conf.all.arp_ignore", "0")?;
            ns.sysctl("net.ipv4.conf.all.arp_announce", "0")?;
            threaded_napi(&ns, "eth0")?;
            threaded_napi(&switch, &port)?;
            let mac = ns.mac("eth0")?;
            nodes.push(Node { name, ip, mac, ns });
        }
        for ns in nodes.iter().map(|n| &n.ns).chain([&client, &switch]) {
            ns.sysctl("net.ipv6.conf.all.disable_ipv6", "1")?;
        }
        let stop_listener = Arc::new(AtomicBool::new(false));
        // node1 owns the LB IP and has the endpoint.
        serve(&nodes[0], stop_listener.clone())?;
        // The others have none: with externalTrafficPolicy: Local IPVS has no
        // real server there and the SYN is dropped.
        for n in &nodes[1..] {
            n.ns.exec(&["nft", "add table inet lab"])?;
            n.ns.exec(&[
                "nft",
                "add chain inet lab input { type filter hook input priority 0 ; }",
            ])?;
            n.ns.exec(&[
                "nft",
                &format!("add rule inet lab input ip daddr {LB_IP} tcp dport {PORT} drop"),
            ])?;
        }
        let dir = TempDir::new("lab")?;
        Ok(Lab {
            daemons: Vec::new(),
            stop_listener,
            dir,
            nodes,
            client,
            _switch: switch,
        })
    }

    fn describe(&self) {
        println!("arp-guard lab: the incident, reproduced in network namespaces");
        println!("  client {CLIENT_IP} (stands in for an external HAProxy), one bridge as the switch, and:");
        for (i, n) in self.nodes.iter().enumerate() {
            let role = if i == 0 {
                "owner of the LB IP, listens on :443"
            } else {
                "no local endpoint: drops SYNs (eTP: Local)"
            };
            println!("  {} {} {}  {role}", n.name, n.ip, fmt_mac(&n.mac));
        }
        println!("  every node has {LB_IP}/32 on kube-ipvs0 and arp_ignore=0 (IPVS mode, strictARP: false),");
        println!("  so every node's kernel answers the client's ARP request for {LB_IP}.");
        println!();
    }

    fn who(&self, mac: Option<[u8; 6]>) -> String {
        match mac {
            None => "none".into(),
            Some(m) => self
                .nodes
                .iter()
                .find(|n| n.mac == m)
                .map_or_else(|| fmt_mac(&m), |n| n.name.clone()),
        }
    }

    /// The field engineer's check: one connect per second, neighbour entry flushed each time.
    fn check(&self, attempts: u32) -> Result<Phase> {
        let mut phase = Phase::default();
        let lb = LB_IP.to_string();
        for i in 1..=attempts {
            check_interrupted()?;
            let started = Instant::now();
            self.client
                .ip(&["neigh", "flush", "to", &lb, "dev", "eth0"])?;
            let greeting = connect(&self.client)?;
            let learned = self.client.neigh("eth0", &lb)?.and_then(|(mac, _)| mac);
            let who = self.who(learned);
            let ok = greeting.is_some();
            phase.attempts += 1;
            phase.successes += u32::from(ok);
            let e = phase.learned.entry(who.clone()).or_default();
            e.0 += 1;
            e.1 += u32::from(ok);
            let outcome = match &greeting {
                Some(g) => format!("ok    answered by {g}"),
                None => "FAIL  connect timed out (SYN dropped)".to_owned(),
            };
            println!("  [{i:>3}/{attempts}] client learned {lb} -> {who:<6} {outcome}");
            if let Some(left) = Duration::from_secs(1).checked_sub(started.elapsed()) {
                std::thread::sleep(left);
            }
        }
        Ok(phase)
    }

    fn start_guards(&mut self, binary: &std::path::Path) -> Result<()> {
        let owners = self.dir.path().join("owners.yaml");
        std::fs::write(&owners, format!("# which node owns which LB IP (the lab's MetalLB would say the same)\nips:\n  - ip: {LB_IP}\n    owner: node1\n"))?;
        let owners = owners.to_string_lossy().into_owned();
        for n in &self.nodes {
            let d = Daemon::start_with(
                &n.ns,
                binary,
                &[
                    "-i",
                    "eth0",
                    "--node-name",
                    &n.name,
                    "--ownership-file",
                    &owners,
                    "--lb-ips-from",
                    "kube-ipvs0",
                ],
            )
            .with_context(|| format!("starting arp-guard on {}", n.name))?;
            self.daemons.push(d);
        }
        Ok(())
    }

    fn read_counters(&self, binary: &std::path::Path) -> Result<BTreeMap<String, Value>> {
        let mut out = BTreeMap::new();
        for n in &self.nodes {
            out.insert(
                n.name.clone(),
                crate::daemon::counters_json(&n.ns, binary, "eth0")?,
            );
        }
        Ok(out)
    }
}

/// Accept connections on LB:443 inside the owner's namespace and greet them.
fn serve(owner: &Node, stop: Arc<AtomicBool>) -> Result<()> {
    let addr = SocketAddr::from((LB_IP, PORT));
    let listener = owner.ns.enter(move || Ok(TcpListener::bind(addr)?))?;
    listener.set_nonblocking(true)?;
    let name = owner.name.clone();
    std::thread::spawn(move || {
        use std::io::Write as _;
        while !stop.load(Ordering::SeqCst) {
            match listener.accept() {
                Ok((mut s, _)) => {
                    let _ = s.write_all(format!("{name}\n").as_bytes());
                }
                Err(_) => std::thread::sleep(Duration::from_millis(10)),
            }
        }
    });
    Ok(())
}

/// One connect from the client; the greeting (the owner's name) on success.
fn connect(client: &Netns) -> Result<Option<String>> {
    client.enter(|| {
        let addr = SocketAddr::from((LB_IP, PORT));
        let Ok(mut s) = TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT) else {
            return Ok(None);
        };
        s.set_read_timeout(Some(CONNECT_TIMEOUT))?;
        let mut buf = String::new();
        let _ = s.read_to_string(&mut buf);
        Ok(Some(buf.trim().to_owned()).filter(|g| !g.is_empty()))
    })
}

fn report(title: &str, p: &Phase) {
    let pct = if p.attempts == 0 {
        0.0
    } else {
        100.0 * f64::from(p.successes) / f64::from(p.attempts)
    };
    println!(
        "  {title}: {}/{} connects succeeded ({pct:.0}%)",
        p.successes, p.attempts
    );
    let learned: Vec<String> = p
        .learned
        .iter()
        .map(|(who, (n, ok))| format!("{who} {n}x ({ok} ok)"))
        .collect();
    println!(
        "  MACs the client learned for {LB_IP}: {}",
        learned.join(", ")
    );
}

/// Summarise one node's guard counters: decisions per (kind, origin, state, verdict).
fn summarize_counters(v: &Value) -> String {
    let mut parts = Vec::new();
    for r in v["counters"].as_array().into_iter().flatten() {
        parts.push(format!(
            "{} {} {} {} {}: {}",
            r["lb_ip"].as_str().unwrap_or("?"),
            r["kind"].as_str().unwrap_or("?"),
            r["origin"].as_str().unwrap_or("?"),
            r["state"].as_str().unwrap_or("?"),
            r["verdict"].as_str().unwrap_or("?"),
            r["packets"]
        ));
    }
    if parts.is_empty() {
        "no ARP from an LB IP seen".into()
    } else {
        parts.join("; ")
    }
}

/// Build the lab, run both phases, report, tear down. Returns (without, with).
pub fn run(opts: &Options) -> Result<(Phase, Phase)> {
    let mut lab = Lab::build().context("building the lab")?;
    lab.describe();
    println!("phase 1/2: WITHOUT arp-guard: {} attempts, one per second, client's neighbour entry flushed before each", opts.attempts);
    let before = lab.check(opts.attempts)?;
    report("without arp-guard", &before);
    println!();
    lab.start_guards(&opts.binary)?;
    println!("phase 2/2: WITH arp-guard on every node's eth0 egress (ownership file: {LB_IP} -> node1, enforce mode)");
    let mut after = lab.check(opts.attempts)?;
    after.counters = lab.read_counters(&opts.binary)?;
    report("with arp-guard", &after);
    println!("  guard counters (kernel side, per node):");
    for (node, v) in &after.counters {
        println!("    {node}: {}", summarize_counters(v));
    }
    println!();
    println!(
        "summary: without the guard {}/{} connects succeeded; with it {}/{}.",
        before.successes, before.attempts, after.successes, after.attempts
    );
    drop(lab);
    println!("lab torn down (namespaces, links, guards).");
    Ok((before, after))
}
