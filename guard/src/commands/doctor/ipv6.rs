//! IPv6: what decides the kernel's Neighbor Discovery answers for the IPv6
//! LB IPs (the global IPv6 addresses on the LB interfaces and the guard's
//! IPv6 set). Unlike ARP, the kernel answers a Neighbor Solicitation only for
//! an address on the receiving interface, or through a proxy entry
//! (`ndisc_recv_ns` in net/ipv6/ndisc.c): there is no kube-ipvs0 flux, so
//! what is checked is the way an uplink can still answer for an address it
//! should not (`proxy_ndp` and proxy entries), duplicate address detection
//! on LB IPs held on the uplink itself (`accept_dad`, kube-vip #523), and
//! forwarding, which makes the node answer as a router.
//!
//! The kernel's rules, as read in net/ipv6/ndisc.c and addrconf.c: a proxy
//! entry is answered when the receiving interface forwards
//! (`ipv6/conf/IFACE/forwarding`) and `proxy_ndp` is on in `all` or on the
//! interface (either); DAD runs for a new address unless `accept_dad` is
//! below 1 in both `all` and the interface (or it was added `nodad`); a
//! solicitation is answered with the Router flag when the interface forwards
//! (a proxy entry's own router flag otherwise); packets are forwarded by
//! `all.forwarding`.

use std::net::Ipv6Addr;

use guard_common::Ownership;

use super::{
    gathered::{list, Coverage, Gathered, Plan},
    ipv6_view::{Addr6, Dad, Proxy6},
    node::Reading,
    report::{Check, CheckStatus},
};

/// The ifindex of `uplink` (sysfs, else netlink).
fn index_of(f: &Gathered, uplink: &str) -> Option<u32> {
    f.node
        .ifindex(uplink)
        .or_else(|| f.addrs.as_ref().ok().and_then(|t| t.ifindex(uplink)))
}

/// The check's answer when it does not apply to `uplink`: the interface is
/// not there, IPv6 is off on it (`off` then), or that is unknown.
fn unchecked(f: &Gathered, check: &str, uplink: &str, off: CheckStatus) -> Option<Check> {
    if !f.has_interface(uplink) {
        let why = format!("there is no {uplink} on this node (in this network namespace)");
        return Some(Check::new(
            check,
            Some(uplink),
            CheckStatus::Skip,
            "no such interface",
            why,
        ));
    }
    match f.node.ipv6_on(uplink) {
        Ok(true) => None,
        Ok(false) => Some(Check::new(
            check,
            Some(uplink),
            off,
            "IPv6 off",
            format!("IPv6 is off on {uplink} (disable_ipv6, or no IPv6 in the kernel): it answers no Neighbor Solicitation"),
        )),
        Err(e) => Some(Check::new(check, Some(uplink), CheckStatus::Warn, "unknown", e)),
    }
}

/// `ipv6/conf/{all,uplink}/key`, or the check saying it is unknown.
fn both(
    f: &Gathered,
    check: &str,
    uplink: &str,
    key: &'static str,
) -> Result<(i64, i64), Box<Check>> {
    match (f.node.conf6("all", key), f.node.conf6(uplink, key)) {
        (Ok(a), Ok(d)) => Ok((a, d)),
        (Err(e), _) | (_, Err(e)) => Err(Box::new(
            Check::new(check, Some(uplink), CheckStatus::Warn, "unknown", e).fix(format!(
                "read net.ipv6.conf.all.{key} and net.ipv6.conf.{uplink}.{key} as root"
            )),
        )),
    }
}

/// `ipv6`: which IPv6 LB IPs doctor knows of; the per-uplink IPv6 checks run
/// only when there are some.
pub fn lb_ips6(f: &Gathered, plan: &Plan, lb6: &[Ipv6Addr]) -> Check {
    const C: &str = "ipv6";
    if let Err(e) = &f.addrs {
        let why = format!("cannot list addresses: {e}");
        return Check::new(C, None, CheckStatus::Skip, "unknown", why);
    }
    let guard_set = match (f.guard.seen(), f.guard.lb6()) {
        (true, None) => {
            " (the guard's IPv6 set is unknown: its API does not answer and its pins hold none)"
        }
        _ => "",
    };
    if lb6.is_empty() {
        let why = format!(
            "no IPv6 address on {} and none in the guard's LB set{guard_set}: no Neighbor Discovery answer to check",
            plan.lb_ifaces.join(", ")
        );
        return Check::new(C, None, CheckStatus::Pass, "no IPv6 LB IP", why);
    }
    Check::new(
        C,
        None,
        CheckStatus::Pass,
        format!("{} IPv6 LB IPs ({})", lb6.len(), list(lb6)),
        format!(
            "the kernel answers a Neighbor Solicitation for an LB IP only where it is an address of the \
             receiving interface, or through a proxy entry, never for kube-ipvs0's as ARP does: \
             proxy_ndp and accept_dad look at each uplink{guard_set}"
        ),
    )
}

