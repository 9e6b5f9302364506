//! Takeovers as each announcer performs them, against the client whose
//! cache must follow: a two-node [`ClusterBed`] whose peer is the client,
//! with an existing neighbour entry for the LB IP (a long reachable time,
//! no re-ARP of its own), and on each node a speaker socket that announces
//! the way the announcer does, in its order relative to the API write:
//!
//! - Cilium: the Lease is written, then one gratuitous ARP reply at once;
//! - kube-vip: its Lease, then a gratuitous request and reply;
//! - MetalLB: a gratuitous request and reply first, the ServiceL2Status
//!   0–500 ms later (the old node's removed, the new node's created).
//!
//! Used by `tests/takeover.rs` (every round must move the client within a
//! second) and `benches/takeover.rs` (the delay, with and without guard).

use std::{
    net::Ipv4Addr,
    time::{Duration, Instant},
};

use anyhow::{bail, Result};

use crate::{
    cluster_bed::ClusterBed,
    fake_api::{objects, ApiHandle, Resource},
    ArpSpec, Daemon, RawSocket,
};

/// The LB IP of the Service `default/web`.
pub const LB: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 100);

/// How the announcer orders its API write and its announcements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Style {
    Cilium,
    KubeVip,
    MetalLb,
}

impl Style {
    pub fn announcer(self) -> &'static str {
        match self {
            Style::Cilium => "cilium",
            Style::KubeVip => "kube-vip",
            Style::MetalLb => "metallb",
        }
    }
}

pub struct TakeoverBed {
    pub bed: ClusterBed,
    pub style: Style,
    pub speakers: Vec<RawSocket>,
    /// What reaches the client's interface.
    pub capture: RawSocket,
    pub guards: Vec<Daemon>,
    /// The node that owns the IP now.
    pub owner: usize,
    rng: u64,
}

/// One takeover, timed from its start (the API write, or the first
/// announcement when it comes first).
#[derive(Debug, Clone, Copy)]
pub struct Round {
    pub to: usize,
    /// Until the first announcement of the new owner's MAC reached the
    /// client's interface (None: none within the limit).
    pub arrived_after: Option<Duration>,
    /// Until the client's entry held the new MAC, as `ip neigh` shows it
    /// (polled every 20 ms; None: not within the limit).
    pub moved_after: Option<Duration>,
}

impl TakeoverBed {
    /// The bed with node-a owning `web`, the client's entry pointing at
    /// node-a; with `guard`, arp-guard in enforce mode on both nodes
    /// (`extra` flags after the common ones).
    pub fn new(tag: &str, style: Style, guard: bool, extra: &[&str]) -> Result<Self> {
        Self::new_wrapped(tag, style, guard, extra, &[])
    }

    /// [`Self::new`] with the guards run under `wrapper` (e.g. the
    /// DaemonSet's privileges, `deploy::daemonset_wrapper`).
    pub fn new_wrapped(
        tag: &str,
        style: Style,
        guard: bool,
        extra: &[&str],
        wrapper: &[String],
    ) -> Result<Self> {
        let bed = ClusterBed::new(tag, &[LB])?;
        bed.api.apply(
            Resource::Services,
            objects::service("default", "web", &[&LB.to_string()]),
        );
        let capture = RawSocket::open(&bed.peer, "eth0")?;
        let mut t = TakeoverBed {
            capture,
            speakers: Vec::new(),
            guards: Vec::new(),
            owner: 0,
            style,
            rng: 0x9e37_79b9_7f4a_7c15,
            bed,
        };
        t.write_owner(0);
        for n in &t.bed.nodes {
            t.speakers.push(RawSocket::open(&n.ns, "eth0")?);
        }
        if guard {
            let mut args = vec!["--announcer", style.announcer()];
            args.extend_from_slice(extra);
            t.guards = t.bed.start_wrapped(wrapper, &args)?;
            // Both guards know the owner before the first takeover.
            let ok = crate::wait_until(Duration::from_secs(10), || {
                (0..2).all(|i| t.state_on(i).as_deref() == Some(["owned", "foreign"][i]))
            });
            if !ok {
                bail!(
                    "the guards never learned that node-a owns {LB}:\n{}\n{}",
                    t.guards[0].log_text(),
                    t.guards[1].log_text()
                );
            }
        }
        let client = &t.bed.peer;
        for (k, v) in [
            ("base_reachable_time_ms", "600000"),
            ("delay_first_probe_time", "600"),
            ("gc_stale_time", "3600"),
        ] {
            client.sysctl(&format!("net.ipv4.neigh.eth0.{k}"), v)?;
        }
        client.set_neigh("eth0", LB, &t.bed.nodes[0].mac, "reachable")?;
        // An entry updated within `locktime` (1 s) ignores the next update.
        std::thread::sleep(Duration::from_millis(1100));
        Ok(t)
    }

