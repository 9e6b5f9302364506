//! `arp-guard status | explain | events`: clients of the running daemon's
//! API, reading its documents with the same types it writes them with.

use std::net::IpAddr;

use anyhow::{bail, Context as _, Result};
use guard_common::Verdict;
use serde::de::DeserializeOwned;

use crate::{
    api::{
        client,
        types::{Explanation, Lagged, StatusDoc},
    },
    cli::{ClientArgs, ExplainArgs, LbIpArgs, Output, StatusArgs},
    telemetry::{
        census::{CensusDoc, ConflictEvent},
        events::EventJson,
        status::{DaemonStatus, InterfaceState},
    },
};

/// GET `path` and read the answer as `T` (the raw JSON too, for `-o json`).
pub(super) async fn fetch<T: DeserializeOwned>(
    args: &ClientArgs,
    path: &str,
) -> Result<(T, String)> {
    let (code, body) = client::get(args.api, path).await?;
    if code != 200 {
        bail!("the daemon answered {code} for {path}: {}", body.trim());
    }
    let doc = serde_json::from_str(&body).with_context(|| {
        format!("the daemon's answer to {path} is not what this arp-guard reads")
    })?;
    Ok((doc, body))
}

/// GET `path` and show it: the daemon's JSON as it came for `-o json`, else
/// `print`'s text. The document is returned for the command's exit status.
pub(super) async fn show<T: DeserializeOwned>(
    args: &ClientArgs,
    path: &str,
    print: impl FnOnce(&T),
) -> Result<T> {
    let (doc, raw) = fetch(args, path).await?;
    if args.output == Output::Json {
        print!("{raw}");
    } else {
        print(&doc);
    }
    Ok(doc)
}

/// "table 3/4096 entries", and why the table could not be read if so.
pub(super) fn table_fill(entries: usize, capacity: u32, error: Option<&str>) -> String {
    let unreadable = error.map(|e| format!(", unreadable: {e}"));
    format!(
        "table {entries}/{capacity} entries{}",
        unreadable.unwrap_or_default()
    )
}

/// The path of a per-LB-IP document: every IP's, or only `ip`'s.
pub(super) fn per_ip(path: &str, ip: Option<IpAddr>) -> String {
    match ip {
        Some(ip) => format!("{path}?ip={ip}"),
        None => path.into(),
    }
}

fn or_dash<T: ToString>(v: Option<T>) -> String {
    v.map_or_else(|| "-".into(), |v| v.to_string())
}

pub async fn status(s: &StatusArgs) -> Result<()> {
    let args = &s.client;
    let (mut v, raw): (StatusDoc, String) = fetch(args, "/status").await?;
    if s.brief {
        v = v.brief();
    }
    if let Some(ip) = s.ip {
        v = v.only(ip);
    }
    if args.output == Output::Json {
        if s.brief || s.ip.is_some() {
            println!("{}", serde_json::to_string(&v)?);
        } else {
            print!("{raw}");
        }
        return Ok(());
    }
    let st = v.status.as_ref();
    println!(
        "node {}  mode {}  ready {}  version {}",
        or_dash(st.map(|s| &s.node)),
        or_dash(st.map(|s| &s.mode)),
        v.ready,
        v.version
    );
    for r in &v.not_ready {
        println!("  not ready: {r}");
    }
    if let Some(st) = st {
        print_state(st, v.census.is_some());
    }
    print_census_summary(&v);
    if let Some(t) = &v.takeovers {
        let n = |k: &str| t.announcements.get(k).copied().unwrap_or(0);
        println!(
            "  takeovers {} (silent {}); announcements held now {}, replayed {}, expired {}",
            t.takeovers,
            t.silent,
            t.held_now,
            n("replayed"),
            n("expired")
        );
    }
    println!();
    println!(
        "{:<24} {:<8} {:<10} {:<10} {:<10} {:<16} SOURCE",
        "LB IP", "STATE", "PASSED", "DROPPED", "REWRITTEN", "TAKEOVER"
    );
    for row in &v.ips {
        // Monitor mode's would_* count with what enforce would have done.
        let n = |v: Verdict| row.counters.get(&v).copied().unwrap_or(0);
        println!(
            "{:<24} {:<8} {:<10} {:<10} {:<10} {:<16} {}",
            row.ip,
            row.entry.state.as_str(),
            n(Verdict::Passed),
            n(Verdict::Dropped) + n(Verdict::WouldDrop),
            n(Verdict::Rewritten) + n(Verdict::WouldRewrite),
            row.takeover
                .as_ref()
                .map_or_else(|| "-".into(), takeover_cell),
            row.entry.source
        );
    }
    print_findings(&v);
    Ok(())
}

