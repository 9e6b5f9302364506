//! `arp-guard doctor`: why this node might answer ARP for LB IPs it does
//! not own, one line per check. The gathering reads files under the given
//! procfs and sysfs roots (`node`), addresses through netlink, the running
//! guard through its API or pins (`guard_view`) and kube-proxy's ConfigMap
//! (`kube_proxy`); the checks (`arp`, `path`, `guard_checks`) are pure
//! functions of what was gathered (`facts`), unit-tested on fixture trees.

mod arp;
mod facts;
mod guard_checks;
mod guard_view;
mod kube_proxy;
mod node;
mod path;
mod report;

#[cfg(test)]
mod tests;

use std::time::Duration;

use anyhow::Result;

pub use report::{Check, Report, Status};

use self::{
    facts::{default_uplinks, Facts, Plan},
    guard_view::GuardView,
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
pub fn run_checks(f: &Facts, plan: &Plan) -> Vec<Check> {
    let mut out = vec![kube_proxy::check(&f.kube_proxy)];
    if plan.uplinks.is_empty() {
        out.push(
            Check::new(
                "interfaces",
                None,
                Status::Warn,
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

/// The IPv4 addresses of every interface, through netlink.
async fn read_addrs() -> Result<AddrTable, String> {
    let (conn, handle, _) =
        rtnetlink::new_connection().map_err(|e| format!("cannot open an rtnetlink socket: {e}"))?;
    let task = tokio::spawn(conn);
    let r = tokio::time::timeout(Duration::from_secs(5), crate::sources::addrs::dump(&handle))
        .await
        .map_err(|_| "the netlink dump took more than 5 s".to_owned())
        .and_then(|r| r.map_err(|e| format!("{e:#}")));
    task.abort();
    r
}

/// Gather what the checks need.
async fn gather(args: &DoctorArgs) -> (Facts, Plan) {
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
    let (mut guard, kube_proxy, addrs) =
        tokio::join!(GuardView::read(args.api, &args.pin_dir), kube, read_addrs());
    let mut node = Node::read(&args.proc_root, &args.sys_root);
    let (uplinks, uplinks_from) = if args.interfaces.is_empty() {
        default_uplinks(&node, &addrs, &guard, &args.lb_ips_from)
    } else {
        (args.interfaces.clone(), "--interface".to_owned())
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
        lb_ifaces: args.lb_ips_from.clone(),
        clients: args.client.clone(),
        pin_dir: args.pin_dir.display().to_string(),
    };
    let facts = Facts {
        node,
        addrs,
        guard,
        kube_proxy,
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
