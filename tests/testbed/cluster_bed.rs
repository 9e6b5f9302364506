//! A two-node bed with a fake Kubernetes API server.
//!
//! ```text
//!  peer 198.51.100.1 ---+--- node-a eth0 198.51.100.11   kube-ipvs0: LB IPs
//!      (segment br0)    +--- node-b eth0 198.51.100.12   kube-ipvs0: LB IPs
//!  fake API 203.0.113.1:6443 (management br1) --- mgmt0 203.0.113.11 / .12
//! ```
//! Both bridges live in a "switch" namespace; nothing touches the root one.

use std::{
    net::{Ipv4Addr, SocketAddr},
    path::PathBuf,
    time::Duration,
};

use anyhow::Result;

use crate::{
    bed::TempDir,
    fake_api::FakeApi,
    netns::{kube_ipvs0, veth},
    wait_for, Daemon, Netns,
};

pub const PEER_IP: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 1);
pub const API: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::new(203, 0, 113, 1)), 6443);

pub struct Node {
    pub name: String,
    pub ns: Netns,
    pub mac: [u8; 6],
}

pub struct ClusterBed {
    pub api: FakeApi,
    pub kubeconfig: PathBuf,
    pub dir: TempDir,
    pub nodes: Vec<Node>,
    pub peer: Netns,
    _switch: Netns,
}

impl ClusterBed {
    /// Nodes `node-a`, `node-b`, each with `lb_ips` on its kube-ipvs0.
    pub fn new(tag: &str, lb_ips: &[Ipv4Addr]) -> Result<Self> {
        let switch = Netns::new(&format!("{tag}-sw"))?;
        for br in ["br0", "br1"] {
            switch.ip(&["link", "add", br, "type", "bridge"])?;
            switch.ip(&["link", "set", br, "up"])?;
        }
        switch.ip(&["addr", "add", "203.0.113.1/24", "dev", "br1"])?;
        let peer = Netns::new(&format!("{tag}-p"))?;
        veth(&peer, "eth0", &switch, "peer0")?;
        switch.ip(&["link", "set", "peer0", "master", "br0"])?;
        peer.ip(&["addr", "add", &format!("{PEER_IP}/24"), "dev", "eth0"])?;
        let mut nodes = Vec::new();
        for (i, name) in ["node-a", "node-b"].iter().enumerate() {
            let ns = Netns::new(&format!("{tag}-{}", &name[5..]))?;
            veth(&ns, "eth0", &switch, &format!("data{i}"))?;
            switch.ip(&["link", "set", &format!("data{i}"), "master", "br0"])?;
            veth(&ns, "mgmt0", &switch, &format!("mgmt{i}"))?;
            switch.ip(&["link", "set", &format!("mgmt{i}"), "master", "br1"])?;
            ns.ip(&[
                "addr",
                "add",
                &format!("198.51.100.{}/24", 11 + i),
                "dev",
                "eth0",
            ])?;
            ns.ip(&[
                "addr",
                "add",
                &format!("203.0.113.{}/24", 11 + i),
                "dev",
                "mgmt0",
            ])?;
            kube_ipvs0(&ns, lb_ips)?;
            let mac = ns.mac("eth0")?;
            nodes.push(Node {
                name: name.to_string(),
                ns,
                mac,
            });
        }
        for ns in nodes.iter().map(|n| &n.ns).chain([&peer, &switch]) {
            ns.sysctl("net.ipv6.conf.all.disable_ipv6", "1")?;
        }
        let api = FakeApi::start(&switch, API)?;
        let dir = TempDir::new(tag)?;
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(&kubeconfig, api.kubeconfig())?;
        Ok(ClusterBed {
            api,
            kubeconfig,
            dir,
            nodes,
            peer,
            _switch: switch,
        })
    }

    /// Start the guard on every node with `args` after the common ones, and
    /// wait for its first sync with the API.
    pub fn start(&self, args: &[&str]) -> Result<Vec<Daemon>> {
        (0..self.nodes.len())
            .map(|i| self.start_on(i, args, Duration::from_secs(20)))
            .collect()
    }

    /// Start the guard on node `i` and wait up to `sync` for its first sync.
    pub fn start_on(&self, i: usize, args: &[&str], sync: Duration) -> Result<Daemon> {
        let n = &self.nodes[i];
        let kc = self.kubeconfig.to_string_lossy().into_owned();
        let mut a = vec![
            "-i",
            "eth0",
            "--node-name",
            &n.name,
            "--kubeconfig",
            &kc,
            "--lb-ips-from",
            "kube-ipvs0",
        ];
        a.extend_from_slice(args);
        let d = Daemon::start(&n.ns, &a)?;
        if d.wait_log("initial sync from the Kubernetes API done", sync)
            .is_none()
        {
            anyhow::bail!("{} never synced:\n{}", n.name, d.log_text());
        }
        Ok(d)
    }

    /// Flush the peer's cache, make it resolve `ip`, return the node whose MAC it learned.
    pub fn who_answers(&self, ip: Ipv4Addr) -> Option<String> {
        let ip = ip.to_string();
        self.peer.flush_neigh("eth0").ok()?;
        self.peer.poke(&ip).ok()?;
        let mac = wait_for(Duration::from_secs(3), || {
            self.peer.cached_mac("eth0", &ip).ok().flatten()
        })?;
        Some(
            self.nodes
                .iter()
                .find(|n| n.mac == mac)
                .map_or_else(|| format!("{mac:?}"), |n| n.name.clone()),
        )
    }

    /// Poll `who_answers` until it gives `want` (ownership changes take a moment to arrive).
    pub fn wait_answer(
        &self,
        ip: Ipv4Addr,
        want: Option<&str>,
        timeout: Duration,
    ) -> Option<String> {
        let mut last = None;
        let ok = wait_for(timeout, || {
            last = self.who_answers(ip);
            (last.as_deref() == want).then_some(())
        });
        if ok.is_some() {
            None
        } else {
            Some(format!(
                "wanted {want:?}, the neighbour last learned {last:?}"
            ))
        }
    }
}
