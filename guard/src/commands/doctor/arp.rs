//! ARP: what the kernel answers and announces on each uplink
//! (`arp_ignore`, `arp_announce`: the kernel uses the maximum of `all` and
//! the interface), for the addresses on kube-ipvs0 and `lo`, and whether
//! the running guard covers them.

use std::net::Ipv4Addr;

use super::{
    gathered::{list, Coverage, Gathered, Plan},
    report::{Check, CheckStatus},
};

const STRICT_FIX: &str = "set kube-proxy's ipvs.strictARP: true (it sets net.ipv4.conf.all.arp_ignore=1 \
                          and arp_announce=2), or sysctl -w those two; and/or run arp-guard on this \
                          interface with --lb-ips-from kube-ipvs0 in enforce mode";

/// What an effective arp_ignore value makes the kernel do.
pub fn arp_ignore_meaning(v: i64) -> &'static str {
    match v {
        0 => "answers ARP for every local address, on every interface",
        1 => "answers only for addresses configured on the receiving interface",
        2 => "answers only for addresses on the receiving interface, in the sender's subnet",
        3 => "answers for every address but scope host ones; kube-ipvs0's are scope global, so it answers for them",
        4..=7 => "(a reserved value) answers as with 0: for every local address",
        8 => "answers no ARP at all on this interface",
        _ => "(a value it does not know) answers as with 0: for every local address",
    }
}

/// The kernel keeps quiet about addresses on other interfaces.
pub fn arp_ignore_protects(v: i64) -> bool {
    matches!(v, 1 | 2 | 8)
}

fn missing(check: &str, iface: &str) -> Check {
    Check::new(
        check,
        Some(iface),
        CheckStatus::Skip,
        "no such interface",
        format!("there is no {iface} on this node (in this network namespace)"),
    )
    .fix("name the node's uplink with -i")
}

fn lb_summary(lb: &[(String, Ipv4Addr)]) -> String {
    let mut ifaces: Vec<&str> = lb.iter().map(|(i, _)| i.as_str()).collect();
    ifaces.dedup();
    format!("{} LB IPs on {}", lb.len(), ifaces.join(" and "))
}

/// The value the kernel uses for `key` on `uplink` (the maximum of `all`
/// and `uplink`) and its display, or the check saying why it is not known
/// (no such interface, or the setting unreadable).
fn effective(f: &Gathered, uplink: &str, key: &'static str) -> Result<(i64, String), Box<Check>> {
    if !f.has_interface(uplink) {
        return Err(Box::new(missing(key, uplink)));
    }
    let (eff, detail) = f.node.effective(uplink, key);
    match eff {
        Ok(v) => Ok((v, format!("{v} ({detail})"))),
        Err(e) => Err(Box::new(
            Check::new(
                key,
                Some(uplink),
                CheckStatus::Warn,
                format!("unknown ({detail})"),
                e,
            )
            .fix(format!(
                "read net.ipv4.conf.all.{key} and net.ipv4.conf.{uplink}.{key} as root"
            )),
        )),
    }
}

fn announce_meaning(v: i64) -> &'static str {
    match v {
        2 => "requests this node sends use the interface's own primary address as sender, never an LB IP",
        1 => "requests keep an LB IP as sender when it is in the target's subnet on this interface",
        _ => "a request this node sends (say, resolving the client for a reply sourced from an LB IP) may carry the LB IP as sender",
    }
}

/// The LB IPs that arp_announce `v` lets out as the sender of requests on
/// `uplink`: none with 2; with 1 those on-link with the uplink's subnets
/// (the usual L2 pool is the LAN's own subnet); else all.
fn leaky(f: &Gathered, uplink: &str, v: i64, ips: &[Ipv4Addr]) -> Vec<Ipv4Addr> {
    let on_link = |ip: Ipv4Addr| {
        f.addrs.as_ref().is_ok_and(|t| {
            t.v4_of(uplink).iter().any(|a| {
                let m = u32::MAX
                    .checked_shl(32 - u32::from(a.prefix.min(32)))
                    .unwrap_or(0);
                a.prefix < 32 && u32::from(ip) & m == u32::from(a.addr) & m
            })
        })
    };
    match v {
        2 => Vec::new(),
        1 => ips.iter().copied().filter(|ip| on_link(*ip)).collect(),
        _ => ips.to_vec(),
    }
}