/// The IPs in conflict, those whose Services were elected separately, and
/// those whose clients still send here.
fn print_findings(v: &StatusDoc) {
    let splits: Vec<_> = (v.ips.iter())
        .filter_map(|r| Some((r.ip, r.entry.split.as_ref()?)))
        .collect();
    if !splits.is_empty() {
        println!();
        println!("SPLIT ELECTIONS (Services sharing an IP, elected on different nodes; arp-guard explain IP)");
        for (ip, s) in splits {
            println!("  {ip:<16} {}", s.summary());
        }
    }
    if !v.conflicts.is_empty() {
        println!();
        println!("CONFLICTS (arp-guard responders IP for the detail)");
        for c in &v.conflicts {
            println!(
                "  {:<16} {:<18} {}",
                c.ip,
                c.reason.as_str(),
                c.macs.join(" ")
            );
        }
    }
    if !v.clients.is_empty() {
        println!();
        println!("CLIENTS STILL SENDING HERE (arp-guard clients IP for the detail)");
        for c in &v.clients {
            println!("  {:<16} sending {:<5} stale {}", c.ip, c.sending, c.stale);
        }
    }
}

/// A takeover in a few characters: "12ms guard", "silent", "silent 9s".
fn takeover_cell(t: &crate::model::takeover::TakeoverRecord) -> String {
    match (t.first_announcement_ms, t.silent) {
        (Some(ms), false) => format!("{ms}ms {}", or_dash(t.via.map(|v| v.as_str()))),
        (Some(ms), true) => format!("silent {}s", ms / 1000),
        (None, true) => "silent".into(),
        (None, false) => "waiting".into(),
    }
}

/// Attachments, feed and LB IP counts of `status`.
fn print_state(st: &DaemonStatus, census_on: bool) {
    if let Some(d) = &st.owner_link_down {
        println!(
            "  OWNER LINK DOWN: this node owns {} LB IP(s) and its uplinks ({}) have no carrier: nobody can hear it answer",
            d.owned,
            d.interfaces.join(", ")
        );
    }
    for i in &st.interfaces {
        let why: Vec<&str> = i.chosen_by.iter().map(|c| c.text.as_str()).collect();
        println!(
            "  interface {:<12} {:<9} {}{}{}{}",
            i.name,
            i.state.as_str(),
            i.detail,
            if i.carrier == Some(false) {
                "  NO CARRIER"
            } else {
                ""
            },
            match (&i.census, census_on) {
                (Some(how), _) => format!("  census {how}"),
                // The census runs, but not here (no TCX on this kernel?).
                (None, true) if i.state == InterfaceState::Attached =>
                    "  census not attached (see the log)".into(),
                _ => String::new(),
            },
            if why.is_empty() {
                String::new()
            } else {
                format!("  chosen: {}", why.join("; "))
            }
        );
    }
    if let Some(f) = &st.feed {
        println!(
            "  kubernetes feed: announcers {:?}  synced {}  blind {}  degraded {}  unconfirmed leases {}",
            f.announcers, f.synced, f.blind, f.degraded, f.unconfirmed_leases
        );
        for s in &f.streams {
            let health = if s.healthy { "healthy" } else { "FAILING" };
            println!(
                "    stream {:<32} {health} {}",
                s.name,
                s.error.as_deref().unwrap_or("")
            );
        }
    }
    let c = &st.lb_ips;
    println!(
        "  LB IPs {} (owned {}, foreign {}, unknown {}), not enforced {}, map memory {} bytes",
        c.total, c.owned, c.foreign, c.unknown, st.not_enforced, st.map_memory_bytes
    );
    if let Some(m) = &st.memory {
        println!("  {}", memory_line(m));
    }
}