    /// This node's state for the LB IP, as its guard's `/status` says.
    pub fn state_on(&self, i: usize) -> Option<String> {
        let (_, body) = self.bed.nodes[i]
            .ns
            .enter(|| Ok(crate::http_get("127.0.0.1:9477", "/status")))
            .ok()?;
        let v: serde_json::Value = serde_json::from_str(&body).ok()?;
        v["ips"]
            .as_array()?
            .iter()
            .find(|r| r["ip"] == LB.to_string())
            .and_then(|r| r["state"].as_str().map(str::to_owned))
    }

    /// Write "node `i` owns web" the way the announcer does.
    fn write_owner(&self, i: usize) {
        write_owner(
            &self.bed.api.handle(),
            self.style,
            &self.bed.nodes[i].name,
            i,
        )
    }

    /// Node `i`'s speaker announces the LB IP (`ops`: gratuitous request 1,
    /// reply 2); what the sender saw for each (false: dropped at egress).
    fn announce(&self, i: usize, ops: &[u16]) -> Result<Vec<bool>> {
        let mac = self.bed.nodes[i].mac;
        ops.iter()
            .map(|op| self.speakers[i].send(&ArpSpec::gratuitous(*op, mac, LB).to_bytes()))
            .collect()
    }

    fn next_rand(&mut self) -> u64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng
    }

    /// The other node takes the IP over; how long until the client's entry
    /// holds its MAC (polled up to `limit`).
    pub fn round(&mut self, limit: Duration) -> Result<Round> {
        self.capture.drain();
        let (to, started, writer) = self.take_over()?;
        let want = self.bed.nodes[to].mac;
        let arrived = self
            .capture
            .wait_arp(limit, |c| c.spa == LB && c.sha == want)?
            .map(|_| started.elapsed());
        let moved_after = crate::wait_for(limit, || {
            let mac = self.bed.peer.cached_mac("eth0", &LB.to_string()).ok()??;
            (mac == want).then(|| started.elapsed())
        });
        if let Some(w) = writer {
            w.join()
                .map_err(|_| anyhow::anyhow!("the status writer panicked"))?;
        }
        // The next update must come after the client's locktime (1 s).
        std::thread::sleep(Duration::from_millis(1100));
        Ok(Round {
            to,
            arrived_after: arrived,
            moved_after,
        })
    }

    /// The other node takes the IP over, the way the announcer does it:
    /// the new owner, when the takeover started (the API write, or the
    /// first announcement when it comes first), and MetalLB's status
    /// writer still to join.
    #[allow(clippy::type_complexity)]
    pub fn take_over(&mut self) -> Result<(usize, Instant, Option<std::thread::JoinHandle<()>>)> {
        let to = 1 - self.owner;
        let mut writer = None;
        let started = match self.style {
            Style::Cilium => {
                self.write_owner(to);
                let t = Instant::now();
                self.announce(to, &[2])?;
                t
            }
            Style::KubeVip => {
                self.write_owner(to);
                let t = Instant::now();
                std::thread::sleep(Duration::from_millis(2));
                self.announce(to, &[1, 2])?;
                t
            }
            Style::MetalLb => {
                let t = Instant::now();
                self.announce(to, &[1, 2])?;
                // The status follows from another thread while the client
                // is watched from the first announcement on.
                let delay = Duration::from_millis(self.next_rand() % 501);
                let (api, node) = (self.bed.api.handle(), self.bed.nodes[to].name.clone());
                writer = Some(std::thread::spawn(move || {
                    std::thread::sleep(delay);
                    write_owner(&api, Style::MetalLb, &node, to);
                }));
                t
            }
        };
        self.owner = to;
        Ok((to, started, writer))
    }
}

/// Write "`node` (node `i` of the bed) owns web" the way `style`'s
/// announcer does.
fn write_owner(api: &ApiHandle, style: Style, node: &str, i: usize) {
    match style {
        Style::Cilium => api.apply(
            Resource::Leases,
            objects::cilium_lease("web", node, 60, "2026-11-30T10:00:00.000000Z"),
        ),
        Style::KubeVip => api.apply(
            Resource::Leases,
            objects::lease(
                "default",
                "kubevip-web",
                node,
                60,
                "2026-11-30T10:00:00.000000Z",
            ),
        ),
        Style::MetalLb => {
            let old = 1 - i;
            api.delete(Resource::L2Statuses, "metallb-system", &format!("l2-{old}"));
            api.apply(
                Resource::L2Statuses,
                objects::l2status("metallb-system", &format!("l2-{i}"), node, "default", "web"),
            );
        }
    }
}
