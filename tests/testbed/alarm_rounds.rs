//! Ordinary takeovers for the alarm tests (`tests/alarms.rs`,
//! `tests/alarms_restart.rs`): the way each announcer performs them, on a
//! two-node [`ClusterBed`] with strictARP on (arp_ignore=1,
//! arp_announce=2), every LB IP on kube-ipvs0 and on its owner's eth0 (the
//! owner answers ARP; the active census asks), a client sending to every
//! IP. Per Service, takeovers back and forth: the old owner stops (its
//! address goes), the new one takes the address and announces, and the
//! feed says so
//!
//! - Cilium: the Lease, then one gratuitous reply;
//! - kube-vip: its Lease, then a gratuitous request and reply;
//! - MetalLB: a gratuitous request and reply, then every 1.1 s for 5 s (as
//!   MetalLB does), and its ServiceL2Status 0-8 s after the first.
//!
//! Leases are renewed every 2 s (15 s duration).

use std::{
    collections::BTreeMap,
    net::{Ipv4Addr, SocketAddr, UdpSocket},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use serde_json::Value;

use crate::{
    cluster_bed::{ClusterBed, PRESENCE_NS},
    fake_api::{objects, ApiHandle, Resource},
    promtool::{self, Expect},
    takeover::Style,
    ArpSpec, RawSocket,
};

/// Between two takeovers of one IP: past the census window (2 s), so that
/// two owners one after the other are a move, not a conflict.
pub const GAP: Duration = Duration::from_millis(2600);
const LEASE_SECONDS: i32 = 15;

/// The guards' flags (after `--mode`): every announcer, presence and the
/// active census fast, a split brain told after 15 s.
pub const GUARD_ARGS: &[&str] = &[
    "--announcer",
    "cilium,kube-vip,metallb",
    "--presence-period",
    "1s",
    "--presence-namespace",
    PRESENCE_NS,
    "--census-window",
    "2s",
    "--probe-interval",
    "10s",
    "--probe-in-monitor-mode",
    "--split-brain-after",
    "15s",
];

pub struct Svc {
    pub name: &'static str,
    pub ip: Ipv4Addr,
    pub style: Style,
}

pub const fn svc(name: &'static str, last: u8, style: Style) -> Svc {
    Svc {
        name,
        ip: Ipv4Addr::new(198, 51, 100, last),
        style,
    }
}

/// Who holds each Lease now; renewed every 2 s by [`drive`].
pub type Holders = Arc<Mutex<BTreeMap<&'static str, (Style, String)>>>;

pub fn write_lease(api: &ApiHandle, svc: &str, style: Style, holder: &str) {
    let renew = objects::renew_now();
    let lease = match style {
        Style::Cilium => objects::cilium_lease(svc, holder, LEASE_SECONDS, &renew),
        _ => objects::lease(
            "default",
            &format!("kubevip-{svc}"),
            holder,
            LEASE_SECONDS,
            &renew,
        ),
    };
    api.apply(Resource::Leases, lease);
}

/// MetalLB's status: node `to` announces `svc` (the other's is removed).
pub fn write_status(api: &ApiHandle, svc: &str, to: usize, node: &str) {
    api.delete(
        Resource::L2Statuses,
        "metallb-system",
        &format!("l2-{svc}-{}", 1 - to),
    );
    api.apply(
        Resource::L2Statuses,
        objects::l2status(
            "metallb-system",
            &format!("l2-{svc}-{to}"),
            node,
            "default",
            svc,
        ),
    );
}

/// The bed's cluster before the guards start: strictARP on, the Nodes,
/// each Service owned by node-a (its Lease or status, its address on
/// node-a's eth0).
pub fn prepare(bed: &ClusterBed, services: &[&Svc]) -> Holders {
    let api = bed.api.handle();
    for n in &bed.nodes {
        // strictARP on: the kernel answers only for addresses on eth0.
        n.ns.sysctl("net.ipv4.conf.all.arp_ignore", "1").unwrap();
        n.ns.sysctl("net.ipv4.conf.all.arp_announce", "2").unwrap();
        bed.api.apply(Resource::Nodes, objects::node(&n.name));
    }
    let holders: Holders = Arc::default();
    for s in services {
        bed.api.apply(
            Resource::Services,
            objects::service("default", s.name, &[&s.ip.to_string()]),
        );
        match s.style {
            Style::MetalLb => write_status(&api, s.name, 0, "node-a"),
            style => {
                write_lease(&api, s.name, style, "node-a");
                holders
                    .lock()
                    .unwrap()
                    .insert(s.name, (style, "node-a".into()));
            }
        }
        bed.nodes[0]
            .ns
            .ip(&["addr", "add", &format!("{}/32", s.ip), "dev", "eth0"])
            .unwrap();
    }
    holders
}

/// The client's entries for `ips` point at node-a, reachable for long.
pub fn client_knows_node_a(bed: &ClusterBed, ips: &[Ipv4Addr]) {
    let client = &bed.peer;
    client
        .sysctl("net.ipv4.neigh.eth0.base_reachable_time_ms", "600000")
        .unwrap();
    for ip in ips {
        client
            .set_neigh("eth0", *ip, &bed.nodes[0].mac, "reachable")
            .unwrap();
    }
}

/// A speaker announces `ip` (gratuitous `ops`: 1 request, 2 reply).
pub fn announce(speaker: &RawSocket, mac: [u8; 6], ip: Ipv4Addr, ops: &[u16]) {
    for op in ops {
        speaker
            .send(&ArpSpec::gratuitous(*op, mac, ip).to_bytes())
            .unwrap();
    }
}

/// `n` takeovers of `s`, back and forth, the way its announcer does them
/// (MetalLB's status late by 0-8 s: rising over the rounds for `k` 0,
/// falling for the others).
pub fn rounds(bed: &ClusterBed, s: &Svc, k: usize, holders: &Holders, n: usize) {
    let api = bed.api.handle();
    let speakers: Vec<RawSocket> = (bed.nodes.iter())
        .map(|n| RawSocket::open(&n.ns, "eth0").unwrap())
        .collect();
    let addr = format!("{}/32", s.ip);
    for round in 0..n {
        let (from, to) = (round % 2, 1 - round % 2);
        let (node, mac) = (&bed.nodes[to].name, bed.nodes[to].mac);
        // The old owner stops answering; the new one takes the address.
        bed.nodes[from]
            .ns
            .ip(&["addr", "del", &addr, "dev", "eth0"])
            .unwrap();
        bed.nodes[to]
            .ns
            .ip(&["addr", "add", &addr, "dev", "eth0"])
            .unwrap();
        match s.style {
            Style::Cilium | Style::KubeVip => {
                holders
                    .lock()
                    .unwrap()
                    .insert(s.name, (s.style, node.clone()));
                write_lease(&api, s.name, s.style, node);
                let ops: &[u16] = if s.style == Style::Cilium {
                    &[2]
                } else {
                    &[1, 2]
                };
                announce(&speakers[to], mac, s.ip, ops);
            }
            Style::MetalLb => {
                // Its status 0-8 s late: spread over the range, both ends in.
                let step = 8000 / (n.max(2) as u64 - 1);
                let late = Duration::from_millis(if k == 0 {
                    round as u64 * step
                } else {
                    8000 - round as u64 * step
                });
                metallb_takeover(&api, s, &speakers[to], (mac, to, node), late);
            }
        }
        std::thread::sleep(GAP);
    }
}

/// MetalLB: a burst of request and reply every 1.1 s for 5 s from the new
/// owner (its MAC, index and name), its status `late` after the first.
fn metallb_takeover(
    api: &ApiHandle,
    s: &Svc,
    speaker: &RawSocket,
    (mac, to, node): ([u8; 6], usize, &str),
    late: Duration,
) {
    let t0 = Instant::now();
    let mut written = false;
    for i in 0..5u32 {
        let at = Duration::from_millis(1100) * i;
        while t0.elapsed() < at {
            if !written && t0.elapsed() >= late {
                write_status(api, s.name, to, node);
                written = true;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        announce(speaker, mac, s.ip, &[1, 2]);
    }
    if !written {
        std::thread::sleep(late.saturating_sub(t0.elapsed()));
        write_status(api, s.name, to, node);
    }
}

/// Sets a flag however the scope ends (a panic too).
pub struct StopOnDrop<'a>(pub &'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// `n` rounds of every Service of `services` at once, while the Leases are
/// renewed every 2 s and the client sends to every IP of `ips` five times a
/// second; `beside` runs meanwhile (in the scope, with the flag that stops
/// the helpers), and `after` once the rounds are over; what `after` gives.
pub fn drive<T>(
    bed: &ClusterBed,
    (services, ips, n): (&[&Svc], &[Ipv4Addr], usize),
    holders: &Holders,
    beside: impl FnOnce(&AtomicBool) + Send,
    after: impl FnOnce() -> T,
) -> T {
    let stop = AtomicBool::new(false);
    let api = bed.api.handle();
    let client = (bed.peer)
        .enter(|| Ok(UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))?))
        .unwrap();
    std::thread::scope(|scope| {
        // The helpers stop however this ends (a panic too).
        let _stop = StopOnDrop(&stop);
        scope.spawn(|| {
            while !stop.load(Ordering::SeqCst) {
                for (svc, (style, holder)) in holders.lock().unwrap().iter() {
                    write_lease(&api, svc, *style, holder);
                }
                std::thread::sleep(Duration::from_secs(2));
            }
        });
        scope.spawn(|| {
            while !stop.load(Ordering::SeqCst) {
                for ip in ips {
                    let _ = client.send_to(b"hello", SocketAddr::from((*ip, 7777)));
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        });
        let beside = scope.spawn(|| beside(&stop));
        let workers: Vec<_> = (services.iter().enumerate())
            .map(|(i, s)| scope.spawn(move || rounds(bed, s, i % 2, holders, n)))
            .collect();
        for w in workers {
            w.join().unwrap();
        }
        beside.join().unwrap();
        after()
    })
}

/// No alert at any minute from the first to `until` (but those `but`
/// leaves out).
pub fn none_fire(spec: &Value, until: Duration, but: &[&str]) -> Vec<Expect> {
    let names = promtool::alertnames(spec);
    (1..=until.as_secs() / 60)
        .flat_map(|m| {
            (names.iter())
                .filter(|a| !but.contains(&a.as_str()))
                .map(move |a| Expect {
                    at: Duration::from_secs(m * 60),
                    alert: a.clone(),
                    exp: Vec::new(),
                })
        })
        .collect()
}