/// What the memory cgroup counts of the daemon, against its limit.
fn memory_line(m: &crate::telemetry::memory::MemoryStatus) -> String {
    let mib = |b: u64| b as f64 / f64::from(1 << 20);
    let limit = m.limit_bytes.map_or("no limit found".to_owned(), |l| {
        format!(
            "of {:.1} MiB ({:.1} %)",
            mib(l),
            100.0 * m.used() as f64 / l.max(1) as f64
        )
    });
    let level = match m.level {
        crate::telemetry::memory::Level::Ok => "ok",
        crate::telemetry::memory::Level::Warning => "WARNING: raise the limit",
        crate::telemetry::memory::Level::Pressure => {
            "PRESSURE: no new Kubernetes object is taken in; raise the limit"
        }
    };
    format!(
        "memory {:.1} MiB (resident {:.1}, maps {:.1}) {limit}: {level}",
        mib(m.used()),
        mib(m.rss_bytes),
        mib(m.maps_bytes)
    )
}

/// The census line of `status`.
fn print_census_summary(v: &StatusDoc) {
    match &v.census {
        Some(c) => println!(
            "  responder census: {} LB IPs claimed in the last {} s, table {}/{}{}; misdirected clients sending here: {} ({} stale{})",
            c.ips_claimed,
            c.window_seconds,
            c.entries,
            c.capacity,
            c.error
                .as_deref()
                .map(|e| format!(", unreadable: {e}"))
                .unwrap_or_default(),
            c.misdirected_clients,
            c.stale_clients,
            if c.stale_clients > 0 { ": arp-guard clients" } else { "" }
        ),
        None => println!("  responder census: off"),
    }
}

pub async fn explain(args: &ExplainArgs) -> Result<()> {
    let (v, raw): (Explanation, String) =
        fetch(&args.client, &format!("/explain?ip={}", args.ip)).await?;
    if args.client.output == Output::Json {
        print!("{raw}");
        return Ok(());
    }
    if !v.lb_ip {
        println!(
            "{} is not an LB IP for this node: its ARP and NDP frames pass untouched.",
            args.ip
        );
        return Ok(());
    }
    let guarded_in = if args.ip.is_ipv6() {
        "Neighbor Discovery"
    } else {
        "ARP"
    };
    println!(
        "{} is {} on this node (guarded in {guarded_in})",
        args.ip,
        or_dash(v.state.map(|s| s.as_str()))
    );
    println!("  because: {}", or_dash(v.source.as_ref()));
    if let Some(sp) = &v.split {
        println!("  SPLIT ELECTION: the Services sharing it were elected on different nodes, each of which announces it:");
        for x in &sp.services {
            println!(
                "    {:<32} {:<16} {}{}",
                x.service,
                x.holder.as_deref().unwrap_or("-"),
                x.record,
                if x.local {
                    "  (externalTrafficPolicy: Local)"
                } else {
                    ""
                }
            );
        }
        println!("    {}", sp.settle);
    }
    println!(
        "  known for {} s; mode {}, leak action {}",
        or_dash(v.known_for_seconds),
        or_dash(v.mode.map(|m| m.as_str())),
        or_dash(v.leak_action.map(|l| l.as_str()))
    );
    if let Some(t) = &v.takeover {
        println!(
            "  last taken over by this node {} s ago: {}",
            crate::api::state::unix_now().saturating_sub(t.at_unix),
            match (t.first_announcement_ms, t.silent) {
                (Some(ms), false) => format!(
                    "first announcement after {ms} ms (via {})",
                    or_dash(t.via.map(|v| v.as_str()))
                ),
                (Some(ms), true) =>
                    format!("SILENT for --silent-takeover-after; announced after {ms} ms"),
                (None, true) => "SILENT: no announcement left this node".into(),
                (None, false) => "no announcement yet".into(),
            }
        );
    }
    println!("  what the program does with it:");
    println!(
        "    {:<12} {:<14} {:<8} VERDICT",
        "INTERFACE", "KIND", "ORIGIN"
    );
    for w in &v.would {
        println!(
            "    {:<12} {:<14} {:<8} {}",
            w.interface,
            w.kind.as_str(),
            w.origin.as_str(),
            w.verdict.as_str()
        );
    }
    Ok(())
}

/// `arp-guard responders [IP]`: who claims each LB IP on the segment, as
/// this node's census saw it. Exit 1 when an IP shown is in conflict.
pub async fn responders(args: &LbIpArgs) -> Result<()> {
    let path = per_ip("/responders", args.ip);
    let v: CensusDoc = show(&args.client, &path, print_census).await?;
    let n = v.ips.values().filter(|c| c.conflict.is_some()).count();
    super::Found::if_any(n, "LB IP(s) in conflict")
}

