//! Kubernetes Events about LB IPs, decided: which of the daemon's findings
//! (its `/events` lines) become an Event on the IP's Service, under which
//! reason and in which words, and how often one may be published. Pure:
//! the publisher (`daemon/kube_events.rs`) hands it lines and the clock.

use super::probing::ProbingVerdict;
#[cfg(test)]
pub use limiter::MAX_PENDING;
pub use limiter::{Limiter, Limits, Offered, StreamKey};
use probe::probe;
use std::{
    collections::BTreeMap,
    net::IpAddr,
    time::{Duration, Instant},
};

/// The reason of an Event: one Event stream per Service and reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Reason {
    ResponderConflict,
    ResponderConflictResolved,
    SplitBrainSpeaker,
    SilentTakeover,
    StaleClients,
    SilentOwner,
    OwnerWrongInterface,
    NodesAnswerArp,
    SplitElection,
    SplitElectionResolved,
    OwnerLinkDown,
    OwnerLinkRestored,
}

impl Reason {
    /// Every reason, in the order the reference lists them.
    pub const ALL: &'static [Reason] = &[
        Reason::ResponderConflict,
        Reason::ResponderConflictResolved,
        Reason::SplitBrainSpeaker,
        Reason::SilentTakeover,
        Reason::StaleClients,
        Reason::SilentOwner,
        Reason::OwnerWrongInterface,
        Reason::NodesAnswerArp,
        Reason::SplitElection,
        Reason::SplitElectionResolved,
        Reason::OwnerLinkDown,
        Reason::OwnerLinkRestored,
    ];

    /// What an Event of this reason tells the operator (the reference).
    pub fn meaning(self) -> &'static str {
        match self {
            Reason::ResponderConflict => "another MAC claims the Service's LB IP on the wire (split brain, a rogue device, a node whose kernel answers): the census of the node that saw it names the MACs and their nodes",
            Reason::ResponderConflictResolved => "the conflict is no longer seen (quiet for a window: not proof that it is fixed)",
            Reason::SplitBrainSpeaker => "a speaker on the posting node kept announcing an LB IP another node owns for longer than --split-brain-after; stopped at its egress in enforce mode",
            Reason::SilentTakeover => "the posting node took the LB IP over and no announcement left it within --silent-takeover-after: clients keep the old MAC until their caches expire",
            Reason::StaleClients => "at least --kube-events-stale-clients clients still send the LB IP's traffic to the posting node, which no longer owns it, past --stale-client-after",
            Reason::SilentOwner => "the active census asked for the LB IP and its owner did not answer --probe-silent-after times in a row",
            Reason::OwnerWrongInterface => "the active census saw the owner answer from an interface other than the one it guards (a wrong or downed NIC's MAC)",
            Reason::NodesAnswerArp => "other nodes' kernels answer ARP for the LB IP (kube-proxy IPVS with strictARP off, arp_ignore=0), posted once by the IP's owner and at most hourly",
            Reason::SplitElection => "the LB IP is shared by Services elected separately (one Lease or status per Service) whose records name different nodes: each of them announces it; posted on every Service of the IP by one node every guard chooses alike (the first-ranked holder), at most hourly, naming the Services, their holders, the announcer's setting and the fix",
            Reason::SplitElectionResolved => "the Services sharing the LB IP name one node again",
            Reason::OwnerLinkDown => "the posting node owns the LB IP and none of the uplinks it answers on has carrier: its announcements and replies cannot reach the segment while its Lease or status still names it (reaches the API only over another interface; otherwise when the link returns)",
            Reason::OwnerLinkRestored => "an uplink of the owner has carrier again (or the LB IP is no longer the posting node's): ends its OwnerLinkDown, posted only after it",
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Reason::ResponderConflict => "ResponderConflict",
            Reason::ResponderConflictResolved => "ResponderConflictResolved",
            Reason::SplitBrainSpeaker => "SplitBrainSpeaker",
            Reason::SilentTakeover => "SilentTakeover",
            Reason::StaleClients => "StaleClients",
            Reason::SilentOwner => "SilentOwner",
            Reason::OwnerWrongInterface => "OwnerWrongInterface",
            Reason::NodesAnswerArp => "NodesAnswerARP",
            Reason::SplitElection => "SplitElection",
            Reason::SplitElectionResolved => "SplitElectionResolved",
            Reason::OwnerLinkDown => "OwnerLinkDown",
            Reason::OwnerLinkRestored => "OwnerLinkRestored",
        }
    }

    /// At least this long between two Events of a stream of this reason.
    pub fn interval(self, per_stream: Duration) -> Duration {
        match self {
            Reason::NodesAnswerArp | Reason::SplitElection => per_stream.max(kernel::REPEAT),
            _ => per_stream,
        }
    }

    /// Everything but an end (resolved, restored) is a Warning.
    pub fn warning(self) -> bool {
        !matches!(
            self,
            Reason::ResponderConflictResolved
                | Reason::SplitElectionResolved
                | Reason::OwnerLinkRestored
        )
    }

    /// The Event's action: what arp-guard did that found it.
    pub fn action(self) -> &'static str {
        match self {
            Reason::ResponderConflict
            | Reason::ResponderConflictResolved
            | Reason::NodesAnswerArp => "Census",
            Reason::SplitBrainSpeaker => "StopAnnouncement",
            Reason::SilentTakeover => "TimeTakeover",
            Reason::StaleClients => "WatchClients",
            Reason::SilentOwner | Reason::OwnerWrongInterface => "Probe",
            Reason::SplitElection | Reason::SplitElectionResolved => "CompareElections",
            Reason::OwnerLinkDown | Reason::OwnerLinkRestored => "WatchCarrier",
        }
    }
}

