//! `kubectl arp-guard status` as a table: a row per LB IP, then the
//! guards in a few lines.

use guard_wire::takeover::TakeoverRecord;

use super::status::{ClusterStatus, IpStatus, Source};

/// The table (`wide`: the owner guard's version and every node's clients).
pub fn table(s: &ClusterStatus, wide: bool, now_unix: u64) -> String {
    let mut out = String::new();
    let mut head = vec![
        "LB IP",
        "SERVICE",
        "OWNER",
        "OWNER'S GUARD",
        "CLAIMED BY",
        "LAST TAKEOVER",
        "STALE CLIENTS",
        "WARNINGS (1H)",
        "AS OF",
    ];
    if wide {
        head.push("VERSION");
    }
    let mut rows = vec![head.iter().map(|s| s.to_string()).collect::<Vec<_>>()];
    for i in &s.ips {
        let mut r = vec![
            i.ip.map_or_else(|| "-".into(), |ip| ip.to_string()),
            i.service.clone().unwrap_or_else(|| "-".into()),
            owner_cell(i),
            (i.owner_guard.as_ref()).map_or_else(
                || "-".into(),
                |g| {
                    if g.answered {
                        format!("{}/{}", g.mode, g.health)
                    } else {
                        "not answering".into()
                    }
                },
            ),
            claimed_cell(i),
            i.takeover
                .as_ref()
                .map_or_else(|| "-".into(), |t| takeover_cell(t, now_unix)),
            clients_cell(i, wide),
            warnings_cell(i),
            match s.source {
                Source::Api => as_of_cell(i, now_unix),
                Source::Live => "live".into(),
            },
        ];
        if wide {
            r.push(
                i.owner_guard
                    .as_ref()
                    .map_or_else(|| "-".into(), |g| g.version.clone()),
            );
        }
        rows.push(r);
    }
    out.push_str(&super::output::columns(&rows));
    out.push('\n');
    out.push_str(&guards_summary(s, wide));
    out
}

/// How fresh a row is: `live`, or how long ago the oldest object it comes
/// from was written, and whose guard is not Ready (its word may be old).
fn as_of_cell(i: &IpStatus, now_unix: u64) -> String {
    let when = match i.as_of {
        Some(t) => format!("{} ago", super::output::ago(now_unix.saturating_sub(t))),
        None => "-".into(),
    };
    match i.from_guards_not_ready.is_empty() {
        true => when,
        false => format!("{when} ({} not Ready)", i.from_guards_not_ready.join(",")),
    }
}

fn owner_cell(i: &IpStatus) -> String {
    match (&i.owner, i.also_owned_by.is_empty()) {
        (None, _) => "?".into(),
        (Some(o), true) => o.clone(),
        (Some(o), false) => format!("{o} + {} (split view)", i.also_owned_by.join(",")),
    }
}

fn claimed_cell(i: &IpStatus) -> String {
    match &i.conflict {
        None => i.owner.clone().unwrap_or_else(|| "-".into()),
        Some(reason) => format!("{} ({reason})", i.claimants.join(", ")),
    }
}

fn takeover_cell(t: &TakeoverRecord, now_unix: u64) -> String {
    let ago = super::output::ago(now_unix.saturating_sub(t.at_unix));
    match (t.first_announcement_ms, t.silent) {
        (Some(ms), false) => format!("{ago} ago, announced in {ms} ms"),
        (Some(ms), true) => format!("{ago} ago, SILENT (announced after {} s)", ms / 1000),
        (None, true) => format!("{ago} ago, SILENT"),
        (None, false) => format!("{ago} ago, waiting"),
    }
}

fn clients_cell(i: &IpStatus, wide: bool) -> String {
    let stale: Vec<String> = (i.clients.iter())
        .filter(|(_, c)| c.stale > 0 || (wide && c.sending > 0))
        .map(|(n, c)| {
            if wide {
                format!("{}/{} on {n}", c.stale, c.sending)
            } else {
                format!("{} on {n}", c.stale)
            }
        })
        .collect();
    if stale.is_empty() {
        "-".into()
    } else {
        stale.join(", ")
    }
}

fn warnings_cell(i: &IpStatus) -> String {
    if i.warnings.is_empty() {
        return "-".into();
    }
    (i.warnings.iter())
        .map(|(r, n)| format!("{r} x{n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The guards in a few lines: how many answered, on which versions, and
/// every one that did not, with why.
fn guards_summary(s: &ClusterStatus, wide: bool) -> String {
    let answered = s.guards.iter().filter(|g| g.unanswered.is_none()).count();
    let versions: Vec<String> = (s.versions.iter())
        .map(|(v, n)| format!("{v} x{n}"))
        .collect();
    // From the API a guard "reported" (its object was read); live, it answered.
    let said = match s.source {
        Source::Api => "reported",
        Source::Live => "answered",
    };
    let mut out = format!(
        "guards: {answered} of {} {said}; versions: {}\n",
        s.guards.len(),
        if versions.is_empty() {
            "-".into()
        } else {
            versions.join(", ")
        }
    );
    if s.versions.len() > 1 {
        out.push_str("  more than one version runs (a rolling update, or one that stopped)\n");
    }
    for g in &s.guards {
        if let Some(u) = &g.unanswered {
            out.push_str(&format!("  {}: {u}\n", g.node));
        } else if g.ready == Some(false) || !g.not_ready.is_empty() {
            let why = if g.not_ready.is_empty() {
                String::new()
            } else {
                format!(": {}", g.not_ready.join("; "))
            };
            let who = if g.ready == Some(false) {
                "its Pod is not Ready"
            } else {
                "it says it is not ready"
            };
            out.push_str(&format!("  {}: {said}, but {who}{why}\n", g.node));
        }
        if wide && g.unanswered.is_none() {
            let ups = if g.uplinks.is_empty() {
                "none".to_owned()
            } else {
                g.uplinks.join(", ")
            };
            out.push_str(&format!("  {}: guards {ups}\n", g.node));
        }
    }
    out
}
