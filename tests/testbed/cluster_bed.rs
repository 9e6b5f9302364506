//! A two-node bed with a fake Kubernetes API server.
//!
//! ```text
//!  peer 198.51.100.1 ---+--- node-a eth0 198.51.100.11   kube-ipvs0: LB IPs
//!      (segment br0)    +--- node-b eth0 198.51.100.12   kube-ipvs0: LB IPs
//!  fake API 203.0.113.1:6443 (management br1) --- mgmt0 203.0.113.11 / .12
//! ```
//! Both bridges live in a "switch" namespace; nothing touches the root one.
//!
//! The guard reads the API through `--kubeconfig` (plain HTTP), or with the
//! in-cluster configuration a pod has ([`ServiceAccount`]).

use std::{
    net::{Ipv4Addr, SocketAddr},
    path::PathBuf,
    time::Duration,
};

use anyhow::Result;

use crate::{
    bed::TempDir,
    fake_api::FakeApi,
    kubelet::Kubelet,
    netns::{kube_ipvs0, veth},
    wait_for, Daemon, Netns,
};

pub const PEER_IP: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 1);
/// The namespace of the presence Leases in the beds' tests.
pub const PRESENCE_NS: &str = "arp-guard";
/// Cilium's Leases as the ownership source and presence renewed every
/// second in [`PRESENCE_NS`]: what the presence and probing tests start with.
pub const CILIUM_PRESENCE_ARGS: &[&str] = &[
    "--announcer",
    "cilium",
    "--presence-period",
    "1s",
    "--presence-namespace",
    PRESENCE_NS,
];
/// The renewTime of the Leases a bed starts with ([`ClusterBed::cilium_service`]).
pub const LEASE_RENEWED: &str = "2026-11-30T10:00:00.000000Z";
pub const API: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::new(203, 0, 113, 1)), 6443);

pub struct Node {
    pub name: String,
    pub ns: Netns,
    pub mac: [u8; 6],
}

/// How often the bed's kubelet probes each guard's readiness (the
/// DaemonSet's own readinessProbe: 5 s; tests want liveness to follow soon).
pub const KUBELET_EVERY: Duration = Duration::from_secs(1);

pub struct ClusterBed {
    /// Each node's guard Pod, Ready as its `/readyz` says (first field:
    /// dropped, its threads joined, before the namespaces go).
    pub kubelet: Kubelet,
    pub api: FakeApi,
    pub kubeconfig: PathBuf,
    pub dir: TempDir,
    pub nodes: Vec<Node>,
    pub peer: Netns,
    /// The segment's bridges, and the API server on the management one
    /// (203.0.113.1): where an operator's laptop reaches the API.
    pub switch: Netns,
    /// `--interface` of the guards it starts (`eth0`; `auto` to let them choose).
    pub uplinks: String,
}

impl ClusterBed {
    /// `arp-guard doctor -o json` on node `i` with `kubeconfig`: what it
    /// printed (stdout, then stderr), whatever its exit.
    pub fn doctor(&self, i: usize, kubeconfig: &std::path::Path) -> String {
        let bin = crate::guard_binary();
        let out = self.nodes[i]
            .ns
            .exec_output(&[
                bin.to_str().unwrap(),
                "doctor",
                "-o",
                "json",
                "--kubeconfig",
                &kubeconfig.to_string_lossy(),
            ])
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
    }

    /// Nodes `node-a`, `node-b`, each with `lb_ips` on its kube-ipvs0; the
    /// API speaks plain HTTP.
    pub fn new(tag: &str, lb_ips: &[Ipv4Addr]) -> Result<Self> {
        Self::with_api(tag, lb_ips, |switch| FakeApi::start(switch, API))
    }

    /// The same with `n` nodes (at most 3: `node-a`, `node-b`, `node-c`,
    /// on 198.51.100.11, .12, .13).
    pub fn with_nodes(tag: &str, lb_ips: &[Ipv4Addr], n: usize) -> Result<Self> {
        let names = &["node-a", "node-b", "node-c"][..n];
        Self::build(tag, names, lb_ips, |switch| FakeApi::start(switch, API))
    }

    /// The same with the API `start` makes in the switch namespace (listening on [`API`]).
    pub fn with_api(
        tag: &str,
        lb_ips: &[Ipv4Addr],
        start: impl FnOnce(&Netns) -> Result<FakeApi>,
    ) -> Result<Self> {
        Self::build(tag, &["node-a", "node-b"], lb_ips, start)
    }