/// One finding about one LB IP, read from an `/events` line.
#[derive(Debug, Clone, PartialEq)]
pub enum Finding {
    /// The census: more than one MAC claims the IP (`ended`: no longer seen).
    Conflict {
        ip: IpAddr,
        claimed_elsewhere: bool,
        macs: Vec<String>,
        ended: bool,
    },
    /// The guard stopped (or, in monitor mode, would have stopped) a
    /// speaker's announcement of an IP this node does not own.
    SpeakerStopped {
        ip: IpAddr,
        stopped: bool,
        interface: String,
    },
    SilentTakeover {
        ip: IpAddr,
    },
    /// This node became the IP's owner and its first announcement left:
    /// the stopped announcements before were the takeover's, not a run of
    /// split brain.
    TakeoverAnnounced {
        ip: IpAddr,
    },
    StaleClient {
        ip: IpAddr,
        client_ip: String,
        mac: String,
    },
    /// The active census: a verdict about an IP this node asks about.
    Probe {
        ip: IpAddr,
        verdict: ProbingVerdict,
        ended: bool,
        owner: Option<String>,
        answered_by: Vec<String>,
        unanswered: u64,
        interface: String,
    },
}

impl Finding {
    pub fn ip(&self) -> IpAddr {
        match self {
            Finding::Conflict { ip, .. }
            | Finding::SpeakerStopped { ip, .. }
            | Finding::SilentTakeover { ip }
            | Finding::TakeoverAnnounced { ip }
            | Finding::StaleClient { ip, .. }
            | Finding::Probe { ip, .. } => *ip,
        }
    }
}

/// The finding an `/events` line carries, if it is one Events are made of.
pub fn parse(line: &str) -> Option<Finding> {
    // Drop events are most of the lines (a flood is thousands a second):
    // only a speaker's announcement of a foreign IP matters; the rest is
    // not decoded at all.
    if line.contains("\"verdict\":") && !line.contains("\"state\":\"foreign\"") {
        return None;
    }
    let v: serde_json::Value = serde_json::from_str(line).ok()?;
    let s = |k: &str| v.get(k).and_then(|x| x.as_str()).unwrap_or_default();
    let ip: IpAddr = s("lb_ip").parse().ok()?;
    match s("event") {
        "" => {
            let speaker = matches!(s("origin"), "speaker" | "redirect");
            let verdict = s("verdict");
            (speaker && matches!(verdict, "dropped" | "would_drop")).then(|| {
                Finding::SpeakerStopped {
                    ip,
                    stopped: verdict == "dropped",
                    interface: s("interface").to_owned(),
                }
            })
        }
        e @ ("responder_conflict" | "responder_conflict_ended") => Some(Finding::Conflict {
            ip,
            claimed_elsewhere: s("reason") == "claimed_elsewhere",
            macs: (v
                .get("macs")
                .and_then(|m| m.as_array())
                .into_iter()
                .flatten())
            .filter_map(|m| m.as_str().map(str::to_owned))
            .collect(),
            ended: e == "responder_conflict_ended",
        }),
        "silent_takeover" => Some(Finding::SilentTakeover { ip }),
        "takeover_announced" => Some(Finding::TakeoverAnnounced { ip }),
        e if e.starts_with("probe_conflict")
            || e.starts_with("silent_owner")
            || e.starts_with("owner_wrong_interface") =>
        {
            let list = |k: &str| -> Vec<String> {
                (v.get(k).and_then(|m| m.as_array()).into_iter().flatten())
                    .filter_map(|m| m.as_str().map(str::to_owned))
                    .collect()
            };
            Some(Finding::Probe {
                ip,
                verdict: if e.starts_with("probe_conflict") {
                    ProbingVerdict::Conflict
                } else if e.starts_with("silent_owner") {
                    ProbingVerdict::SilentOwner
                } else {
                    ProbingVerdict::WrongInterface
                },
                ended: e.ends_with("_ended"),
                owner: v.get("owner").and_then(|o| o.as_str()).map(str::to_owned),
                answered_by: list("answered_by"),
                unanswered: v.get("unanswered").and_then(|n| n.as_u64()).unwrap_or(0),
                interface: s("interface").to_owned(),
            })
        }
        "stale_client" => Some(Finding::StaleClient {
            ip,
            client_ip: s("client_ip").to_owned(),
            mac: s("mac").to_owned(),
        }),
        _ => None,
    }
}

