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
use crate::{model::census::Census, telemetry::clients::ClientsDoc};

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

/// Nodes that answered, and how many had nothing to say.
fn quiet_line(answered: usize, said: usize) -> String {
    format!("{said} of {answered} nodes that answered have something to say\n")
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
            crate::model::text::clip(&e.note, 160),
        ]);
    }
    columns(&rows)
}
