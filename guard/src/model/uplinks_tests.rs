use std::net::Ipv4Addr;

use super::*;
use crate::model::addrs::{Device, IfAddrV4, RouteKey};

/// A node's links: (name, ifindex, kind as `ip -d link` says, controller).
fn table(links: &[(&str, u32, Option<&str>, Option<u32>)]) -> AddrTable {
    let mut t = AddrTable::default();
    for (name, i, kind, controller) in links {
        t.links.insert((*name).into(), *i);
        t.devices.insert(
            *i,
            Device {
                kind: DeviceKind::from_kind(*kind),
                controller: *controller,
                ether: !matches!(*kind, Some("wireguard" | "ipip")) && *name != "lo",
                loopback: *name == "lo",
                up: true,
                carrier: true,
            },
        );
    }
    t
}

fn route(t: &mut AddrTable, v6: bool, metric: u32, oifs: &[u32]) {
    let key = RouteKey {
        v6,
        table: 254,
        metric,
    };
    t.default_routes.insert(key, oifs.to_vec());
}

fn addr(t: &mut AddrTable, i: u32, ip: [u8; 4]) {
    t.v4.entry(i).or_default().push(IfAddrV4 {
        addr: Ipv4Addr::from(ip),
        prefix: 24,
        secondary: false,
    });
}

fn auto() -> Ask {
    Ask::new(&[AUTO.into()], &["kube-ipvs0".into()])
}

fn pick(ask: &Ask, t: &AddrTable, h: &Hints) -> Choice {
    choose(ask, t, h, &Choice::default())
}

fn names(c: &Choice) -> Vec<&str> {
    c.uplinks.keys().map(String::as_str).collect()
}

/// A bare-metal node with the usual company: Pods' veths, a CNI bridge,
/// Docker's, Cilium's and Flannel's devices, kube-ipvs0, a WireGuard link.
fn crowded() -> AddrTable {
    let mut t = table(&[
        ("lo", 1, None, None),
        ("eno1", 2, None, None),
        ("eno2", 3, None, None),
        ("kube-ipvs0", 4, Some("dummy"), None),
        ("cni0", 5, Some("bridge"), None),
        ("veth1a2b", 6, Some("veth"), Some(5)),
        ("lxc12ab", 7, Some("veth"), None),
        ("cilium_host", 8, Some("veth"), None),
        ("cilium_vxlan", 9, Some("vxlan"), None),
        ("flannel.1", 10, Some("vxlan"), None),
        ("docker0", 11, Some("bridge"), None),
        ("wg0", 12, Some("wireguard"), None),
    ]);
    addr(&mut t, 2, [203, 0, 113, 10]);
    addr(&mut t, 5, [10, 244, 0, 1]);
    route(&mut t, false, 0, &[2]);
    t
}

#[test]
fn the_default_route_s_nic_and_nothing_of_the_cni() {
    let t = crowded();
    let c = pick(&auto(), &t, &Hints::default());
    assert_eq!(names(&c), ["eno1"]);
    assert_eq!(c.uplinks["eno1"].why, [Why::DefaultRoute]);
    assert_eq!(c.uplinks["eno1"].because(), "default route");
    assert!(c.none_found.is_none());
}

#[test]
fn the_node_ip_s_device_and_the_announcers_interfaces_join_it() {
    let mut t = crowded();
    addr(&mut t, 3, [198, 51, 100, 2]);
    let h = Hints {
        node_ips: Some(vec!["198.51.100.2".parse().unwrap()]),
        named: vec![Named {
            by: "L2Advertisement metallb-system/lan".into(),
            rules: vec![NameRule::Exact("eno2".into())],
        }],
    };
    let c = pick(&auto(), &t, &h);
    assert_eq!(names(&c), ["eno1", "eno2"]);
    assert_eq!(
        c.uplinks["eno2"].because(),
        "holds the node's address 198.51.100.2; named by L2Advertisement metallb-system/lan"
    );
}

#[test]
fn cilium_s_regexes_match_anywhere_in_the_name_as_go_does_and_exclusions_still_hold() {
    let t = crowded();
    let h = Hints {
        node_ips: None,
        named: vec![Named {
            by: "CiliumL2AnnouncementPolicy lan".into(),
            rules: vec![NameRule::Regex(regex::Regex::new("^eno[0-9]+").unwrap())],
        }],
    };
    let c = pick(&auto(), &t, &h);
    assert_eq!(names(&c), ["eno1", "eno2"]);
    // "c" matches cilium_host, cni0, docker0, lxc12ab ...: none of them is taken.
    let h = Hints {
        node_ips: None,
        named: vec![Named {
            by: "CiliumL2AnnouncementPolicy all".into(),
            rules: vec![NameRule::Regex(regex::Regex::new("c").unwrap())],
        }],
    };
    let c = pick(&auto(), &t, &h);
    assert_eq!(names(&c), ["eno1"]);
    assert!(c.left_out["cilium_host"].contains("cilium_*"));
    assert!(c.left_out["lxc12ab"].contains("lxc*"));
}