/// What this node knows of the IP a finding is about.
#[derive(Debug, Clone)]
pub struct IpFacts<'a> {
    pub node: &'a str,
    /// This node owns the IP.
    pub owned_here: bool,
    /// Which object says who owns it (the feed's words).
    pub why: &'a str,
    /// How long ago this node's state for the IP last changed.
    pub changed_ago: Duration,
}

/// An Event to publish: its reason, its message, and the node at fault
/// (`related`), if one is.
#[derive(Debug, Clone, PartialEq)]
pub struct Occurrence {
    pub reason: Reason,
    pub note: String,
    pub node_at_fault: Option<String>,
}

/// Thresholds of the findings that need one.
#[derive(Debug, Clone, Copy)]
pub struct Thresholds {
    /// A speaker stopped this long without a pause is split brain.
    pub split_brain_after: Duration,
    /// This many clients gone stale for one IP make an Event.
    pub stale_clients: usize,
    /// `--silent-takeover-after`, for the message.
    pub silent_after: Duration,
}

/// A speaker's run of stopped announcements ends after this long without one.
const RUN_GAP: Duration = Duration::from_secs(60);

/// What is remembered between findings: runs of stopped announcements and
/// stale clients per IP (bounded: entries quiet for [`RUN_GAP`] go).
#[derive(Debug, Default)]
pub struct Memory {
    runs: BTreeMap<IpAddr, (Instant, Instant, u64)>,
    stale: BTreeMap<IpAddr, (Instant, Vec<String>)>,
}

/// At most this many IPs are remembered (a flood over many IPs).
const MAX_REMEMBERED: usize = 65_536;

impl Memory {
    /// Forget what has been quiet for long.
    pub fn prune(&mut self, now: Instant) {
        self.runs
            .retain(|_, (_, last, _)| now.duration_since(*last) < RUN_GAP);
        self.stale
            .retain(|_, (last, _)| now.duration_since(*last) < RUN_GAP);
    }
}

/// The Event a finding makes, if it makes one now.
pub fn event_for(
    f: &Finding,
    facts: &IpFacts<'_>,
    t: &Thresholds,
    m: &mut Memory,
    now: Instant,
) -> Option<Occurrence> {
    let node = facts.node;
    let ip = f.ip();
    match f {
        Finding::Conflict {
            claimed_elsewhere,
            macs,
            ended,
            ..
        } => conflict(ip, *claimed_elsewhere, macs, *ended, facts),
        Finding::SpeakerStopped {
            stopped, interface, ..
        } => speaker_stopped(ip, *stopped, interface, facts, t, m, now),
        Finding::TakeoverAnnounced { .. } => {
            m.runs.remove(&ip);
            None
        }
        Finding::SilentTakeover { .. } => Some(Occurrence {
            reason: Reason::SilentTakeover,
            note: format!(
                "{node} took over {ip} and sent no announcement within {}s: clients keep the old MAC until they ask again (does the announcer on {node} announce, on a guarded interface?)",
                t.silent_after.as_secs_f64()
            ),
            node_at_fault: Some(node.to_owned()),
        }),
        Finding::StaleClient { client_ip, mac, .. } => {
            stale_client(ip, client_ip, mac, facts, t, m, now)
        }
        Finding::Probe {
            verdict,
            ended,
            owner,
            answered_by,
            unanswered,
            interface,
            ..
        } => probe(
            ip,
            *verdict,
            *ended,
            owner.as_deref(),
            answered_by,
            *unanswered,
            interface,
            node,
        ),
    }
}