/// `arp_ignore` on an uplink.
pub fn arp_ignore(f: &Gathered, plan: &Plan, uplink: &str) -> Check {
    const C: &str = "arp_ignore";
    let (v, value) = match effective(f, uplink, C) {
        Ok(v) => v,
        Err(c) => return *c,
    };
    let meaning = arp_ignore_meaning(v);
    let lb = f.lb_addresses(plan);
    if arp_ignore_protects(v) {
        let why = if lb.is_empty() {
            format!("the kernel {meaning} (strictARP-like)")
        } else {
            format!(
                "the kernel {meaning}: the {} are not answered on {uplink} (strictARP-like)",
                lb_summary(&lb)
            )
        };
        return Check::new(C, Some(uplink), CheckStatus::Pass, value, why);
    }
    if lb.is_empty() {
        return Check::new(
            C,
            Some(uplink),
            CheckStatus::Pass,
            value,
            format!(
                "the kernel {meaning}, but no LB IPs sit on {} or lo",
                plan.lb_ifaces.join(", ")
            ),
        );
    }
    let ips: Vec<Ipv4Addr> = lb.iter().map(|(_, a)| *a).collect();
    let exposure = format!(
        "the kernel {meaning}: the {} ({}) are answered on {uplink}",
        lb_summary(&lb),
        list(&ips)
    );
    match f.coverage(uplink, &ips) {
        Coverage::Full { mode } if mode == "enforce" => Check::new(
            C,
            Some(uplink),
            CheckStatus::Warn,
            value,
            format!("{exposure}; arp-guard (enforce) on {uplink} drops those replies for IPs this node does not own"),
        )
        .fix("defence in depth: also set strictARP (arp_ignore=1, arp_announce=2), so that the kernel keeps quiet even without the guard"),
        Coverage::Full { mode } => Check::new(
            C,
            Some(uplink),
            CheckStatus::Fail,
            value,
            format!("{exposure}; arp-guard on {uplink} is in {mode} mode: it counts those replies, it does not stop them"),
        )
        .fix("switch arp-guard to --mode enforce (deploy/components/enforce), or set strictARP"),
        Coverage::Not(why) => Check::new(
            C,
            Some(uplink),
            CheckStatus::Fail,
            value,
            format!(
                "{exposure}, and {why}: every such node answers, clients cache whichever MAC came first, \
                 and with externalTrafficPolicy: Local a node without an endpoint drops the connection silently"
            ),
        )
        .fix(STRICT_FIX),
    }
}

/// `arp_announce` on an uplink.
pub fn arp_announce(f: &Gathered, plan: &Plan, uplink: &str) -> Check {
    const C: &str = "arp_announce";
    let (v, value) = match effective(f, uplink, C) {
        Ok(v) => v,
        Err(c) => return *c,
    };
    let lb = f.lb_addresses(plan);
    let ips: Vec<Ipv4Addr> = lb.iter().map(|(_, a)| *a).collect();
    let leaky = leaky(f, uplink, v, &ips);
    let what = announce_meaning(v);
    if leaky.is_empty() {
        let tail = if lb.is_empty() {
            format!("; no LB IPs sit on {} or lo", plan.lb_ifaces.join(", "))
        } else if v == 1 {
            "; no LB IP is in this interface's subnets".to_owned()
        } else {
            String::new()
        };
        return Check::new(
            C,
            Some(uplink),
            CheckStatus::Pass,
            value,
            format!("{what}{tail}"),
        );
    }
    let exposure = format!(
        "{what}: neighbours then learn LB IP -> this node's MAC ({})",
        list(&leaky)
    );
    match f.coverage(uplink, &leaky) {
        Coverage::Full { mode } if mode == "enforce" => Check::new(
            C,
            Some(uplink),
            CheckStatus::Warn,
            value,
            format!("{exposure}; arp-guard (enforce) rewrites such requests for IPs this node does not own"),
        )
        .fix("defence in depth: net.ipv4.conf.all.arp_announce=2 (strictARP sets it)"),
        Coverage::Full { mode } => Check::new(
            C,
            Some(uplink),
            CheckStatus::Fail,
            value,
            format!("{exposure}; arp-guard is in {mode} mode and only counts them"),
        )
        .fix("net.ipv4.conf.all.arp_announce=2 (strictARP), or arp-guard in enforce mode"),
        Coverage::Not(why) => Check::new(C, Some(uplink), CheckStatus::Fail, value, format!("{exposure}, and {why}"))
            .fix("net.ipv4.conf.all.arp_announce=2 (kube-proxy strictARP: true sets it), or arp-guard on this interface"),
    }
}

