//! The active census run (the decisions: `model::probing`): on a thread of
//! its own, this node asks about its share of the LB IPs it does not own,
//! at the pace the model sets, out of every uplink; a few
//! seconds later it reads what its census recorded since each request and
//! judges it. Verdicts that begin or end are logged, sent to `/events`
//! subscribers (and from there become Events on the Service), and the whole
//! is published for `/probes` and the metrics.
//!
//! It never blocks guarding: the socket never blocks (a full queue is a
//! send error, counted), the thread only reads the state others publish,
//! and it pauses (sends nothing, judges nothing) while the ownership feed
//! is blind or the presence records are not read: a verdict from a stale
//! view of who owns what would accuse the wrong node.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    sync::Arc,
    time::Duration,
};

use tokio::sync::broadcast;

use crate::{
    datapath::{sys::monotonic_ns, wire::Wire},
    model::{
        census::CensusEntry,
        fmt_mac,
        probing::{
            asks, classify, in_words, request_frame, Change, OwnerMacs, Pace, ProbingVerdict,
            Schedule, Tracker,
        },
    },
    telemetry::probing::ProbesDoc,
};

/// How long after a request its answers are read: a reply takes
/// milliseconds, the census reads its table every second.
pub const WAIT: Duration = Duration::from_millis(2500);
/// The loop sleeps until the next request is due, at least this long (a
/// few due together go out in one wake-up)...
const MIN_SLEEP: Duration = Duration::from_millis(20);
/// ...and at most this long (the judgement and the document, once a second).
const MAX_SLEEP: Duration = Duration::from_secs(1);
/// The share is computed again this often (presence and ownership move
/// slowly; a new owner is also seen at the next judgement).
const REPLAN: Duration = Duration::from_secs(5);
/// At most this many verdict lines logged per judgement.
const LOG_PER_ROUND: usize = 20;

/// What the share is computed from.
#[derive(Debug, Clone, Default)]
pub struct Plan {
    /// The live guards' nodes (None: presence has not been read).
    pub live: Option<Vec<String>>,
    /// LB IPs owned elsewhere, with their owner node where known.
    pub foreign: Vec<(IpAddr, Option<String>)>,
    /// LB IPs with an owner, cluster-wide (every guard counts the same).
    pub owned_anywhere: usize,
    /// Why nothing may be judged now (the feed blind or not synced).
    pub blind: Option<&'static str>,
    /// The uplinks to ask on: ifindex, MAC, IPv6 link-local.
    pub uplinks: Vec<(u32, [u8; 6], Option<Ipv6Addr>)>,
}

/// What the answers are judged against.
#[derive(Debug, Clone, Default)]
pub struct ProbingFacts {
    /// The census's claims as last read (None: no census).
    pub claims: Option<Arc<Vec<CensusEntry>>>,
    /// Every live guard's MACs: MAC -> (node, interface).
    pub known: BTreeMap<[u8; 6], (String, String)>,
    /// The owner's MACs for each IP asked.
    pub owners: BTreeMap<IpAddr, OwnerMacs>,
    /// The owner of each IP asked, now (None: no owner named).
    pub owner_now: BTreeMap<IpAddr, Option<String>>,
    /// Why nothing may be judged now, if so (as [`Plan::blind`]).
    pub blind: Option<&'static str>,
}

/// What the answers about some IPs are judged against, read now.
pub type ProbingFactsOf = Box<dyn Fn(&BTreeSet<IpAddr>) -> ProbingFacts + Send>;

/// The closures the task reads the daemon through.
pub struct ProbeTask {
    pub wire: Wire,
    pub node: String,
    pub pace: Pace,
    pub plan: Box<dyn Fn() -> Plan + Send>,
    pub facts: ProbingFactsOf,
    pub publish: Box<dyn Fn(ProbesDoc) + Send>,
    pub events: broadcast::Sender<String>,
}