#[test]
fn a_bond_is_guarded_rather_than_its_slaves() {
    let mut t = table(&[
        ("eno1", 2, None, Some(4)),
        ("eno2", 3, None, Some(4)),
        ("bond0", 4, Some("bond"), None),
        ("bond0.100", 5, Some("vlan"), None),
    ]);
    addr(&mut t, 5, [198, 51, 100, 2]);
    route(&mut t, false, 0, &[5]);
    let h = Hints {
        node_ips: Some(vec!["198.51.100.2".parse().unwrap()]),
        named: vec![Named {
            by: "L2Advertisement metallb-system/lan".into(),
            rules: vec![NameRule::Exact("eno1".into())],
        }],
    };
    let c = pick(&auto(), &t, &h);
    // The VLAN device holds the address and the route: taken itself. The
    // slave MetalLB names is lifted to its bond.
    assert_eq!(names(&c), ["bond0", "bond0.100"]);
    assert_eq!(
        c.uplinks["bond0"].because(),
        "upper device of eno1 (named by L2Advertisement metallb-system/lan)"
    );
}

#[test]
fn a_bridge_holding_the_node_ip_is_taken_a_cni_s_is_not() {
    let mut t = table(&[
        ("eno1", 2, None, Some(3)),
        ("br0", 3, Some("bridge"), None),
        ("cni0", 4, Some("bridge"), None),
    ]);
    addr(&mut t, 3, [198, 51, 100, 2]);
    addr(&mut t, 4, [10, 244, 0, 1]);
    let h = Hints {
        node_ips: Some(vec!["198.51.100.2".parse().unwrap()]),
        named: Vec::new(),
    };
    assert_eq!(names(&pick(&auto(), &t, &h)), ["br0"]);
}

#[test]
fn a_veth_counts_only_where_more_than_an_address_points_at_it() {
    // eth0: a node in a container (kind); vethab: a Pod's, with an address.
    let mut t = table(&[
        ("eth0", 2, Some("veth"), None),
        ("vethab", 3, Some("veth"), None),
    ]);
    addr(&mut t, 2, [198, 51, 100, 9]);
    addr(&mut t, 3, [203, 0, 113, 9]);
    let none = Hints::default();
    assert!(pick(&auto(), &t, &none).uplinks.is_empty());
    // Its default route.
    route(&mut t, false, 100, &[2]);
    assert_eq!(names(&pick(&auto(), &t, &none)), ["eth0"]);
    t.default_routes.clear();
    // The Node's address on it (a test bed's or a VM's node).
    let node = Hints {
        node_ips: Some(vec!["198.51.100.9".parse().unwrap()]),
        named: Vec::new(),
    };
    assert_eq!(names(&pick(&auto(), &t, &node)), ["eth0"]);
    // An announcer names it (kind's MetalLB names eth0).
    let named = Hints {
        node_ips: None,
        named: vec![Named {
            by: "L2Advertisement metallb-system/kind".into(),
            rules: vec![NameRule::Exact("vethab".into())],
        }],
    };
    assert_eq!(names(&pick(&auto(), &t, &named)), ["vethab"]);
    // Pointed at by a default route elsewhere and enslaved to a CNI bridge:
    // lifted to the bridge, which is left out.
    let mut pod = table(&[
        ("cni0", 4, Some("bridge"), None),
        ("veth9", 9, Some("veth"), Some(4)),
    ]);
    route(&mut pod, false, 0, &[9]);
    let c = pick(&auto(), &pod, &none);
    assert!(c.uplinks.is_empty());
    assert!(c.left_out["cni0"].contains("cni*"));
}

#[test]
fn ipv6_and_multipath_default_routes_count_too() {
    let mut t = table(&[
        ("ens1f0", 2, None, None),
        ("ens1f1", 3, None, None),
        ("ens2", 4, None, None),
    ]);
    route(&mut t, true, 1024, &[2, 3]);
    assert_eq!(
        names(&pick(&auto(), &t, &Hints::default())),
        ["ens1f0", "ens1f1"]
    );
}