    /// `n` nodes `node-00`, `node-01`, ... (at most 40), plain HTTP: a fleet.
    pub fn fleet(tag: &str, n: usize, lb_ips: &[Ipv4Addr]) -> Result<Self> {
        anyhow::ensure!(n <= 40, "a fleet bed has at most 40 nodes");
        let names: Vec<String> = (0..n).map(|i| format!("node-{i:02}")).collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        Self::build(tag, &names, lb_ips, |switch| FakeApi::start(switch, API))
    }

    fn build(
        tag: &str,
        names: &[&str],
        lb_ips: &[Ipv4Addr],
        start: impl FnOnce(&Netns) -> Result<FakeApi>,
    ) -> Result<Self> {
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
        for (i, name) in names.iter().enumerate() {
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
        let api = start(&switch)?;
        // Every node has its Node object, as in any cluster (its UID owns
        // the node's ArpGuardNode; its InternalIP is on eth0).
        for (i, n) in nodes.iter().enumerate() {
            let ip = format!("198.51.100.{}", 11 + i);
            let node = crate::fake_api::objects::node_with_ips(&n.name, &[&ip]);
            api.apply(crate::fake_api::Resource::Nodes, node);
        }
        let dir = TempDir::new(tag)?;
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(&kubeconfig, api.kubeconfig())?;
        let probed: Vec<(String, String)> = (nodes.iter())
            .map(|n| (n.name.clone(), n.ns.name.clone()))
            .collect();
        Ok(ClusterBed {
            kubelet: Kubelet::start(api.handle(), PRESENCE_NS, &probed, KUBELET_EVERY),
            api,
            kubeconfig,
            dir,
            nodes,
            peer,
            switch,
            uplinks: "eth0".into(),
        })
    }

    /// Start the guard on every node with `args` after the common ones, and
    /// wait for its first sync with the API.
    pub fn start(&self, args: &[&str]) -> Result<Vec<Daemon>> {
        self.start_wrapped(&[], args)
    }

    /// [`Self::start`] under `wrapper` (e.g. the DaemonSet's privileges).
    pub fn start_wrapped(&self, wrapper: &[String], args: &[&str]) -> Result<Vec<Daemon>> {
        (0..self.nodes.len())
            .map(|i| self.start_on_wrapped(i, wrapper, args, Duration::from_secs(20)))
            .collect()
    }

    /// Start the guard on node `i` and wait up to `sync` for its first sync.
    pub fn start_on(&self, i: usize, args: &[&str], sync: Duration) -> Result<Daemon> {
        self.start_build_on(i, &crate::guard_binary(), args, sync)
    }

    /// The same with another build of the daemon (a bench's baseline).
    pub fn start_build_on(
        &self,
        i: usize,
        binary: &std::path::Path,
        args: &[&str],
        sync: Duration,
    ) -> Result<Daemon> {
        self.start_as(i, &[], binary, args, sync)
    }

    /// [`Self::start_on`] under `wrapper`.
    pub fn start_on_wrapped(
        &self,
        i: usize,
        wrapper: &[String],
        args: &[&str],
        sync: Duration,
    ) -> Result<Daemon> {
        self.start_as(i, wrapper, &crate::guard_binary(), args, sync)
    }

    /// Start `binary` on node `i` under `wrapper`; wait up to `sync` for its
    /// first sync.
    fn start_as(
        &self,
        i: usize,
        wrapper: &[String],
        binary: &std::path::Path,
        args: &[&str],
        sync: Duration,
    ) -> Result<Daemon> {
        let n = &self.nodes[i];
        let kc = self.kubeconfig.to_string_lossy().into_owned();
        let mut a = vec![
            "-i",
            &self.uplinks,
            "--node-name",
            &n.name,
            "--kubeconfig",
            &kc,
            "--lb-ips-from",
            "kube-ipvs0",
        ];
        a.extend_from_slice(args);
        let d = Daemon::start_build_wrapped(&n.ns, wrapper, binary, &a)?;
        if d.wait_log("initial sync from the Kubernetes API done", sync)
            .is_none()
        {
            anyhow::bail!("{} never synced:\n{}", n.name, d.log_text());
        }
        Ok(d)
    }

    /// Start the guard on node `i` as a pod would run it: no --kubeconfig,
    /// the API from `KUBERNETES_SERVICE_HOST`/`_PORT`, the token and CA from
    /// `sa`; wait up to `sync` for its first sync.
    pub fn start_incluster_on(
        &self,
        i: usize,
        sa: &ServiceAccount,
        args: &[&str],
        sync: Duration,
    ) -> Result<Daemon> {
        let d = self.spawn_incluster_on(i, sa, args)?;
        if d.wait_log("initial sync from the Kubernetes API done", sync)
            .is_none()
        {
            anyhow::bail!("{} never synced:\n{}", self.nodes[i].name, d.log_text());
        }
        Ok(d)
    }

    /// The same without waiting for a sync (only until it enforces).
    pub fn spawn_incluster_on(
        &self,
        i: usize,
        sa: &ServiceAccount,
        args: &[&str],
    ) -> Result<Daemon> {
        let n = &self.nodes[i];
        let mut a = vec![
            "-i",
            &self.uplinks,
            "--node-name",
            &n.name,
            "--lb-ips-from",
            "kube-ipvs0",
        ];
        a.extend_from_slice(args);
        Daemon::start_wrapped(&n.ns, &sa.wrapper(self.api.addr), &a)
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

    /// A Service `default/<name>` on `ips`, announced as Cilium does: its
    /// Lease ([`objects::cilium_lease`]) held by `holder` for `lease_secs`,
    /// renewed at [`LEASE_RENEWED`].
    ///
    /// [`objects::cilium_lease`]: crate::fake_api::objects::cilium_lease
    pub fn cilium_service(&self, name: &str, ips: &[&str], holder: &str, lease_secs: i32) {
        use crate::fake_api::{objects, Resource};
        self.api
            .apply(Resource::Services, objects::service("default", name, ips));
        self.api.apply(
            Resource::Leases,
            objects::cilium_lease(name, holder, lease_secs, LEASE_RENEWED),
        );
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

/// Fail with the reason [`ClusterBed::wait_answer`] gave, if any.
pub fn check(r: Option<String>) {
    if let Some(why) = r {
        panic!("{why}");
    }
}

/// Where a pod finds its service account.
pub const SA_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// The files a pod finds in [`SA_DIR`] (`token`, `ca.crt`, `namespace`),
/// kept in a test directory. The guard sees them through a private mount
/// namespace of its own, in which that directory is bind-mounted over `/run`
/// (`/var/run` is a symlink to it): the host's `/run` is left alone, and the
/// test can rewrite the files while the guard runs.
pub struct ServiceAccount {
    /// Mounted over /run for the guard.
    run: PathBuf,
}

impl ServiceAccount {
    /// In `dir` (which the caller keeps), with `token` and CA `ca_pem`.
    pub fn new(dir: &std::path::Path, token: &str, ca_pem: &str) -> Result<Self> {
        let run = dir.join("run");
        let sa = ServiceAccount { run };
        std::fs::create_dir_all(sa.dir())?;
        sa.write("namespace", "kube-system")?;
        sa.write_ca(ca_pem)?;
        sa.write_token(token)?;
        Ok(sa)
    }

    /// The directory the guard sees as [`SA_DIR`].
    pub fn dir(&self) -> PathBuf {
        self.run.join("secrets/kubernetes.io/serviceaccount")
    }

    /// Replace the token, atomically as the kubelet does (no newline: the
    /// kubelet writes none, and a header cannot hold one).
    pub fn write_token(&self, token: &str) -> Result<()> {
        self.write("token", token)
    }

    pub fn write_ca(&self, pem: &str) -> Result<()> {
        self.write("ca.crt", pem)
    }

    fn write(&self, name: &str, content: &str) -> Result<()> {
        Ok(crate::replace_file(&self.dir().join(name), content)?)
    }

    /// The command that runs the guard as a pod would: a clean environment
    /// for the client's configuration (no KUBECONFIG, a HOME without
    /// ~/.kube), the service's address, and a private mount namespace in
    /// which the service account's files appear.
    fn wrapper(&self, api: std::net::SocketAddr) -> Vec<String> {
        let run = self.run.to_string_lossy().into_owned();
        let home = self.run.join("home").to_string_lossy().into_owned();
        [
            "env",
            "-u",
            "KUBECONFIG",
            &format!("HOME={home}"),
            &format!("KUBERNETES_SERVICE_HOST={}", api.ip()),
            &format!("KUBERNETES_SERVICE_PORT={}", api.port()),
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            // Over /run: /var/run is a symlink to it, and /run/secrets does
            // not exist on the host to mount over.
            r#"mount --bind "$1" /run && shift && exec "$@""#,
            "sh",
            &run,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    }
}