/// A conflict is reported by the IP's owner: every node's census sees a
/// broadcast claim, and one conflict must not make an Event per node.
fn conflict(
    ip: IpAddr,
    claimed_elsewhere: bool,
    macs: &[String],
    ended: bool,
    facts: &IpFacts<'_>,
) -> Option<Occurrence> {
    if !facts.owned_here {
        return None;
    }
    let (node, macs) = (facts.node, macs.join(", "));
    let (reason, note) = if ended {
        (
            Reason::ResponderConflictResolved,
            format!(
                "{ip} is claimed by one MAC again, as seen from its owner {node} (was: {macs})"
            ),
        )
    } else if claimed_elsewhere {
        (
            Reason::ResponderConflict,
            format!("{node} owns {ip} and another MAC claims it too ({macs}): a rogue host or a speaker on another node that did not step down; clients may send to the wrong one"),
        )
    } else {
        (
            Reason::ResponderConflict,
            format!("more than one MAC claims {ip} at once ({macs}), as seen from its owner {node}: split brain or a node answering that should not"),
        )
    };
    Some(Occurrence {
        reason,
        note,
        node_at_fault: None,
    })
}

/// A speaker's announcements of a foreign IP, stopped without a pause for
/// the threshold: split brain on this node.
fn speaker_stopped(
    ip: IpAddr,
    stopped: bool,
    interface: &str,
    facts: &IpFacts<'_>,
    t: &Thresholds,
    m: &mut Memory,
    now: Instant,
) -> Option<Occurrence> {
    // Owned here by now: it was the takeover's (judged a moment before the
    // map said owned).
    if facts.owned_here || (m.runs.len() >= MAX_REMEMBERED && !m.runs.contains_key(&ip)) {
        return None;
    }
    let run = m.runs.entry(ip).or_insert((now, now, 0));
    // A pause, or the IP changed hands since (a takeover came between):
    // a new run.
    let since_last = now.duration_since(run.1);
    if since_last >= RUN_GAP || since_last > facts.changed_ago {
        *run = (now, now, 0);
    }
    run.1 = now;
    run.2 += 1;
    let lasted = now.duration_since(run.0);
    if lasted < t.split_brain_after {
        return None;
    }
    let node = facts.node;
    let what = if stopped {
        format!("arp-guard stopped {} of them", run.2)
    } else {
        format!("monitor mode: {} of them were NOT stopped", run.2)
    };
    Some(Occurrence {
        reason: Reason::SplitBrainSpeaker,
        note: format!(
            "a speaker on {node} ({interface}) has announced {ip} for {}s although {node} does not own it ({}); {what}: split brain (check the announcer's leader election on {node})",
            lasted.as_secs(),
            facts.why
        ),
        node_at_fault: Some(node.to_owned()),
    })
}

/// At most this many stale clients of one IP are remembered and listed in
/// the message; so the threshold is at most this too (a larger one could
/// never be reached: `--kube-events-stale-clients` refuses it).
pub const MAX_STALE_LISTED: usize = 8;

/// Clients gone stale for one IP on this node, from the threshold on.
fn stale_client(
    ip: IpAddr,
    client_ip: &str,
    mac: &str,
    facts: &IpFacts<'_>,
    t: &Thresholds,
    m: &mut Memory,
    now: Instant,
) -> Option<Occurrence> {
    if m.stale.len() >= MAX_REMEMBERED && !m.stale.contains_key(&ip) {
        return None;
    }
    let (last, clients) = m.stale.entry(ip).or_insert((now, Vec::new()));
    *last = now;
    let who = format!("{client_ip} ({mac})");
    if !clients.contains(&who) && clients.len() < MAX_STALE_LISTED {
        clients.push(who);
    }
    if clients.len() < t.stale_clients.max(1) {
        return None;
    }
    let (node, list) = (facts.node, std::mem::take(clients).join(", "));
    Some(Occurrence {
        reason: Reason::StaleClients,
        note: format!(
            "clients still send {ip}'s traffic to {node}, which does not own it ({}): {list}; their neighbour caches hold {node}'s MAC",
            facts.why
        ),
        node_at_fault: Some(node.to_owned()),
    })
}

pub mod kernel;
mod limiter;
pub mod link;
mod probe;
pub mod split;
#[cfg(test)]
mod tests;
