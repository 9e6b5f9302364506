//! `arp-guard doctor`: why this node might answer ARP (or Neighbor
//! Discovery) for LB IPs it does not own, one line per check. The gathering
//! reads files under the given procfs and sysfs roots (`node`), addresses,
//! their DAD state and the proxy entries through netlink (`ipv6_view`), the
//! running guard through its API or pins (`guard_view`) and kube-proxy's
//! ConfigMap (`kube_proxy`); the checks (`arp`, `ipv6`, `path`,
//! `guard_checks`) are pure functions of what was gathered (`facts`),
//! unit-tested on fixture trees.

mod arp;
mod gathered;
mod guard_checks;
mod guard_view;
mod ipv6;
mod ipv6_view;
mod kube_proxy;
mod node;
mod path;
mod report;

#[cfg(test)]
mod tests;

use std::time::Duration;

use anyhow::Result;

pub use report::{Check, CheckStatus, Report};

use self::{
    gathered::{default_uplinks, Gathered, Plan},
    guard_view::GuardView,
    ipv6_view::Ipv6View,
    kube_proxy::KubeProxy,
    node::Node,
};
use super::Found;
use crate::{
    cli::{DoctorArgs, Output},
    model::addrs::AddrTable,
};

/// Every check, in the order they print: kube-proxy's strictARP first, then
/// what the kernel answers, the path back, and the guard.
pub fn run_checks(f: &Gathered, plan: &Plan) -> Vec<Check> {
    let mut out = vec![kube_proxy::check(&f.kube_proxy)];
    if plan.uplinks.is_empty() {
        out.push(
            Check::new(
                "interfaces",
                None,
                CheckStatus::Warn,
                "none found",
                "no announcing interface given, none guarded, no default route, no interface with an IPv4 address",
            )
            .fix("name the node's uplink with -i"),
        );
    }
    for u in &plan.uplinks {
        out.push(arp::arp_ignore(f, plan, u));
        out.push(arp::arp_announce(f, plan, u));
    }
    let mut lb_ifaces = plan.lb_ifaces.clone();
    if f.addrs_of("lo").iter().any(|a| !a.is_loopback()) && !lb_ifaces.iter().any(|i| i == "lo") {
        lb_ifaces.push("lo".into());
    }
    for i in &lb_ifaces {
        out.push(arp::lb_addresses(f, plan, i));
    }
    out.push(path::lan_interface(f, plan));
    out.push(path::ip_forward(f, plan));
    for u in &plan.uplinks {
        out.push(path::rp_filter(f, plan, u));
    }
    let lb6 = f.lb_ips6(plan);
    out.push(ipv6::lb_ips6(f, plan, &lb6));
    if !lb6.is_empty() {
        for u in &plan.uplinks {
            out.push(ipv6::proxy_ndp(f, u, &lb6));
            out.push(ipv6::accept_dad(f, u, &lb6));
        }
        out.push(ipv6::forwarding(f, plan));
    }
    out.push(guard_checks::tcx(f));
    out.push(guard_checks::bpffs(f, plan));
    out.push(guard_checks::guard(f));
    for u in &plan.uplinks {
        out.push(guard_checks::attached(f, u));
        out.push(guard_checks::tc_chain(f, u));
    }
    out.push(guard_checks::mode(f));
    out.push(guard_checks::feed(f));
    out
}

/// The addresses of every interface, and the IPv6 view (DAD states, proxy
/// entries), through netlink.
async fn read_netlink() -> (Result<AddrTable, String>, Result<Ipv6View, String>) {
    let (conn, handle, _) = match rtnetlink::new_connection() {
        Ok(c) => c,
        Err(e) => {
            let e = format!("cannot open an rtnetlink socket: {e}");
            return (Err(e.clone()), Err(e));
        }
    };
    let task = tokio::spawn(conn);
    let limit = Duration::from_secs(5);
    let too_long = |_| "the netlink dump took more than 5 s".to_owned();
    let addrs = tokio::time::timeout(limit, crate::sources::addrs::dump(&handle))
        .await
        .map_err(too_long)
        .and_then(|r| r.map_err(|e| format!("{e:#}")));
    let ipv6 = tokio::time::timeout(limit, ipv6_view::read(&handle))
        .await
        .map_err(too_long)
        .and_then(|r| r);
    task.abort();
    (addrs, ipv6)
}

/// Gather what the checks need.
async fn gather(args: &DoctorArgs) -> (Gathered, Plan) {
    let kube = async {
        if args.no_cluster {
            KubeProxy::Skipped {
                why: "--no-cluster".into(),
                fix: None,
            }
        } else {
            kube_proxy::read(args.kubeconfig.as_deref(), args.kube_timeout).await
        }
    };
    let (mut guard, kube_proxy, (addrs, ipv6)) = tokio::join!(
        GuardView::read(args.api, &args.pin_dir),
        kube,
        read_netlink()
    );
    let mut node = Node::read(&args.proc_root, &args.sys_root);
    let (uplinks, uplinks_from) = if args.uplinks.is_empty() {
        default_uplinks(&node, &addrs, &guard, &args.lb_ifaces)
    } else {
        (args.uplinks.clone(), "--interface".to_owned())
    };
    node.read_conf(uplinks.iter().map(String::as_str));
    let indexed: Vec<(String, Option<u32>)> = uplinks
        .iter()
        .map(|u| {
            let i = node
                .ifindex(u)
                .or_else(|| addrs.as_ref().ok().and_then(|t| t.ifindex(u)));
            (u.clone(), i)
        })
        .collect();
    guard.read_chains(&indexed).await;
    let plan = Plan {
        uplinks,
        uplinks_from,
        lb_ifaces: args.lb_ifaces.clone(),
        clients: args.client.clone(),
        pin_dir: args.pin_dir.display().to_string(),
    };
    let facts = Gathered {
        node,
        addrs,
        guard,
        kube_proxy,
        ipv6,
    };
    (facts, plan)
}

/// `arp-guard doctor`.
pub async fn doctor(args: &DoctorArgs) -> Result<()> {
    let (facts, plan) = gather(args).await;
    let checks = run_checks(&facts, &plan);
    let report = Report {
        version: Report::VERSION,
        proc_root: args.proc_root.display().to_string(),
        sys_root: args.sys_root.display().to_string(),
        interfaces: plan.uplinks.clone(),
        interfaces_from: plan.uplinks_from.clone(),
        summary: Report::summarize(&checks),
        checks,
    };
    match args.output {
        Output::Table => print!("{}", report.to_table()),
        Output::Json => println!("{}", serde_json::to_string(&report)?),
    }
    let failed = report.failed();
    if failed.is_empty() {
        return Ok(());
    }
    Err(Found(format!(
        "doctor: {} check(s) failed: {}",
        failed.len(),
        failed.join(", ")
    ))
    .into())
}
