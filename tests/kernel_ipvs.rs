//! kube-proxy's IPVS mode as it is on a node: `kube-ipvs0` a real dummy
//! device holding every LB IP, IPVS virtual services on those IPs, the
//! kernel answering ARP for all of them (arp_ignore=0). The guard, fed by
//! `--lb-ips-from kube-ipvs0` and the ownership file, keeps the neighbour
//! from learning the node for the VIPs it does not own, follows Services
//! that kube-proxy adds and removes, and lets connections to an owned VIP
//! through IPVS. Needs dummy and ip_vs: runs in `cargo xtask vm-test`.

use std::{
    io::Read as _,
    net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream},
    time::Duration,
};

use testbed::{
    bed::{default_owners, Bed, FOREIGN, NODE_IP, OTHER, OWNED, UNKNOWN},
    kernel, wait_until,
};

const PORT: u16 = 80;
const BACKEND_PORT: u16 = 8080;
/// A Service kube-proxy adds while the guard runs.
const ADDED: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 120);

/// kube-proxy's part for one Service: the VIP on kube-ipvs0 (unless there)
/// and a virtual service with the node's backend as its real server.
fn add_service(bed: &Bed, vip: Ipv4Addr) {
    let vs = format!("{vip}:{PORT}");
    bed.node
        .exec(&["ipvsadm", "-A", "-t", &vs, "-s", "rr"])
        .unwrap();
    let rs = format!("{NODE_IP}:{BACKEND_PORT}");
    bed.node
        .exec(&["ipvsadm", "-a", "-t", &vs, "-r", &rs, "-m"])
        .unwrap();
}

fn explain_is_lb(bed: &Bed, ip: Ipv4Addr) -> bool {
    let out = bed
        .node
        .exec(&[
            testbed::guard_binary().to_str().unwrap(),
            "explain",
            &ip.to_string(),
            "-o",
            "json",
        ])
        .unwrap();
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    v["lb_ip"] == true
}

fn connect_greeting(bed: &Bed, vip: Ipv4Addr) -> Option<String> {
    bed.peer
        .enter(move || {
            let addr = SocketAddr::from((vip, PORT));
            let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_secs(3)) else {
                return Ok(None);
            };
            s.set_read_timeout(Some(Duration::from_secs(3)))?;
            let mut buf = String::new();
            let _ = s.read_to_string(&mut buf);
            Ok(Some(buf))
        })
        .unwrap()
}

#[test]
fn ipvs_vips_on_a_real_kube_ipvs0_are_guarded_and_followed() {
    testbed::require_root();
    if !kernel::require("dummy devices", kernel::has_link_kind("dummy"))
        || !kernel::require("IPVS", kernel::has_ipvs())
    {
        return;
    }
    let bed = Bed::new("ipvs").unwrap();
    let link = bed.node.ip(&["-d", "link", "show", "kube-ipvs0"]).unwrap();
    assert!(link.contains("dummy"), "kube-ipvs0 is a real dummy: {link}");
    for vip in [OWNED, FOREIGN, UNKNOWN] {
        add_service(&bed, vip);
    }
    // The backend: a pod on this node, reached through IPVS's NAT.
    let listener = bed
        .node
        .enter(|| Ok(TcpListener::bind((NODE_IP, BACKEND_PORT))?))
        .unwrap();
    std::thread::spawn(move || {
        for s in listener.incoming().flatten() {
            let mut s = s;
            let _ = std::io::Write::write_all(&mut s, b"backend\n");
        }
    });

    // Without the guard: the node's kernel answers for every VIP.
    let node = Some(bed.node_mac);
    let learned = bed.peer_learns(&[OWNED, FOREIGN, UNKNOWN]).unwrap();
    assert_eq!(
        learned,
        vec![node; 3],
        "the incident: every VIP -> this node"
    );

    let _daemon = bed.start(&[]).unwrap();
    let learned = bed.peer_learns(&[OWNED, FOREIGN, UNKNOWN]).unwrap();
    assert_eq!(learned, vec![node, None, None], "only the owned VIP");
    // The owned VIP serves through IPVS.
    assert_eq!(
        connect_greeting(&bed, OWNED).as_deref(),
        Some("backend\n"),
        "a connection to the owned VIP through IPVS"
    );
    assert!(bed.packets(FOREIGN, "reply", "kernel", "dropped").unwrap() >= 1);

    // kube-proxy adds a Service whose VIP another node announces.
    std::fs::write(
        &bed.owners,
        format!("{}  - ip: {ADDED}\n    owner: {OTHER}\n", default_owners()),
    )
    .unwrap();
    bed.node
        .ip(&["addr", "add", &format!("{ADDED}/32"), "dev", "kube-ipvs0"])
        .unwrap();
    add_service(&bed, ADDED);
    assert!(
        wait_until(Duration::from_secs(5), || explain_is_lb(&bed, ADDED)),
        "the guard follows the new VIP on kube-ipvs0"
    );
    assert_eq!(bed.peer_learns(&[ADDED]).unwrap(), vec![None]);

    // The VIP moves here: the ownership file says so, the neighbour learns it.
    std::fs::write(
        &bed.owners,
        format!(
            "{}  - ip: {ADDED}\n    owner: {}\n",
            default_owners(),
            testbed::bed::NODE
        ),
    )
    .unwrap();
    assert!(wait_until(Duration::from_secs(5), || {
        bed.peer_learns(&[ADDED]).unwrap() == vec![node]
    }));
    assert_eq!(connect_greeting(&bed, ADDED).as_deref(), Some("backend\n"));

    // kube-proxy removes the Service: the VIP leaves kube-ipvs0 and the LB set.
    bed.node
        .exec(&["ipvsadm", "-D", "-t", &format!("{ADDED}:{PORT}")])
        .unwrap();
    bed.node
        .ip(&["addr", "del", &format!("{ADDED}/32"), "dev", "kube-ipvs0"])
        .unwrap();
    std::fs::write(&bed.owners, default_owners()).unwrap();
    assert!(
        wait_until(Duration::from_secs(5), || !explain_is_lb(&bed, ADDED)),
        "the guard forgets the removed VIP"
    );
    assert_eq!(
        bed.peer_learns(&[ADDED]).unwrap(),
        vec![None],
        "nobody answers"
    );
}