/// The proxy entries for LB IPs that apply on `uplink` (its own, or any
/// interface's), addresses sorted.
fn lb_proxies(f: &Gathered, uplink: &str, lb6: &[Ipv6Addr]) -> Result<Vec<Ipv6Addr>, String> {
    let view = f.ipv6.as_ref().map_err(Clone::clone)?;
    let proxies = view.proxies.as_ref().map_err(Clone::clone)?;
    let index = index_of(f, uplink);
    let mut ips: Vec<Ipv6Addr> = proxies
        .iter()
        .filter(|p: &&Proxy6| lb6.contains(&p.addr) && (p.ifindex.is_none() || p.ifindex == index))
        .map(|p| p.addr)
        .collect();
    ips.sort_unstable();
    ips.dedup();
    Ok(ips)
}

/// `proxy_ndp` on an uplink, with the proxy entries for LB IPs there.
pub fn proxy_ndp(f: &Gathered, uplink: &str, lb6: &[Ipv6Addr]) -> Check {
    const C: &str = "proxy_ndp";
    if let Some(c) = unchecked(f, C, uplink, CheckStatus::Pass) {
        return c;
    }
    let (all, dev) = match both(f, C, uplink, C) {
        Ok(v) => v,
        Err(c) => return *c,
    };
    let fwd = match f.node.conf6(uplink, "forwarding") {
        Ok(v) => v,
        Err(e) => return Check::new(C, Some(uplink), CheckStatus::Warn, "unknown", e),
    };
    let on = all != 0 || dev != 0;
    let active = on && fwd != 0;
    let state = match (on, active) {
        (false, _) => "off",
        (true, false) => "on, inactive",
        (true, true) => "on",
    };
    let value = format!("{state} (all {all}, {uplink} {dev}; {uplink} forwarding {fwd})");
    let quiet = if on {
        format!(
            "proxy_ndp is on, but {uplink} does not forward (net.ipv6.conf.{uplink}.forwarding=0): \
             the kernel answers from proxy entries only on a forwarding interface"
        )
    } else {
        format!(
            "the kernel answers Neighbor Solicitations on {uplink} only for addresses configured on {uplink}"
        )
    };
    let proxied = match lb_proxies(f, uplink, lb6) {
        Ok(p) => p,
        Err(e) if active => {
            return Check::new(
                C,
                Some(uplink),
                CheckStatus::Warn,
                value,
                format!(
                "the kernel answers from proxy entries on {uplink}, which cannot be listed ({e})"
            ),
            )
            .fix("ip -6 neigh show proxy, as root")
        }
        Err(_) => return Check::new(C, Some(uplink), CheckStatus::Pass, value, quiet),
    };
    if proxied.is_empty() {
        let why = if active {
            format!("the kernel answers for the proxy entries on {uplink}; none is for an LB IP")
        } else {
            quiet
        };
        return Check::new(C, Some(uplink), CheckStatus::Pass, value, why);
    }
    let value = format!("{value}; proxy entries for LB IPs: {}", list(&proxied));
    let del = format!("ip -6 neigh del proxy {} dev {uplink}", proxied[0]);
    if !active {
        return Check::new(
            C,
            Some(uplink),
            CheckStatus::Warn,
            value,
            format!("{quiet}; the proxy entries for LB IPs are dormant: turning proxy_ndp (or forwarding) on makes the kernel answer for them"),
        )
        .fix(format!("remove the proxy entries of LB IPs this node does not own ({del})"));
    }
    judge_proxied(f, uplink, value, &proxied, &del)
}