/// Start the task on a thread of its own.
pub fn spawn(task: ProbeTask) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("probing".into())
        .spawn(move || Runner::new(task).run())
        .map(drop)
}

/// A request out, waiting for its answers.
struct Pending {
    ip: IpAddr,
    sent_ns: u64,
    ifindexes: Vec<u32>,
    owner: Option<String>,
}

struct Runner {
    t: ProbeTask,
    seed: u64,
    schedule: Schedule,
    tracker: Tracker,
    pending: Vec<Pending>,
    plan: Plan,
    owners: BTreeMap<IpAddr, Option<String>>,
    interval: Duration,
    planned_ns: Option<u64>,
    doc: ProbesDoc,
    /// A verdict changed since the IPs were last copied into `doc`.
    changed: bool,
}

impl Runner {
    fn new(t: ProbeTask) -> Self {
        let seed = crate::model::probing::score(&t.node, IpAddr::V4(Ipv4Addr::UNSPECIFIED));
        let doc = ProbesDoc {
            interval_seconds: t.pace.interval.as_secs_f64(),
            askers_per_ip: t.pace.askers,
            node_max_per_second: t.pace.node_max,
            cluster_max_per_second: t.pace.cluster_max,
            silent_after: t.pace.silent_after,
            paused: Some("starting".into()),
            ..Default::default()
        };
        Runner {
            interval: t.pace.interval,
            t,
            seed,
            schedule: Schedule::default(),
            tracker: Tracker::default(),
            pending: Vec::new(),
            plan: Plan::default(),
            owners: BTreeMap::new(),
            planned_ns: None,
            doc,
            changed: false,
        }
    }

    fn run(mut self) {
        let (mut published_ns, mut copied_ns): (u64, u64) = (0, 0);
        loop {
            // Asleep until the next request is due or the next judgement,
            // whichever comes first: a node asking a few IPs a second wakes
            // a few times a second, not on a fixed tick.
            let now = monotonic_ns();
            let next_second = published_ns.saturating_add(1_000_000_000);
            let next = match self.doc.paused {
                None => (self.schedule.next_due(self.t.pace.node_max))
                    .map_or(next_second, |t| t.min(next_second)),
                Some(_) => next_second,
            };
            let sleep = Duration::from_nanos(next.saturating_sub(now));
            std::thread::sleep(sleep.clamp(MIN_SLEEP, MAX_SLEEP));
            let now = monotonic_ns();
            if self
                .planned_ns
                .is_none_or(|at| now.saturating_sub(at) >= REPLAN.as_nanos() as u64)
            {
                self.replan(now);
            }
            if self.doc.paused.is_none() {
                self.send(now);
            }
            // Once a second: the answers of every request due by then are
            // judged together (one read of the census and presence).
            if now.saturating_sub(published_ns) >= 1_000_000_000 {
                published_ns = now;
                if self.doc.paused.is_none() {
                    self.assess_answers(now);
                }
                // The table is copied when a verdict changed, else every
                // 10 s (its counts of requests may lag that much): a copy
                // of tens of thousands of IPs every second would cost more
                // than the asking.
                if self.changed || now.saturating_sub(copied_ns) >= 10_000_000_000 {
                    self.doc.ips = Arc::new(self.tracker.ips.clone());
                    (self.changed, copied_ns) = (false, now);
                }
                self.doc.verdicts = self.tracker.counts();
                (self.t.publish)(self.doc.clone());
            }
        }
    }

