//! Every check on fixture trees: a procfs and sysfs in a tempdir, the
//! addresses as netlink would report them, the guard as its API or pins
//! would show it. The helpers are here, the scenarios in the files below.

mod scenarios_arp;
mod scenarios_guard;
mod scenarios_ipv6;
mod scenarios_path;

use std::path::PathBuf;

use serde_json::json;

use super::{
    gathered::{default_uplinks, Gathered, Plan},
    guard_view::{Chain, GuardView},
    ipv6_view::Ipv6View,
    kube_proxy::KubeProxy,
    node::Node,
    run_checks, Check, CheckStatus,
};
use crate::{
    api::types::StatusDoc,
    datapath::inspect::{NetlinkFilter, Pinned},
    model::addrs::{AddrTable, IfAddrV4},
};

pub const LB: [&str; 3] = ["198.51.100.101", "198.51.100.102", "198.51.100.103"];

/// A node like the test bed's: eth0 on 198.51.100.0/24 (the LAN), eth1 on
/// 203.0.113.0/25, kube-ipvs0 with three LB IPs; kernel defaults.
pub fn tree() -> Tree {
    let t = Tree::new("doctor");
    for (name, index) in [("lo", 1), ("eth0", 2), ("eth1", 3), ("kube-ipvs0", 4)] {
        t.iface(name, index);
    }
    for key in ["arp_ignore", "arp_announce", "rp_filter"] {
        t.conf("all", key, "0");
    }
    t.conf("all", "forwarding", "1");
    t.write("proc/sys/net/ipv4/ip_forward", "1\n");
    t.write("proc/sys/kernel/osrelease", "6.8.0-45-generic\n");
    t.write(
        "proc/mounts",
        "sysfs /sys sysfs rw 0 0\nbpf /sys/fs/bpf bpf rw 0 0\n",
    );
    t.routes(&[
        ("eth0", "198.51.100.0/24", None, 0),
        ("eth1", "203.0.113.0/25", None, 0),
        ("eth1", "203.0.113.128/25", Some("203.0.113.1"), 0),
    ]);
    t
}

pub fn addrs(extra: &[(&str, &str, u8)]) -> AddrTable {
    let mut t = AddrTable::default();
    let base = [
        ("lo", "127.0.0.1", 8),
        ("eth0", "198.51.100.11", 24),
        ("eth1", "203.0.113.11", 25),
    ];
    let lb = LB.map(|a| ("kube-ipvs0", a, 32));
    for (i, name) in ["lo", "eth0", "eth1", "kube-ipvs0"].iter().enumerate() {
        t.links.insert((*name).to_owned(), i as u32 + 1);
    }
    for (name, a, prefix) in base.iter().chain(lb.iter()).chain(extra.iter()) {
        let index = t.links[*name];
        t.v4.entry(index).or_default().push(IfAddrV4 {
            addr: a.parse().unwrap(),
            prefix: *prefix,
            secondary: false,
        });
    }
    t
}

/// The guard as its API shows it: `mode`, attached to `ifaces`, with `ips`
/// (the first owned, the others foreign).
pub fn api_guard(mode: &str, ifaces: &[&str], ips: &[&str]) -> GuardView {
    let states: Vec<(&str, &str)> = ips
        .iter()
        .enumerate()
        .map(|(n, ip)| (*ip, if n == 0 { "owned" } else { "foreign" }))
        .collect();
    api_guard_states(mode, ifaces, &states)
}

/// The same with each IP's state given: (ip, owned|foreign|unknown).
pub fn api_guard_states(mode: &str, ifaces: &[&str], ips: &[(&str, &str)]) -> GuardView {
    let doc = json!({
        "node": "node-a", "mode": mode,
        "interfaces": ifaces.iter().map(|i| json!({"name": i, "state": "attached", "detail": "tcx"})).collect::<Vec<_>>(),
        "lb_ips": {"total": ips.len(), "owned": ips.len().min(1), "foreign": ips.len().saturating_sub(1), "unknown": 0},
        "not_enforced": 0, "map_memory_bytes": 0, "feed": null,
        "ready": true, "not_ready": [],
        "ips": ips.iter().map(|(ip, state)| json!({
            "ip": ip, "state": state, "source": "file",
            "since_unix": 0, "on_interfaces": [], "counters": {}
        })).collect::<Vec<_>>(),
    });
    let status: StatusDoc = serde_json::from_value(doc).unwrap();
    let chains = ifaces
        .iter()
        .map(|i| {
            let chain = Chain {
                tcx: Ok(vec!["arp_guard_egres".into()]),
                netlink: Ok(vec![]),
            };
            (i.to_string(), chain)
        })
        .collect();
    GuardView {
        api: "127.0.0.1:9477".into(),
        pin_dir: "/sys/fs/bpf/arp-guard".into(),
        status: Some(status),
        chains,
        ..Default::default()
    }
}

pub fn no_guard() -> GuardView {
    GuardView {
        api: "127.0.0.1:9477".into(),
        pin_dir: "/sys/fs/bpf/arp-guard".into(),
        tried: vec!["connection refused".into()],
        ..Default::default()
    }
}

pub fn facts(t: &Tree, addrs: AddrTable, guard: GuardView) -> Gathered {
    let mut node = Node::read(&t.proc(), &t.sys());
    node.read_conf(["eth0", "eth1"]);
    Gathered {
        node,
        addrs: Ok(addrs),
        guard,
        kube_proxy: KubeProxy::Found {
            mode: "ipvs".into(),
            strict_arp: false,
        },
        ipv6: Ok(Ipv6View {
            addrs: Vec::new(),
            proxies: Ok(Vec::new()),
        }),
    }
}

