//! `arp-guard status --probes`: the running daemon's active census — the LB
//! IPs it asks about, who answered its latest request, and the verdicts.

use anyhow::Result;

use super::query::show;
use crate::{cli::ClientArgs, model::probing::ProbingVerdict, telemetry::probing::ProbesDoc};

/// Exit status 1 when an IP's verdict is a conflict, a silent owner or a
/// wrong interface.
pub async fn probes(args: &ClientArgs) -> Result<()> {
    let doc: ProbesDoc = show(args, "/probes", print_doc).await?;
    let bad: usize = (doc.verdicts.iter())
        .filter(|(v, _)| v.bad())
        .map(|(_, n)| n)
        .sum();
    super::Found::if_any(bad, "LB IP(s) with a bad verdict")
}

fn print_doc(doc: &ProbesDoc) {
    println!(
        "active census: {} IP(s) asked here, each every {:.0} s ({} asker(s) per IP among {} live guard(s); at most {}/s here, {}/s cluster-wide); sent {} ARP, {} NS, {} failed{}",
        doc.ips.len(),
        doc.interval_seconds,
        doc.askers_per_ip,
        doc.live_guards,
        doc.node_max_per_second,
        doc.cluster_max_per_second,
        doc.sent.get("ipv4").copied().unwrap_or(0),
        doc.sent.get("ipv6").copied().unwrap_or(0),
        doc.send_errors,
        doc.paused
            .as_deref()
            .map(|p| format!("; PAUSED: {p}"))
            .unwrap_or_default()
    );
    if doc.ips.is_empty() {
        return;
    }
    println!(
        "{:<24} {:<16} {:<16} {:>6} {:>10}  ANSWERED BY (LATEST REQUEST)",
        "LB IP", "OWNER", "VERDICT", "ASKED", "UNANSWERED"
    );
    // The bad verdicts first.
    let mut rows: Vec<_> = doc.ips.iter().collect();
    rows.sort_by_key(|(ip, p)| (!p.verdict.bad(), p.verdict != ProbingVerdict::Pending, **ip));
    for (ip, p) in rows {
        println!(
            "{:<24} {:<16} {:<16} {:>6} {:>10}  {}",
            ip.to_string(),
            p.owner.as_deref().unwrap_or("-"),
            p.verdict.as_str(),
            p.asked,
            p.unanswered_in_a_row,
            if p.answered_by.is_empty() {
                "nobody".to_owned()
            } else {
                p.answered_by.join(", ")
            }
        );
    }
}