/// `lb_addresses`: the addresses on an LB interface (and `lo`), and
/// whether the guard covers them on every uplink.
pub fn lb_addresses(f: &Gathered, plan: &Plan, iface: &str) -> Check {
    const C: &str = "lb_addresses";
    let ips = match lb_addresses_on(f, plan, iface) {
        Ok(ips) => ips,
        Err(c) => return *c,
    };
    let mut value = format!("{} ({})", ips.len(), list(&ips));
    let kernel_answers: Vec<&String> = plan
        .uplinks
        .iter()
        .filter(|u| {
            !f.node
                .effective(u, "arp_ignore")
                .0
                .is_ok_and(arp_ignore_protects)
        })
        .collect();
    let uncovered = uncovered(f, plan, &ips);
    if uncovered.is_empty() && !plan.uplinks.is_empty() {
        value += &format!("; arp-guard covers all ({})", f.states(&ips));
        return Check::new(
            C,
            Some(iface),
            CheckStatus::Pass,
            value,
            format!(
                "arp-guard judges every address on {iface} on {}",
                plan.uplinks.join(", ")
            ),
        );
    }
    let why_not = uncovered
        .iter()
        .map(|(u, why)| format!("{u}: {why}"))
        .collect::<Vec<_>>()
        .join("; ");
    let fix = format!(
        "run arp-guard on {} with --lb-ips-from {iface}",
        plan.uplinks.join(", ")
    );
    if !kernel_answers.is_empty() {
        Check::new(
            C,
            Some(iface),
            CheckStatus::Fail,
            value,
            format!("the kernel answers ARP for them on {} (arp_ignore) and the guard does not cover them ({why_not})", list(&kernel_answers)),
        )
        .fix(fix)
    } else if !f.guard.seen() {
        Check::new(C, Some(iface), CheckStatus::Pass, value, "no arp-guard seen, but arp_ignore keeps the kernel from answering for them on every uplink")
    } else {
        Check::new(
            C,
            Some(iface),
            CheckStatus::Warn,
            value,
            format!("arp_ignore keeps the kernel quiet, but the guard does not cover them ({why_not}): a speaker announcing from the wrong node is not stopped"),
        )
        .fix(fix)
    }
}

/// The LB addresses on `iface`, or the check saying there are none.
fn lb_addresses_on(f: &Gathered, plan: &Plan, iface: &str) -> Result<Vec<Ipv4Addr>, Box<Check>> {
    const C: &str = "lb_addresses";
    if let Err(e) = &f.addrs {
        let why = format!("cannot list addresses: {e}");
        return Err(Box::new(Check::new(
            C,
            Some(iface),
            CheckStatus::Skip,
            "unknown",
            why,
        )));
    }
    if !f.has_interface(iface) {
        let why = format!(
            "no {iface} here: kube-proxy is not in IPVS mode on this node (or not running)"
        );
        let c = Check::new(C, Some(iface), CheckStatus::Skip, "no such interface", why);
        return Err(Box::new(c));
    }
    let ips: Vec<Ipv4Addr> = f
        .lb_addresses(plan)
        .into_iter()
        .filter(|(i, _)| i == iface)
        .map(|(_, a)| a)
        .collect();
    if ips.is_empty() {
        let why = format!("no IPv4 addresses on {iface}: nothing for the kernel to answer for");
        return Err(Box::new(Check::new(
            C,
            Some(iface),
            CheckStatus::Pass,
            "none",
            why,
        )));
    }
    Ok(ips)
}

/// The uplinks on which the guard does not cover `ips`, with why.
fn uncovered(f: &Gathered, plan: &Plan, ips: &[Ipv4Addr]) -> Vec<(String, String)> {
    plan.uplinks
        .iter()
        .filter_map(|u| match f.coverage(u, ips) {
            Coverage::Full { .. } => None,
            Coverage::Not(why) => Some((u.clone(), why)),
        })
        .collect()
}