    /// Compute this node's share and pace again.
    fn replan(&mut self, now: u64) {
        self.planned_ns = Some(now);
        self.plan = (self.t.plan)();
        let paused = match (&self.plan.live, self.plan.blind) {
            (_, Some(why)) => Some(why.to_owned()),
            (None, _) => Some("the presence records have not been read yet".to_owned()),
            (Some(l), _) if !l.contains(&self.t.node) => {
                Some("this node's own presence record is not live yet".to_owned())
            }
            _ if self.plan.uplinks.is_empty() => Some("no guarded interface is up".to_owned()),
            _ => None,
        };
        if paused != self.doc.paused {
            match &paused {
                Some(why) => {
                    tracing::info!(target: "arp_guard::probing", why = %why, "active census paused")
                }
                None => tracing::info!(target: "arp_guard::probing", "active census asking"),
            }
        }
        self.doc.paused = paused;
        if self.doc.paused.is_some() {
            // Answers read against a view that may be wrong are dropped.
            self.pending.clear();
            return;
        }
        let live = self.plan.live.clone().unwrap_or_default();
        let k = self.t.pace.askers;
        self.owners = (self.plan.foreign.iter())
            .filter(|(ip, owner)| asks(&self.t.node, *ip, &live, owner.as_deref(), k))
            .map(|(ip, owner)| (*ip, owner.clone()))
            .collect();
        let asked: BTreeSet<IpAddr> = self.owners.keys().copied().collect();
        self.interval = self
            .t
            .pace
            .interval_for(self.plan.owned_anywhere, asked.len());
        self.schedule.follow(&asked, self.interval, now, self.seed);
        self.tracker.retain(&asked);
        self.doc.interval_seconds = self.interval.as_secs_f64();
        self.doc.live_guards = live.len();
    }

    /// Send the requests due now.
    fn send(&mut self, now: u64) {
        let due = self
            .schedule
            .take(now, self.interval, self.t.pace.node_max, self.seed);
        for ip in due {
            let mut ifindexes = Vec::new();
            for (ifindex, mac, ll) in &self.plan.uplinks {
                let source6 = match (ip, ll) {
                    (IpAddr::V6(_), None) => continue,
                    (_, ll) => ll.unwrap_or(Ipv6Addr::UNSPECIFIED),
                };
                let (frame, n) = request_frame(*mac, Ipv4Addr::UNSPECIFIED, source6, ip);
                let family = if ip.is_ipv4() { "ipv4" } else { "ipv6" };
                match self.t.wire.send(*ifindex, &frame[..n]) {
                    Ok(()) => {
                        *self.doc.sent.entry(family.into()).or_default() += 1;
                        ifindexes.push(*ifindex);
                    }
                    Err(_) => self.doc.send_errors += 1,
                }
            }
            if !ifindexes.is_empty() {
                self.pending.push(Pending {
                    ip,
                    sent_ns: now,
                    ifindexes,
                    owner: self.owners.get(&ip).cloned().flatten(),
                });
            }
        }
    }

    /// Judge the requests whose answers are in.
    fn assess_answers(&mut self, now: u64) {
        let wait = WAIT.as_nanos() as u64;
        let ready: Vec<Pending>;
        (ready, self.pending) = std::mem::take(&mut self.pending)
            .into_iter()
            .partition(|p| now.saturating_sub(p.sent_ns) >= wait);
        if ready.is_empty() {
            return;
        }
        let ips: BTreeSet<IpAddr> = ready.iter().map(|p| p.ip).collect();
        let facts = (self.t.facts)(&ips);
        if let Some(why) = facts.blind {
            // Blind since the last plan: these answers are not judged, and
            // nothing more is sent until the next plan says it may.
            self.doc.paused = Some(why.to_owned());
            self.planned_ns = None;
            return;
        }
        let Some(claims) = &facts.claims else {
            return;
        };
        let local: BTreeSet<[u8; 6]> = (self.plan.uplinks.iter()).map(|(_, m, _)| *m).collect();
        let mut by_ip: BTreeMap<IpAddr, Vec<&CensusEntry>> = BTreeMap::new();
        for c in claims.iter().filter(|c| ips.contains(&c.ip)) {
            by_ip.entry(c.ip).or_default().push(c);
        }
        let presence = self.plan.live.is_some();
        let mut logged = 0;
        // An IP whose owner changed since its request was sent is asked
        // again under the new owner, not judged against it.
        for p in ready
            .into_iter()
            .filter(|p| facts.owner_now.get(&p.ip) == Some(&p.owner))
        {
            let macs: BTreeSet<[u8; 6]> = (by_ip.get(&p.ip).into_iter().flatten())
                .filter(|c| c.last_ns >= p.sent_ns && p.ifindexes.contains(&c.ifindex))
                .filter(|c| !local.contains(&c.mac))
                .map(|c| c.mac)
                .collect();
            let owner_macs = facts.owners.get(&p.ip).cloned().unwrap_or_default();
            let answer = classify(&macs, &owner_macs);
            let words = in_words(&macs, &facts.known, presence);
            let change = self.tracker.record(
                p.ip,
                p.owner.clone(),
                answer,
                words,
                self.t.pace.silent_after,
            );
            if let Some(c) = change {
                self.changed = true;
                logged += 1;
                report(&c, &owner_macs, &self.t.events, logged <= LOG_PER_ROUND);
            }
        }
    }
}

