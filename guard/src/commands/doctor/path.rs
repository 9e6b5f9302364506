//! The path of a client's packets through the node: forwarding, the
//! reverse-path filter (`rp_filter`, the maximum of `all` and the
//! interface: 0 off, 1 strict, else loose) against the route back, and
//! whether the LB IPs' subnet faces the interface that announces them.
//! Routes are the main table (/proc/net/route); policy routing is not
//! looked at.

use std::{collections::BTreeMap, net::Ipv4Addr};

use super::{
    gathered::{list, Gathered, Plan},
    node::Route,
    report::{Check, CheckStatus},
};

/// `ip_forward` and the uplinks' `forwarding`.
pub fn ip_forward(f: &Gathered, plan: &Plan) -> Check {
    const C: &str = "ip_forward";
    let why_on = "forwards: Service traffic to pods (on other nodes with externalTrafficPolicy: Cluster) and its replies are routed";
    let v = match &f.node.ip_forward {
        Ok(v) => *v,
        Err(e) => {
            return Check::new(C, None, CheckStatus::Warn, "unknown", e.clone())
                .fix("sysctl net.ipv4.ip_forward (should be 1)")
        }
    };
    let per_if: Vec<(String, Result<i64, String>)> = plan
        .uplinks
        .iter()
        .filter(|u| f.has_interface(u))
        .map(|u| (u.clone(), f.node.conf(u, "forwarding")))
        .collect();
    let shown: Vec<String> = per_if
        .iter()
        .map(|(u, r)| match r {
            Ok(x) => format!("{u} {x}"),
            Err(_) => format!("{u} unknown"),
        })
        .collect();
    let value = if shown.is_empty() {
        v.to_string()
    } else {
        format!("{v} (forwarding: {})", shown.join(", "))
    };
    if v == 0 {
        return Check::new(
            C,
            None,
            CheckStatus::Fail,
            value,
            "this node routes nothing: packets for pods behind it and replies of forwarded connections are dropped (kubeadm refuses such a node)",
        )
        .fix("sysctl -w net.ipv4.ip_forward=1 (and persist it in /etc/sysctl.d)");
    }
    let off: Vec<&String> = per_if
        .iter()
        .filter(|(_, r)| *r == Ok(0))
        .map(|(u, _)| u)
        .collect();
    if !off.is_empty() {
        return Check::new(
            C,
            None,
            CheckStatus::Fail,
            value,
            format!(
                "packets arriving on {} are not forwarded (conf/<iface>/forwarding=0)",
                list(&off)
            ),
        )
        .fix("sysctl -w net.ipv4.conf.<iface>.forwarding=1");
    }
    Check::new(C, None, CheckStatus::Pass, value, why_on)
}

fn rp_name(v: i64) -> &'static str {
    match v {
        0 => "off",
        1 => "strict",
        _ => "loose",
    }
}

/// The routes back to the clients asked about (or to any client beyond the
/// connected subnets: the default route): (what, route).
fn routes_back<'a>(f: &'a Gathered, plan: &Plan) -> Vec<(String, Option<&'a Route>)> {
    if plan.clients.is_empty() {
        let default = f
            .node
            .routes
            .as_ref()
            .ok()
            .and_then(|rs| rs.iter().filter(|r| r.prefix == 0).min_by_key(|r| r.metric));
        return vec![("clients beyond the connected subnets".into(), default)];
    }
    (plan.clients.iter())
        .filter_map(|c| match c {
            std::net::IpAddr::V4(v4) => Some((c.to_string(), f.node.route_to(*v4))),
            std::net::IpAddr::V6(_) => None,
        })
        .collect()
}

/// The IPv6 clients asked about, in a sentence: rp_filter is IPv4's, so
/// they are named as not checked (IPv6's reverse-path filtering is
/// netfilter's rpfilter).
fn ipv6_clients(plan: &Plan) -> Option<String> {
    let v6: Vec<String> = (plan.clients.iter())
        .filter(|c| c.is_ipv6())
        .map(ToString::to_string)
        .collect();
    (!v6.is_empty()).then(|| {
        format!(
            "not checked for {}: rp_filter is IPv4's (IPv6 reverse-path filtering is netfilter's rpfilter)",
            v6.join(", ")
        )
    })
}

