//! The per-node views merged: `clients`, `responders` (each node's own
//! document, every line labelled with its node, only the nodes with
//! something to say in the table), `explain` and `doctor` (each node's own
//! text, labelled), and `events` (from the API alone).

use serde::Serialize;

use super::{
    cluster::EventRow,
    fanout::{NodeAnswer, Unanswered},
    output::{ago, columns, labelled},
};
use guard_wire::{census::Census, clients::ClientsDoc};

/// One node's answer in a JSON or YAML document: its document, or why it
/// has none.
#[derive(Debug, Serialize)]
pub struct NodeDoc<T> {
    pub node: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ready: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub answer: Option<T>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unanswered: Option<Unanswered>,
}

/// The answers as documents.
pub fn docs<T: Clone>(answers: &[NodeAnswer<T>]) -> Vec<NodeDoc<T>> {
    (answers.iter())
        .map(|a| NodeDoc {
            node: a.node.clone(),
            ready: a.ready,
            answer: a.answer.as_ref().ok().map(|(d, _)| d.clone()),
            unanswered: a.answer.as_ref().err().cloned(),
        })
        .collect()
}

/// The nodes without an answer, a line each (after a table).
pub fn unanswered<T>(answers: &[NodeAnswer<T>]) -> String {
    let mut out = String::new();
    for a in answers {
        if let Err(u) = &a.answer {
            out.push_str(&format!("{}: {u}\n", a.node));
        }
    }
    out
}

/// Nodes that answered (or reported), and how many had something to say.
fn quiet_line(answered: usize, said: usize) -> String {
    quiet_line_as(answered, said, "answered")
}

fn quiet_line_as(answered: usize, said: usize, verb: &str) -> String {
    format!("{said} of {answered} nodes that {verb} have something to say\n")
}

/// `clients`: one row per misdirected client, labelled with the node it
/// still reaches. Returns the table and the number of stale clients.
pub fn clients_table(answers: &[NodeAnswer<ClientsDoc>]) -> (String, usize) {
    let mut rows = vec![[
        "NODE",
        "LB IP",
        "CLIENT MAC",
        "CLIENT IP",
        "STATUS",
        "MISDIRECTED",
        "LAST SEEN",
        "INTERFACE",
    ]
    .map(String::from)
    .to_vec()];
    let (mut stale, mut answered, mut said) = (0, 0, 0);
    for a in answers {
        let Ok((d, _)) = &a.answer else { continue };
        answered += 1;
        stale += d.stale;
        let mut any = false;
        for (ip, c) in &d.ips {
            for cl in &c.clients {
                any = true;
                rows.push(vec![
                    a.node.clone(),
                    ip.to_string(),
                    cl.mac.clone(),
                    cl.client_ip.to_string(),
                    cl.status.as_str().into(),
                    format!("{:.0}s", cl.misdirected_s),
                    format!("{} ago", ago(cl.last_seen_ago_s)),
                    cl.interface.clone(),
                ]);
            }
        }
        said += usize::from(any);
    }
    let mut out = if rows.len() > 1 {
        columns(&rows)
    } else {
        "no misdirected client on any node\n".into()
    };
    out.push_str(&quiet_line(answered, said));
    out.push_str(&unanswered(answers));
    (out, stale)
}

/// `responders`: one row per MAC that claimed an LB IP, labelled with the
/// node whose census saw it. Returns the table and the conflicts seen.
pub fn responders_table(answers: &[NodeAnswer<ResponderDoc>]) -> (String, usize) {
    let mut rows = vec![[
        "NODE",
        "LB IP",
        "MAC",
        "WHOSE",
        "CLAIMS",
        "LAST SEEN",
        "ACTIVE",
        "CONFLICT",
    ]
    .map(String::from)
    .to_vec()];
    let (mut conflicts, mut answered, mut said) = (0, 0, 0);
    for a in answers {
        let Ok((d, _)) = &a.answer else { continue };
        answered += 1;
        said += usize::from(!d.ips.is_empty());
        for (ip, c) in &d.ips {
            conflicts += usize::from(c.conflict.is_some());
            for r in &c.responders {
                let whose = match (&r.node, r.local, r.outside) {
                    (_, true, _) => format!("{} (itself)", a.node),
                    (Some(n), _, _) => n.clone(),
                    (None, _, true) => "no guard lists it".into(),
                    (None, _, false) => "-".into(),
                };
                rows.push(vec![
                    a.node.clone(),
                    ip.to_string(),
                    r.mac.clone(),
                    whose,
                    r.claims.to_string(),
                    format!("{} ago", ago(r.last_seen_ago_s)),
                    if r.active { "yes".into() } else { "no".into() },
                    c.conflict
                        .map_or_else(|| "-".into(), |c| c.as_str().to_owned()),
                ]);
            }
        }
    }
    let mut out = if rows.len() > 1 {
        columns(&rows)
    } else {
        "no claim of an LB IP on any node\n".into()
    };
    out.push_str(&quiet_line(answered, said));
    out.push_str(&unanswered(answers));
    (out, conflicts)
}

/// What `arp-guard responders -o json` prints, as far as the plugin reads it.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct ResponderDoc {
    pub ips: Census,
}

/// `explain` and `doctor` in a table: each node's own text, every line
/// labelled with its node. Returns the text and the nodes whose command
/// found something (exit 1).
pub fn labelled_text(answers: &[NodeAnswer<String>]) -> (String, usize) {
    let mut out = String::new();
    let mut found = 0;
    for a in answers {
        match &a.answer {
            Ok((text, code)) => {
                found += usize::from(*code == 1);
                out.push_str(&labelled(&a.node, text));
            }
            Err(u) => out.push_str(&labelled(&a.node, &u.to_string())),
        }
    }
    (out, found)
}