/// Active proxy entries for the LB IPs `proxied` on `uplink`: fine for IPs
/// this node owns, otherwise only an enforcing guard that knows their owner
/// is elsewhere stops the kernel's answers.
fn judge_proxied(
    f: &Gathered,
    uplink: &str,
    value: String,
    proxied: &[Ipv6Addr],
    del: &str,
) -> Check {
    const C: &str = "proxy_ndp";
    let lb = f.guard.lb6().unwrap_or_default();
    let state = |ip: &Ipv6Addr| lb.get(ip).copied();
    let others: Vec<Ipv6Addr> = proxied
        .iter()
        .filter(|ip| state(ip) != Some(Ownership::Owned))
        .copied()
        .collect();
    if others.is_empty() {
        let why = format!(
            "the kernel answers for them on {uplink} through proxy entries, and arp-guard says this node owns them \
             (whoever added the entries must remove them when the IPs move)"
        );
        return Check::new(C, Some(uplink), CheckStatus::Pass, value, why);
    }
    let exposure = format!(
        "the kernel answers Neighbor Solicitations for {} on {uplink} through proxy entries, though this node \
         is not known to own them: every neighbour that asks learns LB IP -> this node's MAC",
        list(&others)
    );
    let fix = format!("remove the proxy entries of LB IPs this node does not own ({del}); find who adds them (a speaker, a script)");
    let unknown: Vec<Ipv6Addr> = others
        .iter()
        .filter(|ip| state(ip) != Some(Ownership::Foreign))
        .copied()
        .collect();
    match f.coverage6(uplink, &others) {
        Coverage::Full { mode } if mode == "enforce" && unknown.is_empty() => Check::new(
            C,
            Some(uplink),
            CheckStatus::Warn,
            value,
            format!("{exposure}; arp-guard (enforce) on {uplink} drops those advertisements: the owners are elsewhere"),
        )
        .fix(format!("defence in depth: {fix}")),
        Coverage::Full { mode } if mode == "enforce" => Check::new(
            C,
            Some(uplink),
            CheckStatus::Fail,
            value,
            format!(
                "{exposure}; arp-guard knows no owner of {} and passes the kernel's answers for them",
                list(&unknown)
            ),
        )
        .fix(fix),
        Coverage::Full { mode } => Check::new(
            C,
            Some(uplink),
            CheckStatus::Fail,
            value,
            format!("{exposure}; arp-guard on {uplink} is in {mode} mode: it counts those advertisements, it does not stop them"),
        )
        .fix(fix),
        Coverage::Not(why) => {
            Check::new(C, Some(uplink), CheckStatus::Fail, value, format!("{exposure}, and {why}")).fix(fix)
        }
    }
}

/// The LB IPs that are addresses of `uplink`, with their DAD state.
fn held_on<'a>(f: &'a Gathered, uplink: &str, lb6: &[Ipv6Addr]) -> Result<Vec<&'a Addr6>, String> {
    let view = f.ipv6.as_ref().map_err(Clone::clone)?;
    let index = index_of(f, uplink);
    let mut held: Vec<&Addr6> = view
        .addrs
        .iter()
        .filter(|a| Some(a.ifindex) == index && lb6.contains(&a.addr))
        .collect();
    held.sort_by_key(|a| a.addr);
    Ok(held)
}

/// The `accept_dad` check when DAD failed for some LB IPs on `uplink`, or
/// is under way for some.
fn dad_trouble(
    uplink: &str,
    value: &str,
    failed: &[Ipv6Addr],
    tentative: &[Ipv6Addr],
) -> Option<Check> {
    const C: &str = "accept_dad";
    if let Some(first) = failed.first() {
        let why = format!(
            "duplicate address detection failed for {}: when it was added here another node answered for it \
             (a VIP left on two nodes, kube-vip #523). The kernel keeps it dadfailed and tentative: this node \
             answers no Neighbor Solicitation for it and delivers none of its traffic, while the speaker \
             believes it serves it",
            list(failed)
        );
        let fix = format!(
            "find the other holder (arp-guard probe -i <iface> {first} from a host on the segment), remove the \
             address there, then here (ip -6 addr del {first}/128 dev {uplink}) so that the speaker adds it again"
        );
        return Some(Check::new(C, Some(uplink), CheckStatus::Fail, value, why).fix(fix));
    }
    if tentative.is_empty() {
        return None;
    }
    let why = format!(
        "duplicate address detection is under way for {} (about a second): until it ends the kernel neither \
         answers for it nor delivers its traffic",
        list(tentative)
    );
    Some(Check::new(C, Some(uplink), CheckStatus::Warn, value, why).fix(
        "run doctor again in a few seconds: a detection that fails leaves the address dadfailed",
    ))
}

/// `accept_dad` on an uplink, and the DAD state of the LB IPs held on it
/// (kube-vip puts the VIP on the uplink itself).
pub fn accept_dad(f: &Gathered, uplink: &str, lb6: &[Ipv6Addr]) -> Check {
    const C: &str = "accept_dad";
    if let Some(c) = unchecked(f, C, uplink, CheckStatus::Skip) {
        return c;
    }
    let (all, dev) = match both(f, C, uplink, C) {
        Ok(v) => v,
        Err(c) => return *c,
    };
    let held = match held_on(f, uplink, lb6) {
        Ok(h) => h,
        Err(e) => {
            let why = format!("cannot list IPv6 addresses: {e}");
            return Check::new(C, Some(uplink), CheckStatus::Skip, "unknown", why);
        }
    };
    // The kernel skips DAD only when both are below 1.
    let on = all >= 1 || dev >= 1;
    let value = format!(
        "{} (all {all}, {uplink} {dev})",
        if on { "on" } else { "off" }
    );
    if held.is_empty() {
        let why = format!(
            "no LB IP is an address of {uplink} (a speaker that answers from userspace, kube-ipvs0): DAD decides nothing for them"
        );
        return Check::new(C, Some(uplink), CheckStatus::Pass, value, why);
    }
    let shown: Vec<String> = held
        .iter()
        .map(|a| format!("{} {}", a.addr, a.dad.as_str()))
        .collect();
    let value = format!("{value}; LB IPs on {uplink}: {}", list(&shown));
    let with = |dad: Dad| -> Vec<Ipv6Addr> {
        held.iter()
            .filter(|a| a.dad == dad)
            .map(|a| a.addr)
            .collect()
    };
    if let Some(c) = dad_trouble(uplink, &value, &with(Dad::Failed), &with(Dad::Tentative)) {
        return c;
    }
    let why = if on && !with(Dad::Done).is_empty() {
        "DAD ran when they were added: an LB IP added here while another node still answers for it ends dadfailed \
         (kube-vip #523; this check then fails), and every takeover waits for DAD (about a second) before the kernel answers"
    } else {
        "added without DAD (nodad, or accept_dad below 1): a second holder is not detected here, both nodes answer \
         (arp-guard probe shows the conflict)"
    };
    Check::new(C, Some(uplink), CheckStatus::Pass, value, why)
}