#[test]
fn nothing_found_says_what_was_looked_at_and_the_fix() {
    let mut t = crowded();
    t.default_routes.clear();
    let h = Hints {
        node_ips: Some(vec!["10.244.0.1".parse().unwrap()]),
        named: Vec::new(),
    };
    let c = pick(&auto(), &t, &h);
    assert!(c.uplinks.is_empty());
    let said = c.none_found.unwrap();
    assert_eq!(
        said,
        "--interface auto found no uplink: default routes via none; the node's address 10.244.0.1 on cni0; \
         announcers' interfaces none; left out: cni0 (a CNI's or kube-proxy's device (name cni*)); \
         name the uplink with INTERFACE= in the arp-guard ConfigMap (or --interface NAME)"
    );
    let c = pick(&auto(), &t, &Hints::default());
    assert!(c
        .none_found
        .unwrap()
        .contains("the node's address not known (the Node object was not read)"));
}

#[test]
fn what_auto_chose_stays_while_it_qualifies_and_goes_when_it_cannot() {
    let mut t = crowded();
    let first = pick(&auto(), &t, &Hints::default());
    // The default route moves to eno2 (a DHCP renewal, a failover): eno1 stays guarded.
    route(&mut t, false, 0, &[3]);
    let second = choose(&auto(), &t, &Hints::default(), &first);
    assert_eq!(names(&second), ["eno1", "eno2"]);
    assert_eq!(second.uplinks["eno1"].why, [Why::Kept]);
    // Renamed: the same device (ifindex), still kept.
    t.links.remove("eno1");
    t.links.insert("lan0".into(), 2);
    let third = choose(&auto(), &t, &Hints::default(), &second);
    assert_eq!(names(&third), ["eno2", "lan0"]);
    // Enslaved to a new bond: the bond takes its place.
    t.links.insert("bond0".into(), 20);
    t.devices.insert(
        20,
        Device {
            kind: DeviceKind::Bond,
            controller: None,
            ether: true,
            loopback: false,
            up: true,
            carrier: true,
        },
    );
    t.devices.get_mut(&2).unwrap().controller = Some(20);
    let fourth = choose(&auto(), &t, &Hints::default(), &third);
    assert_eq!(names(&fourth), ["bond0", "eno2"]);
    // Gone: not kept.
    t.links.remove("bond0");
    t.devices.remove(&20);
    t.devices.get_mut(&2).unwrap().controller = None;
    t.links.remove("lan0");
    t.devices.remove(&2);
    assert_eq!(
        names(&choose(&auto(), &t, &Hints::default(), &fourth)),
        ["eno2"]
    );
}

#[test]
fn names_and_globs_are_taken_as_named_and_mix_with_auto() {
    let t = crowded();
    let ask = Ask::new(&["docker0".into(), "eth*".into()], &[]);
    let c = pick(&ask, &t, &Hints::default());
    assert_eq!(names(&c), ["docker0"]);
    assert_eq!(c.missing, ["eth*"]);
    assert!(c.none_found.is_none(), "no auto, no auto message");
    let ask = Ask::new(&[AUTO.into(), "eno2".into()], &[]);
    let c = pick(&ask, &t, &Hints::default());
    assert_eq!(names(&c), ["eno1", "eno2"]);
    assert_eq!(c.uplinks["eno2"].because(), "--interface eno2");
    // What a name chose is not kept by auto once the name no longer matches.
    let mut t2 = t.clone();
    t2.links.remove("eno2");
    t2.links.insert("eth5".into(), 3);
    assert_eq!(names(&choose(&ask, &t2, &Hints::default(), &c)), ["eno1"]);
}

#[test]
fn globs() {
    assert!(glob("eth0", "eth0"));
    assert!(!glob("eth0", "eth01"));
    assert!(glob("eth*", "eth0") && glob("eth*", "eth") && !glob("eth*", "veth0"));
    assert!(glob("bond0.*", "bond0.100") && !glob("bond0.*", "bond0"));
    assert!(glob("en?1", "enp1") && !glob("en?1", "en1"));
    assert!(glob("*", "anything") && glob("*0", "eth0"));
}

#[test]
fn lb_interfaces_are_never_uplinks() {
    let mut t = table(&[("eth0", 2, None, None), ("kube-ipvs0", 4, None, None)]);
    route(&mut t, false, 0, &[4]);
    let ask = Ask::new(
        &["eth*".into(), "kube-*".into(), AUTO.into()],
        &["kube-ipvs0".into()],
    );
    let c = pick(&ask, &t, &Hints::default());
    assert_eq!(names(&c), ["eth0"]);
    assert_eq!(c.left_out["kube-ipvs0"], "an --lb-ips-from interface");
}