/// `events`: arp-guard's Events, newest first.
pub fn events_table(events: &[EventRow]) -> String {
    if events.is_empty() {
        return "no arp-guard Event in the window\n".into();
    }
    let mut rows = vec![[
        "LAST SEEN",
        "TYPE",
        "REASON",
        "SERVICE",
        "NODE",
        "COUNT",
        "MESSAGE",
    ]
    .map(String::from)
    .to_vec()];
    for e in events {
        rows.push(vec![
            format!("{} ago", ago(e.age_s.max(0) as u64)),
            e.kind.clone(),
            e.reason.clone(),
            e.service.clone(),
            e.node.clone(),
            e.count.to_string(),
            guard_wire::text::clip(&e.note, 160),
        ]);
    }
    columns(&rows)
}

/// One LB IP's clients still reaching one node, from its ArpGuardNode.
#[derive(Debug, Clone, Serialize)]
pub struct ClientCountRow {
    pub node: String,
    pub ip: std::net::IpAddr,
    pub sending: usize,
    pub stale: usize,
    /// When its object was written (Unix seconds).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub as_of: Option<u64>,
}

/// `clients` from the API: per node and LB IP, how many clients still send
/// there and how many are stale (`--live` for each client's MAC and IP).
pub fn client_counts(
    views: &[crate::node_view::NodeView],
    only: Option<std::net::IpAddr>,
) -> Vec<ClientCountRow> {
    (views.iter())
        .flat_map(|v| {
            (v.clients.iter())
                .filter(move |(ip, _)| only.is_none_or(|o| o == **ip))
                .map(|(ip, c)| ClientCountRow {
                    node: v.node.clone(),
                    ip: *ip,
                    sending: c.sending,
                    stale: c.stale,
                    as_of: v.as_of,
                })
        })
        .collect()
}

/// Nodes that reported, and the lines for those that did not.
fn reported(views: &[crate::node_view::NodeView]) -> (usize, String) {
    let mut out = String::new();
    for v in views {
        if let Some(u) = &v.unanswered {
            out.push_str(&format!("{}: {u}\n", v.node));
        }
    }
    (views.iter().filter(|v| v.unanswered.is_none()).count(), out)
}

/// The table of [`client_counts`].
pub fn client_counts_table(
    rows: &[ClientCountRow],
    views: &[crate::node_view::NodeView],
) -> String {
    let now = jiff::Timestamp::now().as_second().max(0) as u64;
    let mut t = vec![["NODE", "LB IP", "SENDING", "STALE", "AS OF"]
        .map(String::from)
        .to_vec()];
    for r in rows {
        let as_of = r.as_of.map_or("-".into(), |a| {
            format!("{} ago", ago(now.saturating_sub(a)))
        });
        t.push(vec![
            r.node.clone(),
            r.ip.to_string(),
            r.sending.to_string(),
            r.stale.to_string(),
            as_of,
        ]);
    }
    let mut out = if rows.is_empty() {
        "no misdirected client on any node\n".into()
    } else {
        columns(&t)
    };
    let (n, missing) = reported(views);
    let said: std::collections::BTreeSet<&str> = rows.iter().map(|r| r.node.as_str()).collect();
    out.push_str(&quiet_line_as(n, said.len(), "reported"));
    out.push_str("(each client's MAC and IP: --live)\n");
    out.push_str(&missing);
    out
}

/// One LB IP in conflict as one node's census sees it.
#[derive(Debug, Clone, Serialize)]
pub struct ConflictRow {
    pub node: String,
    pub ip: std::net::IpAddr,
    pub reason: String,
    pub claimants: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub as_of: Option<u64>,
}

/// `responders` from the API: the LB IPs in conflict, per node whose census
/// sees it, with the claimants named by node (`--live` for every MAC).
pub fn conflicts(
    views: &[crate::node_view::NodeView],
    only: Option<std::net::IpAddr>,
) -> Vec<ConflictRow> {
    (views.iter())
        .flat_map(|v| {
            (v.conflicts.iter())
                .filter(move |c| only.is_none_or(|o| o == c.ip))
                .map(|c| ConflictRow {
                    node: v.node.clone(),
                    ip: c.ip,
                    reason: c.reason.clone(),
                    claimants: c.claimants.clone(),
                    as_of: v.as_of,
                })
        })
        .collect()
}

/// The table of [`conflicts`].
pub fn conflicts_table(rows: &[ConflictRow], views: &[crate::node_view::NodeView]) -> String {
    let mut t = vec![["NODE", "LB IP", "CONFLICT", "CLAIMED BY"]
        .map(String::from)
        .to_vec()];
    for r in rows {
        t.push(vec![
            r.node.clone(),
            r.ip.to_string(),
            r.reason.clone(),
            r.claimants.join(", "),
        ]);
    }
    let mut out = if rows.is_empty() {
        "no LB IP in conflict on any node\n".into()
    } else {
        columns(&t)
    };
    let (n, missing) = reported(views);
    let said: std::collections::BTreeSet<&str> = rows.iter().map(|r| r.node.as_str()).collect();
    out.push_str(&quiet_line_as(n, said.len(), "reported"));
    out.push_str("(every MAC each census saw: --live)\n");
    out.push_str(&missing);
    out
}