/// `ipv6_forwarding`: the node routes IPv6 (`all.forwarding`), and each
/// uplink's own `forwarding`, which makes it answer as a router there.
pub fn forwarding(f: &Gathered, plan: &Plan) -> Check {
    const C: &str = "ipv6_forwarding";
    let all = match f.node.conf6("all", "forwarding") {
        Ok(v) => v,
        Err(e) if e.ends_with("not found") => {
            return Check::new(
                C,
                None,
                CheckStatus::Skip,
                "no IPv6",
                "the kernel has no IPv6 (no net.ipv6 sysctls)",
            )
        }
        Err(e) => return Check::new(C, None, CheckStatus::Warn, "unknown", e),
    };
    let per_if: Vec<UplinkFwd> = plan
        .uplinks
        .iter()
        .filter(|u| f.has_interface(u) && f.node.ipv6_on(u) == Ok(true))
        .map(|u| UplinkFwd {
            name: u.clone(),
            forwarding: f.node.conf6(u, "forwarding"),
            accept_ra: f.node.conf6(u, "accept_ra"),
        })
        .collect();
    let show = |r: &Reading| r.as_ref().map_or("unknown".to_owned(), i64::to_string);
    let shown: Vec<String> = per_if
        .iter()
        .map(|u| {
            format!(
                "{} {}, accept_ra {}",
                u.name,
                show(&u.forwarding),
                show(&u.accept_ra)
            )
        })
        .collect();
    let value = if shown.is_empty() {
        format!("{all} (all)")
    } else {
        format!("{all} (all; {})", shown.join("; "))
    };
    if all == 0 {
        return Check::new(
            C,
            None,
            CheckStatus::Fail,
            value,
            "this node does not route IPv6 (the kernel forwards by net.ipv6.conf.all.forwarding): IPv6 Service \
             traffic to pods on other nodes and its replies are dropped",
        )
        .fix("sysctl -w net.ipv6.conf.all.forwarding=1 (and persist it in /etc/sysctl.d)");
    }
    let hosts: Vec<&String> = per_if
        .iter()
        .filter(|u| u.forwarding == Ok(0))
        .map(|u| &u.name)
        .collect();
    if !hosts.is_empty() {
        return Check::new(
            C,
            None,
            CheckStatus::Warn,
            value,
            format!(
                "the node routes, but on {} it answers Neighbor Solicitations as a host: its advertisements there \
                 carry no Router flag (neighbours that saw it as a router drop it from their router lists), and \
                 proxy entries there are not answered",
                list(&hosts)
            ),
        )
        .fix(format!("sysctl -w net.ipv6.conf.{}.forwarding=1", hosts[0]));
    }
    Check::new(C, None, CheckStatus::Pass, value, as_router(&per_if))
}

/// An uplink's IPv6 `forwarding` and `accept_ra`.
struct UplinkFwd {
    name: String,
    forwarding: Reading,
    accept_ra: Reading,
}

/// Why forwarding uplinks are fine, and what a router ignores.
fn as_router(per_if: &[UplinkFwd]) -> String {
    let no_ra: Vec<&String> = per_if
        .iter()
        .filter(|u| u.accept_ra.as_ref().is_ok_and(|v| *v < 2))
        .map(|u| &u.name)
        .collect();
    let ra_note = if no_ra.is_empty() {
        String::new()
    } else {
        format!(
            "; Router Advertisements are ignored on {} (accept_ra below 2 on a forwarding interface): \
             a node that takes its IPv6 default route from them loses it",
            list(&no_ra)
        )
    };
    format!(
        "routes IPv6; on its uplinks it is a router: it answers Neighbor Solicitations with the Router flag \
         set, and answers for proxy entries when proxy_ndp is on{ra_note}"
    )
}
