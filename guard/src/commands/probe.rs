//! `arp-guard probe`: who answers ARP (IPv4) or Neighbor Discovery (IPv6)
//! for these IPs, over time.

use std::{
    io::Write as _,
    net::{Ipv4Addr, Ipv6Addr},
};

use anyhow::{bail, Result};
use tokio::signal::unix::{signal, SignalKind};

use super::Found;
use crate::{
    cli::{Output, ProbeArgs},
    model::fmt_mac,
    probe::{
        host::{NetHost, CAP_NET_ADMIN},
        packet::PacketSocket,
        report::Summary,
        run, Event, NeighMode, PacketIo as _,
    },
};

/// The line printed as a MAC first claims an IP (table output).
fn event_line(ev: &Event) -> String {
    let Event::NewResponder(r) = ev;
    let note = match r.responders {
        1 => String::new(),
        n => format!("  ({n} responders!)"),
    };
    format!(
        "+{:.3}s  {}  is at {}{note}",
        r.at.as_secs_f64(),
        r.ip,
        fmt_mac(&r.mac)
    )
}

/// The senders: `--source`, else for ARP the interface's primary IPv4,
/// else 0.0.0.0 (an RFC 5227 ARP probe); for NDP its link-local address.
async fn sources(args: &ProbeArgs, host: &NetHost) -> Result<(Ipv4Addr, Ipv6Addr)> {
    let v4 = host.primary_ipv4().await?.unwrap_or(Ipv4Addr::UNSPECIFIED);
    let v6 = if args.has_family(false) {
        host.link_local().await?
    } else {
        None
    };
    args.sources(v4, v6)
}

/// `arp-guard probe`.
pub async fn probe(args: &ProbeArgs) -> Result<()> {
    // The flags first: a typo is not a missing capability (the sources are
    // known once the interface is open).
    args.plan(Ipv4Addr::UNSPECIFIED, Ipv6Addr::UNSPECIFIED)?;
    let neigh = NeighMode::from(args.neigh);
    if neigh != NeighMode::Keep
        && crate::daemon::effective_caps().is_some_and(|c| c & (1 << CAP_NET_ADMIN) == 0)
    {
        bail!(
            "--neigh {} changes this host's neighbour table, which needs CAP_NET_ADMIN: run as root \
             or grant it (or use --neigh keep)",
            neigh.as_str()
        );
    }
    let iface = args.interface.as_str();
    let mut socket = PacketSocket::open(iface, args.has_family(true), args.has_family(false))?;
    let host = NetHost::open(iface)?;
    let (source, source6) = sources(args, &host).await?;
    let plan = args.plan(source, source6)?;
    // Installed before the first request: from here on Ctrl-C, SIGTERM or
    // SIGHUP (the ssh session that ran it went away) ends the probe with the
    // summary so far, and pins are removed.
    let mut int = signal(SignalKind::interrupt())?;
    let mut term = signal(SignalKind::terminate())?;
    let mut hup = signal(SignalKind::hangup())?;
    let stop = async {
        tokio::select! {
            _ = int.recv() => {}
            _ = term.recv() => {}
            _ = hup.recv() => {}
        }
    };
    let table = args.output == Output::Table;
    if table {
        let how_long = match plan.duration {
            Some(d) => format!("for {d:?}"),
            None => format!("{} times", plan.rounds),
        };
        println!(
            "probing {} IP(s) from {iface} every {:?} {how_long}; Ctrl-C prints the summary so far",
            plan.ips.len(),
            plan.interval
        );
        let _ = std::io::stdout().flush();
    }
    let outcome = run(&mut socket, &host, &plan, stop, |ev| {
        if table {
            println!("{}", event_line(&ev));
            let _ = std::io::stdout().flush();
        }
    })
    .await?;
    let summary = Summary::new(&outcome, iface, socket.mac(), &plan);
    match args.output {
        Output::Table => print!("\n{}", summary.table()),
        Output::Json => println!("{}", serde_json::to_string(&summary)?),
    }
    let _ = std::io::stdout().flush();
    match summary.problems() {
        None => Ok(()),
        Some(p) => Err(Found(p).into()),
    }
}