pub fn plan(uplinks: &[&str], clients: &[&str]) -> Plan {
    Plan {
        uplinks: uplinks.iter().map(|u| u.to_string()).collect(),
        uplinks_from: "--interface".into(),
        lb_ifaces: vec!["kube-ipvs0".into()],
        clients: clients.iter().map(|c| c.parse().unwrap()).collect(),
        pin_dir: "/sys/fs/bpf/arp-guard".into(),
    }
}

#[track_caller]
pub fn find<'a>(checks: &'a [Check], name: &str, subject: Option<&str>) -> &'a Check {
    checks
        .iter()
        .find(|c| c.check == name && c.subject.as_deref() == subject)
        .unwrap_or_else(|| panic!("no {name} {subject:?} in {checks:#?}"))
}

#[track_caller]
pub fn status(checks: &[Check], name: &str, subject: Option<&str>) -> CheckStatus {
    find(checks, name, subject).status
}

pub struct Tree {
    pub root: PathBuf,
}

impl Tree {
    pub fn new(tag: &str) -> Self {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let root =
            std::env::temp_dir().join(format!("arp-guard-doctor-{}-{n}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("proc/sys/kernel")).unwrap();
        std::fs::create_dir_all(root.join("sys/class/net")).unwrap();
        Tree { root }
    }
    pub fn proc(&self) -> PathBuf {
        self.root.join("proc")
    }
    pub fn sys(&self) -> PathBuf {
        self.root.join("sys")
    }
    pub fn write(&self, rel: &str, text: &str) -> &Self {
        let p = self.root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
        self
    }
    /// `conf/<iface>/<key>` = value.
    pub fn conf(&self, iface: &str, key: &str, v: &str) -> &Self {
        self.write(
            &format!("proc/sys/net/ipv4/conf/{iface}/{key}"),
            &format!("{v}\n"),
        )
    }
    /// `ipv6/conf/<iface>/<key>` = value.
    pub fn conf6(&self, iface: &str, key: &str, v: &str) -> &Self {
        self.write(
            &format!("proc/sys/net/ipv6/conf/{iface}/{key}"),
            &format!("{v}\n"),
        )
    }
    /// An interface in sysfs, and its conf directory with kernel defaults.
    pub fn iface(&self, name: &str, index: u32) -> &Self {
        self.write(
            &format!("sys/class/net/{name}/ifindex"),
            &format!("{index}\n"),
        );
        for key in super::node::CONF_KEYS {
            let p = format!("proc/sys/net/ipv4/conf/{name}/{key}");
            if !self.root.join(&p).exists() {
                self.write(&p, if key == "forwarding" { "1\n" } else { "0\n" });
            }
        }
        self
    }
    /// `/proc/net/route` from (iface, dst/prefix, gateway, metric).
    pub fn routes(&self, routes: &[(&str, &str, Option<&str>, u32)]) -> &Self {
        let word = |ip: std::net::Ipv4Addr| format!("{:08X}", u32::from_ne_bytes(ip.octets()));
        let mut text =
            "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n"
                .to_owned();
        for (iface, net, gw, metric) in routes {
            let (dst, len) = net.split_once('/').unwrap();
            let len: u32 = len.parse().unwrap();
            let mask = u32::MAX.checked_shl(32 - len).unwrap_or(0);
            let flags = if gw.is_some() { 3 } else { 1 };
            let gw = gw.map_or(std::net::Ipv4Addr::UNSPECIFIED, |g| g.parse().unwrap());
            text += &format!(
                "{iface}\t{}\t{}\t{flags:04X}\t0\t0\t{metric}\t{}\t0\t0\t0\n",
                word(dst.parse().unwrap()),
                word(gw),
                word(mask.into())
            );
        }
        self.write("proc/net/route", &text)
    }
    pub fn path(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }
}

impl Drop for Tree {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// The DaemonSet's ServiceAccount may read exactly the ConfigMap doctor
/// reads: get, that one object, in its namespace.
#[test]
fn rbac_lets_doctor_read_kube_proxys_configmap_and_nothing_more() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy");
    let rbac = std::fs::read_to_string(root.join("base/rbac.yaml")).unwrap();
    let docs: Vec<serde_json::Value> = serde_saphyr::from_str_multiple(&rbac).unwrap();
    // (The other Role, presence's, is in the guard's own namespace: tests/manifests.rs.)
    let roles: Vec<&serde_json::Value> = (docs.iter())
        .filter(|d| d["kind"] == "Role" && d["metadata"]["name"] == "arp-guard-doctor")
        .collect();
    assert_eq!(roles.len(), 1, "{roles:#?}");
    let role = roles[0];
    assert_eq!(role["metadata"]["namespace"], super::kube_proxy::NAMESPACE);
    assert_eq!(
        role["rules"],
        json!([{
            "apiGroups": [""],
            "resources": ["configmaps"],
            "resourceNames": [super::kube_proxy::NAME],
            "verbs": ["get"],
        }])
    );
    let binding = docs
        .iter()
        .find(|d| d["kind"] == "RoleBinding")
        .expect("a RoleBinding");
    assert_eq!(
        binding["metadata"]["namespace"],
        super::kube_proxy::NAMESPACE
    );
    assert_eq!(binding["roleRef"]["name"], role["metadata"]["name"]);
    assert_eq!(binding["subjects"][0]["name"], "arp-guard");
    assert_eq!(binding["subjects"][0]["namespace"], "arp-guard");
}
