//! The subcommands, each a thin function over the parts: `run` starts the
//! daemon; `counters`, `validate` and `uninstall` work on the node; `status`,
//! `explain`, `events` and `responders` ask the running daemon (`query`),
//! and `clients` (`clients`);
//! `doctor` checks the node (`doctor`); `probe` asks the segment, from any
//! host on it.

mod clients;
mod cluster;
mod doctor;
mod probe;
mod probes;
mod query;

use std::time::Duration;

use anyhow::{Context as _, Result};
use aya::programs::TcAttachType;

pub use clients::clients;
pub use doctor::doctor;
pub use probe::probe;
pub use query::{events, explain, responders};

/// `arp-guard status [--cluster | --probes]`.
pub async fn status(args: &crate::cli::StatusArgs) -> Result<()> {
    if args.cluster {
        cluster::cluster(&args.client).await
    } else if args.probes {
        probes::probes(&args.client).await
    } else {
        query::status(args).await
    }
}

use crate::{
    api::client,
    cli::{CountersArgs, Output, RunArgs, UninstallArgs, ValidateArgs},
    datapath::{attach::remove_netlink_filter, pins, sys::interface_names},
    model::{addrs::AddrTable, view},
    sources::file,
    telemetry::counters::{CountersDoc, Snapshot},
};

/// A command that found a problem, and the exit codes that tell it from one
/// that could not finish (shared with `kubectl arp-guard`, which reads the
/// guards' by the same rule).
pub use guard_wire::cli::{Found, EXIT_TROUBLE};

/// `arp-guard run`: the daemon, until SIGTERM/SIGINT.
pub async fn run(args: &RunArgs) -> Result<()> {
    for d in args.deprecations() {
        tracing::warn!("{d}");
    }
    crate::daemon::run(args.config()?).await
}

/// The counters of the guard on `iface`: from the running daemon's API, else
/// from its pins, else through the kernel (TCX query and map ids: root only).
async fn counters_of(iface: &str, args: &CountersArgs) -> Result<CountersDoc> {
    let mut tried = Vec::new();
    match client::get(args.api, &format!("/counters?interface={iface}")).await {
        Ok((200, body)) => return Ok(serde_json::from_str(&body)?),
        Ok((404, body)) => anyhow::bail!("{}", body.trim()),
        Ok((code, body)) => tried.push(format!(
            "the API on {} answered {code}: {}",
            args.api,
            body.trim()
        )),
        Err(e) => tried.push(format!("{e:#}")),
    }
    match Snapshot::of_pins(&args.pin_dir) {
        Ok(s) => return Ok(s.to_doc().only(Some(iface))),
        Err(e) => tried.push(format!("pins: {e:#}")),
    }
    match Snapshot::of_attached(iface) {
        Ok(s) => return Ok(s.to_doc().only(Some(iface))),
        Err(e) => tried.push(format!("kernel (TCX): {e:#}")),
    }
    // Kernels before 6.6: the guard is a netlink filter in its own slot.
    match netlink_guard_id(iface)
        .await
        .and_then(Snapshot::of_program_id)
    {
        Ok(s) => Ok(s.to_doc().only(Some(iface))),
        Err(e) => {
            tried.push(format!("kernel (netlink filter): {e:#}"));
            anyhow::bail!(
                "cannot read the counters of {iface}:\n  {}",
                tried.join("\n  ")
            )
        }
    }
}

/// The program id of arp-guard's netlink filter on `iface`'s egress.
async fn netlink_guard_id(iface: &str) -> Result<u32> {
    let index = crate::datapath::sys::ifindex(iface)?;
    let filters = crate::datapath::inspect::netlink_egress(index).await?;
    filters
        .iter()
        .find(|f| f.is_guard())
        .and_then(|f| f.id)
        .with_context(|| format!("no arp-guard netlink filter on {iface} egress"))
}

/// `arp-guard counters`.
pub async fn counters(args: &CountersArgs) -> Result<()> {
    for iface in &args.uplinks {
        let doc = counters_of(iface, args).await?;
        match args.output {
            Output::Table => {
                println!("== {iface} egress");
                print!("{}", doc.to_table());
            }
            Output::Json => {
                let mut v = serde_json::to_value(&doc)?;
                v["interface"] = serde_json::Value::String(iface.clone());
                println!("{v}");
            }
        }
    }
    Ok(())
}

/// `arp-guard uninstall`: every pin and attachment a guard left.
pub async fn uninstall(args: &UninstallArgs) -> Result<()> {
    crate::daemon::check_capabilities()?;
    let dir = &args.pin_dir;
    // Held while the pins go, so that no daemon starts on them half-way.
    let deadline = tokio::time::Instant::now() + args.wait;
    let lock = loop {
        match pins::try_lock(dir) {
            Ok(lock) => break lock,
            Err(_) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(pid) => {
                let who = pid.map_or_else(
                    || "a running arp-guard".to_owned(),
                    |p| format!("arp-guard pid {p}"),
                );
                if !args.force {
                    anyhow::bail!(
                        "{who} holds --pin-dir {}: stop it first (uninstalling under it would take the guard \
                         away from a daemon that relies on it), or pass --force",
                        dir.display()
                    );
                }
                eprintln!("arp-guard: --force: removing the pins {who} holds");
                break None;
            }
        }
    };
    for name in pins::uninstall(dir)? {
        println!("removed {}/{name}", dir.display());
    }
    let names = if args.uplinks.is_empty() {
        interface_names()
    } else {
        args.uplinks.clone()
    };
    // One interface failing (gone meanwhile) does not stop the others.
    let mut failed = Vec::new();
    for iface in names {
        match remove_netlink_filter(&iface, TcAttachType::Egress) {
            Ok(true) => println!("removed the netlink filter from {iface}"),
            Ok(false) => {}
            Err(e) => failed.push(format!("{iface}: {e:#}")),
        }
        // The census's filter only observes, but it is ours to take away.
        match remove_netlink_filter(&iface, TcAttachType::Ingress) {
            Ok(true) => println!("removed the census filter from {iface} ingress"),
            Ok(false) => {}
            Err(e) => failed.push(format!("{iface} ingress: {e:#}")),
        }
    }
    if !failed.is_empty() {
        anyhow::bail!("could not check every interface: {}", failed.join("; "));
    }
    if args.stay {
        drop(lock);
        println!("arp-guard is removed from this node; waiting for SIGTERM");
        wait_for_termination().await?;
    }
    Ok(())
}

/// Until SIGTERM or SIGINT.
async fn wait_for_termination() -> Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    Ok(())
}

/// `arp-guard validate`: check a file and print a node's view of it.
pub fn validate(args: &ValidateArgs) -> Result<()> {
    let path = &args.file;
    let parsed = file::load(path, args.max_bytes)?;
    let node = crate::daemon::node_name(args.node_name.clone())?;
    let v = view::compute(&view::Inputs {
        node: &node,
        file: Some(&parsed),
        lb_ifaces: &[],
        uplinks: &[],
        addrs: &AddrTable::default(),
        cluster: None,
    });
    println!(
        "{}: valid, {} IPs; as seen from node {node}:",
        path.display(),
        parsed.ips.len()
    );
    for (ip, e) in &parsed.ips {
        let state = v.lb.get(ip).map_or("?", |l| l.state.as_str());
        println!(
            "  line {:<4} {:<40} owner={:<20} {state}",
            e.line,
            ip,
            e.owner.as_deref().unwrap_or("-")
        );
    }
    Ok(())
}