/// `rp_filter` on an uplink, against the route back.
pub fn rp_filter(f: &Gathered, plan: &Plan, uplink: &str) -> Check {
    const C: &str = "rp_filter";
    if !f.has_interface(uplink) {
        return Check::new(
            C,
            Some(uplink),
            CheckStatus::Skip,
            "no such interface",
            format!("no {uplink} here"),
        );
    }
    let (eff, detail) = f.node.effective(uplink, C);
    let v = match eff {
        Ok(v) => v,
        Err(e) => {
            return Check::new(
                C,
                Some(uplink),
                CheckStatus::Warn,
                format!("unknown ({detail})"),
                e,
            )
            .fix("read net.ipv4.conf.{all,<iface>}.rp_filter")
        }
    };
    if let Err(e) = &f.node.routes {
        return Check::new(
            C,
            Some(uplink),
            CheckStatus::Warn,
            format!("{v}, {} ({detail}); routes unknown", rp_name(v)),
            format!("cannot read the routes to compare with: {e}"),
        );
    }
    let mut worst = CheckStatus::Pass;
    let mut parts = Vec::new();
    let mut whys: Vec<String> = ipv6_clients(plan).into_iter().collect();
    let back = routes_back(f, plan);
    if back.is_empty() {
        let value = format!("{v}, {} ({detail})", rp_name(v));
        return Check::new(C, Some(uplink), CheckStatus::Skip, value, whys.join("; "));
    }
    for (who, route) in back {
        let (status, why) = match route {
            None => (
                CheckStatus::Warn,
                format!("no route back to {who}: their packets arriving on {uplink} get no reply{}",
                    if v == 0 { "" } else { ", and the reverse-path filter drops them on arrival" }),
            ),
            Some(r) if r.iface == uplink => (CheckStatus::Pass, format!("the route back to {who} leaves by {uplink}, where they arrive")),
            Some(r) if v == 1 => (
                CheckStatus::Fail,
                format!("strict reverse-path filtering drops packets from {who} arriving on {uplink}, because the route back leaves by {}: the client's SYN never reaches the Service", r.iface),
            ),
            Some(r) => (
                CheckStatus::Warn,
                format!("asymmetric: packets from {who} arrive on {uplink}, replies leave by {}; the kernel accepts it (rp_filter {}), a stateful firewall or anti-spoofing upstream may not", r.iface, rp_name(v)),
            ),
        };
        worst = worst.max(status);
        parts.push(match route {
            Some(r) => format!("route back to {who}: {}", r.describe()),
            None => format!("no route back to {who}"),
        });
        whys.push(why);
    }
    let value = format!("{v}, {} ({detail}); {}", rp_name(v), parts.join("; "));
    let c = Check::new(C, Some(uplink), worst, value, whys.join("; "));
    match worst {
        CheckStatus::Fail => c.fix(format!(
            "announce on the interface the route back uses, or set net.ipv4.conf.{uplink}.rp_filter=2 \
             and net.ipv4.conf.all.rp_filter=2 (loose; the kernel uses the maximum), or route the clients back through {uplink}"
        )),
        CheckStatus::Warn => c.fix(format!("make the route back to clients leave by {uplink} (a default route or a route to the client networks via {uplink})")),
        _ => c,
    }
}

/// `lan_interface`: the LB IPs' subnet faces the announcing interface.
pub fn lan_interface(f: &Gathered, plan: &Plan) -> Check {
    const C: &str = "lan_interface";
    let ips = f.lb_ips(plan);
    if ips.is_empty() {
        return Check::new(
            C,
            None,
            CheckStatus::Skip,
            "no LB IPs known",
            "no addresses on the LB interfaces and no guard's LB set to look at",
        );
    }
    if let Err(e) = &f.node.routes {
        return Check::new(C, None, CheckStatus::Skip, "routes unknown", e.clone());
    }
    // LB IPs by the connected route they fall in (None: only a gateway route or nothing).
    let mut by: BTreeMap<Option<String>, Vec<Ipv4Addr>> = BTreeMap::new();
    for ip in &ips {
        let r = f
            .node
            .route_to(*ip)
            .filter(|r| r.gateway.is_none() && r.prefix > 0 && !plan.lb_ifaces.contains(&r.iface));
        by.entry(r.map(|r| format!("{}/{} dev {}", r.dst, r.prefix, r.iface)))
            .or_default()
            .push(*ip);
    }
    let iface_of = |key: &str| key.rsplit(' ').next().unwrap_or("").to_owned();
    let mut status = CheckStatus::Pass;
    let mut parts = Vec::new();
    let mut whys = Vec::new();
    for (key, group) in &by {
        let n = group.len();
        match key {
            Some(k) if plan.uplinks.contains(&iface_of(k)) => {
                parts.push(format!("{n} in {k}"));
            }
            Some(k) => {
                status = status.max(CheckStatus::Warn);
                parts.push(format!("{n} in {k}"));
                whys.push(format!(
                    "neighbours on {}'s segment ARP for {}, but the announcing interfaces checked are {}",
                    iface_of(k),
                    list(group),
                    plan.uplinks.join(", ")
                ));
            }
            None => {
                status = status.max(CheckStatus::Warn);
                parts.push(format!("{n} in no connected subnet"));
                whys.push(format!(
                    "{} lie in no subnet this node is attached to: neighbours ARP only for addresses in their own subnet, so an L2 announcement of them answers nobody",
                    list(group)
                ));
            }
        }
    }
    let value = parts.join("; ");
    if status == CheckStatus::Pass {
        return Check::new(C, None, CheckStatus::Pass, value, "the LB IPs are in the subnet of the interface that announces them (the one facing the LAN)");
    }
    Check::new(C, None, status, value, whys.join("; "))
        .fix("announce (and guard) on the interface that faces the LAN of the LB IPs, or pick LB IPs from that LAN's subnet")
}
