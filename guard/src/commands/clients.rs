//! `arp-guard clients [IP]`: the clients whose traffic for an LB IP that
//! another node owns arrives at this node, as the running daemon's census
//! saw it. Exit 1 when a stale client is listed (as `responders` does for
//! a conflict).

use anyhow::Result;

use super::query::{per_ip, show, table_fill};
use crate::{
    cli::LbIpArgs,
    model::clients::{Cause, ClientState, IpClients},
    telemetry::clients::ClientsDoc,
};

pub async fn clients(args: &LbIpArgs) -> Result<()> {
    let path = per_ip("/clients", args.ip);
    let v: ClientsDoc = show(&args.client, &path, print_clients).await?;
    let stale: usize = v.ips.values().map(|c| c.stale).sum();
    super::Found::if_any(stale, "stale client(s)")
}

fn print_clients(v: &ClientsDoc) {
    println!(
        "misdirected clients: stale after {} s, {}",
        v.stale_after_seconds,
        table_fill(v.entries, v.capacity, v.error.as_deref())
    );
    let h = &v.failover;
    if h.count > 0 {
        println!(
            "failover times of clients that followed a move: {} observed, half within {}, 90% within {}",
            h.count,
            quantile_bound(h, 0.5),
            quantile_bound(h, 0.9)
        );
    }
    let listed: Vec<_> = v
        .ips
        .iter()
        .filter(|(_, c)| !c.clients.is_empty())
        .collect();
    if listed.is_empty() {
        println!("no misdirected client seen");
        return;
    }
    println!(
        "{:<16} {:<20} {:<18} {:<16} {:<7} {:>7} {:>6} {:>6} {:>11} {:>9} INTERFACE",
        "LB IP",
        "CAUSE",
        "MAC",
        "CLIENT IP",
        "STATUS",
        "PACKETS",
        "FIRST",
        "LAST",
        "MISDIRECTED",
        "FAILOVER"
    );
    for (ip, c) in listed {
        for (i, cl) in c.clients.iter().enumerate() {
            let (ip_col, cause_col) = if i == 0 {
                (ip.to_string(), cause(c))
            } else {
                (String::new(), String::new())
            };
            let status = match cl.status {
                ClientState::Stale => "STALE",
                s => s.as_str(),
            };
            let vlan = cl.vlan.map(|v| format!(" vlan {v}")).unwrap_or_default();
            println!(
                "{ip_col:<16} {cause_col:<20} {:<18} {:<16} {status:<7} {:>7} {:>5}s {:>5}s {:>10.1}s {:>9} {}{vlan}",
                cl.mac,
                cl.client_ip.to_string(),
                cl.packets,
                cl.first_seen_ago_s,
                cl.last_seen_ago_s,
                cl.misdirected_s,
                cl.failover_s.map_or_else(|| "-".into(), |f| format!("{f:.1}s")),
                cl.interface,
            );
        }
        if c.more > 0 {
            println!("{:<16} {:<20} ... and {} more clients", "", "", c.more);
        }
    }
}

/// Why clients of one IP come here, for the table.
fn cause(c: &IpClients) -> String {
    match (c.cause, c.moved_ago_s) {
        (Some(Cause::AfterMove), Some(ago)) => format!("moved away {ago}s ago"),
        (Some(Cause::NotOwnedHere), _) => "not owned here".into(),
        _ => c.state.as_str().into(),
    }
}

/// The smallest bucket bound under which at least `q` of the observations
/// fall ("> last bound" when it is the +Inf bucket).
fn quantile_bound(h: &crate::telemetry::clients::Histogram, q: f64) -> String {
    let want = (h.count as f64 * q).ceil() as u64;
    let mut seen = 0;
    for (i, n) in h.counts.iter().enumerate() {
        seen += n;
        if seen >= want.max(1) {
            return match h.bounds.get(i) {
                Some(b) => format!("{b} s"),
                None => format!("> {} s", h.bounds.last().copied().unwrap_or(0.0)),
            };
        }
    }
    "-".into()
}