/// The event name of a verdict that begins (or, with `_ended`, ends).
fn event_name(v: ProbingVerdict) -> Option<&'static str> {
    v.bad().then_some(match v {
        ProbingVerdict::Conflict => "probe_conflict",
        ProbingVerdict::SilentOwner => "silent_owner",
        _ => "owner_wrong_interface",
    })
}

/// A verdict that began or ended: a log line and an `/events` line each.
fn report(c: &Change, owner: &OwnerMacs, events: &broadcast::Sender<String>, log: bool) {
    let owner_macs: Vec<String> = (owner.uplinks.iter().flatten()).map(fmt_mac).collect();
    let send = |event: String| {
        let line = serde_json::json!({
            "time": crate::telemetry::events::unix_time_millis(),
            "event": event,
            "lb_ip": c.ip,
            "owner": c.owner,
            "owner_macs": owner_macs,
            "answered_by": c.answered_by,
            "unanswered": c.unanswered,
            "interface": c.interface,
        });
        // No subscriber is fine.
        let _ = events.send(line.to_string());
    };
    if c.to == ProbingVerdict::Pending {
        // A new owner: the old verdict is void, not resolved.
        tracing::debug!(target: "arp_guard::probing", lb_ip = %c.ip, owner = ?c.owner, was = c.from.as_str(), "probe verdict reset: the owner changed");
        return;
    }
    if let Some(e) = event_name(c.from) {
        send(format!("{e}_ended"));
        if log {
            tracing::info!(target: "arp_guard::probing", lb_ip = %c.ip, owner = ?c.owner, was = c.from.as_str(), now = c.to.as_str(), answered_by = ?c.answered_by, "probe verdict ended");
        }
    }
    if let Some(e) = event_name(c.to) {
        send(e.to_owned());
        if log {
            tracing::warn!(
                target: "arp_guard::probing",
                lb_ip = %c.ip, owner = ?c.owner, answered_by = ?c.answered_by, unanswered = c.unanswered, interface = ?c.interface,
                "{}",
                match c.to {
                    ProbingVerdict::Conflict => "more than one MAC answered one request for this LB IP (split brain, a device outside the cluster, or nodes answering that should not)",
                    ProbingVerdict::SilentOwner => "the owner of this LB IP did not answer the last requests (nobody did, or only a MAC that is not the owner's): clients that ask get no answer or the wrong one",
                    _ => "the owner answers for this LB IP from an interface its guard does not guard (a bond slave or a second NIC)",
                }
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_bad_verdict_has_an_event_of_its_own_and_the_good_ones_none() {
        let names: Vec<_> = ProbingVerdict::ALL
            .iter()
            .filter_map(|v| event_name(*v))
            .collect();
        assert_eq!(
            names,
            ["probe_conflict", "silent_owner", "owner_wrong_interface"]
        );
        assert_eq!(event_name(ProbingVerdict::Answered), None);
    }
}