fn print_census(v: &CensusDoc) {
    println!(
        "responder census: window {} s, {}",
        v.window_seconds,
        table_fill(v.entries, v.capacity, v.error.as_deref())
    );
    if v.ips.is_empty() {
        println!("no claim of an LB IP seen yet");
        return;
    }
    println!(
        "{:<16} {:<18} {:<18} {:>7} {:>6} {:>6} {:<12} KINDS",
        "LB IP", "VERDICT", "MAC", "CLAIMS", "FIRST", "LAST", "INTERFACE"
    );
    for (ip, c) in &v.ips {
        let verdict = match (c.conflict, c.active) {
            (Some(r), _) => format!("CONFLICT:{}", r.as_str()),
            (None, 0) => "no current claim".into(),
            (None, 1) => "one responder".into(),
            (None, n) => format!("{n} (moved)"),
        };
        for (i, r) in c.responders.iter().enumerate() {
            let mac = if r.local {
                format!("{} (this node)", r.mac)
            } else {
                r.mac.clone()
            };
            let mark = if r.active { "" } else { " (old)" };
            println!(
                "{:<16} {:<18} {:<18} {:>7} {:>5}s {:>5}s {:<12} {}{mark}",
                if i == 0 {
                    ip.to_string()
                } else {
                    String::new()
                },
                if i == 0 { verdict.as_str() } else { "" },
                mac,
                r.claims,
                r.first_seen_ago_s,
                r.last_seen_ago_s,
                r.interface,
                r.kinds.join(",")
            );
        }
        if c.more > 0 {
            println!("{:<16} {:<18} ... and {} more MACs", "", "", c.more);
        }
        // Who the claimants are, by node (presence).
        for w in crate::model::census::claims_in_words(*ip, c) {
            println!("{:<16} {w}", "");
        }
    }
}

/// Any other event line (`takeover_announced`, `silent_takeover`, ...):
/// its time, its name, then its other fields as key=value.
fn other_event(line: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(line).ok()?;
    let o = v.as_object()?;
    let event = o.get("event")?.as_str()?;
    let mut out = format!(
        "{} {event}",
        o.get("time").and_then(|t| t.as_str()).unwrap_or("-")
    );
    for (k, v) in o.iter().filter(|(k, _)| *k != "event" && *k != "time") {
        match v.as_str() {
            Some(s) => out.push_str(&format!(" {k}={s}")),
            None => out.push_str(&format!(" {k}={v}")),
        }
    }
    Some(out)
}

pub async fn events(args: &ClientArgs) -> Result<()> {
    let json = args.output == Output::Json;
    let print = |line: &str| {
        if json {
            println!("{line}");
            return;
        }
        if let Ok(e) = serde_json::from_str::<EventJson>(line) {
            println!(
                "{} {} {} {} {} lb_ip={} requester={} {} state={}",
                e.time,
                e.interface,
                e.verdict,
                e.kind,
                e.origin,
                e.lb_ip,
                e.requester_ip,
                e.requester_mac,
                e.state
            );
        } else if let Ok(c) = serde_json::from_str::<ConflictEvent>(line) {
            println!(
                "{} {} lb_ip={} reason={} macs={}",
                c.time,
                c.event,
                c.lb_ip,
                c.reason.as_str(),
                c.macs.join(",")
            );
        } else if let Some(e) = other_event(line) {
            println!("{e}");
        } else if let Ok(l) = serde_json::from_str::<Lagged>(line) {
            println!("(the stream fell behind: {} events skipped)", l.lagged);
        } else {
            println!("{line}");
        }
    };
    let (code, body) = client::stream_lines(args.api, "/events", print).await?;
    if code != 200 {
        bail!("the daemon answered {code}: {}", body.trim());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::telemetry::memory::{Level, MemoryStatus};

    /// The line an operator reads when a pod is OOM-killed: what the
    /// cgroup counts, of which limit, and what to do at each level.
    #[test]
    fn the_memory_line_says_the_share_of_the_limit_and_what_to_do() {
        let mut m = MemoryStatus {
            rss_bytes: 48 << 20,
            maps_bytes: 8 << 20,
            limit_bytes: Some(64 << 20),
            level: Level::Warning,
        };
        let l = super::memory_line(&m);
        assert!(
            l.starts_with("memory 56.0 MiB (resident 48.0, maps 8.0) of 64.0 MiB (87.5 %)"),
            "{l}"
        );
        assert!(l.contains("raise the limit"), "{l}");
        m.limit_bytes = None;
        m.level = Level::Ok;
        assert!(super::memory_line(&m).ends_with("no limit found: ok"));
    }
}
