//! `arp-guard status --cluster`: every guard of the cluster as the running
//! daemon's presence reads them, and the nodes without one.

use anyhow::Result;

use super::query::show;
use crate::{api::cluster::ClusterDoc, cli::ClientArgs};

/// Exit status 1 when a node has no live guard (or its guard is degraded).
pub async fn cluster(args: &ClientArgs) -> Result<()> {
    let doc: ClusterDoc = show(args, "/cluster", print_doc).await?;
    let uncovered = doc.uncovered.as_ref().is_some_and(|u| !u.is_empty());
    let unwell = doc.guards.iter().any(|g| !g.live || g.health == "degraded");
    if uncovered || unwell {
        std::process::exit(1);
    }
    Ok(())
}

fn print_doc(doc: &ClusterDoc) {
    if !doc.enabled {
        println!(
            "presence is off on this guard (--presence-period 0, or no Kubernetes API in use)"
        );
        return;
    }
    println!(
        "presence Leases in namespace {}; current {} ago; this guard's record {}",
        doc.namespace,
        doc.read_age_s
            .map_or_else(|| "never".into(), |s| format!("{s}s")),
        if doc.published {
            "published"
        } else {
            "not published yet"
        }
    );
    println!(
        "{:<24} {:<8} {:<11} {:>6}  INTERFACES",
        "NODE", "MODE", "HEALTH", "AGE"
    );
    for g in &doc.guards {
        let ifaces: Vec<String> = (g.interfaces.iter())
            .map(|i| format!("{} {}", i.name, i.mac))
            .collect();
        let health = if g.live {
            g.health.as_str()
        } else {
            "not ready"
        };
        println!(
            "{:<24} {:<8} {:<11} {:>5}s  {}",
            g.node,
            g.mode,
            health,
            g.age_s,
            ifaces.join(", ")
        );
    }
    match (&doc.uncovered, &doc.nodes_error) {
        (Some(u), _) if u.is_empty() => println!("every node of the cluster runs a live guard"),
        (Some(u), _) => println!("nodes without a live guard ({}): {}", u.len(), u.join(", ")),
        (None, Some(e)) => println!("coverage unknown: {e}"),
        (None, None) => println!("coverage unknown: the nodes were not read yet (ask again)"),
    }
    if doc.skipped > 0 {
        println!(
            "{} presence Leases skipped (malformed or too large)",
            doc.skipped
        );
    }
    for (what, e) in &doc.errors {
        println!("  failing: {what}: {e}");
    }
}
