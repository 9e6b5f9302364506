//! Nodes whose kernels answer ARP for LB IPs they do not own (kube-proxy
//! in IPVS mode with strictARP off: every Service IP sits on kube-ipvs0 of
//! every node, and with `arp_ignore=0` each node's kernel answers for
//! every one of them), told once per Service.
//!
//! - **Recognised first-hand.** Each guard sees its own kernel answer (the
//!   program's `origin="kernel"` replies) for an IP another node owns and
//!   that is not on the interface it answered on: only `arp_ignore=0` (or
//!   proxy ARP) answers that. Not stopped (monitor mode), it sets
//!   [`Record::kernel_answers`] in its presence record for
//!   [`ANSWERS_FOR`]. An answer for an IP on the interface itself is a
//!   stale VIP (a speaker that did not step down), not this.
//! - **Told by the owner.** Every node's guard would see the same thing for
//!   the same Service; only the IP's owner tells it, naming every node
//!   whose record says its kernel answers: one Event per Service, repeated
//!   at most every [`REPEAT`] while it lasts.
//! - **One story.** What the same cause makes the others see — two MACs
//!   answering one probe, several MACs claiming the IP, clients stuck on a
//!   node whose kernel answered them — is not told again as a conflict or
//!   stale clients ([`told`]).
//!
//! [`Record::kernel_answers`]: crate::model::presence::Record::kernel_answers

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
    time::Duration,
};

use super::{Finding, Occurrence, Reason};
use crate::model::presence::parse_mac;
use crate::model::probing::ProbingVerdict;

/// A node's record says its kernel answers for this long after its last
/// answer seen (the record is renewed every `--presence-period`).
pub const ANSWERS_FOR: Duration = Duration::from_secs(600);
/// The owner tells a Service at most this often.
pub const REPEAT: Duration = Duration::from_secs(3600);
/// Nodes named in the Event (the rest are counted).
const NAMED: usize = 6;

/// Whether this node's kernel answers now: its last unstopped answer for an
/// IP another node owns (CLOCK_MONOTONIC ns) is recent.
pub fn answers_now(last_ns: Option<u64>, now_ns: u64) -> bool {
    last_ns.is_some_and(|t| now_ns.saturating_sub(t) <= ANSWERS_FOR.as_nanos() as u64)
}

/// Whether the kernel's answer for `ip` is this cause: an IP another node
/// owns (`foreign`), not on the interface the answer left by (`on_iface`),
/// and not stopped.
pub fn is_arp_ignore(foreign: bool, on_iface: bool, stopped: bool, ip: IpAddr) -> bool {
    // NDP: the kernel answers only for addresses on the receiving interface.
    foreign && !on_iface && !stopped && ip.is_ipv4()
}

/// The Event the owner of `ip` (`owner`, this node) publishes when other
/// nodes' kernels answer for LB IPs (`answering`, from their records).
pub fn nodes_answer(ip: IpAddr, owner: &str, answering: &BTreeSet<String>) -> Option<Occurrence> {
    let others: Vec<&str> = (answering.iter())
        .map(String::as_str)
        .filter(|n| *n != owner)
        .collect();
    if others.is_empty() {
        return None;
    }
    let mut nodes = others[..others.len().min(NAMED)].join(", ");
    if others.len() > NAMED {
        nodes.push_str(&format!(" and {} more nodes", others.len() - NAMED));
    }
    let (answer, their) = match others.len() {
        1 => ("answers", "its kernel answers"),
        _ => ("answer", "their kernels answer"),
    };
    Some(Occurrence {
        reason: Reason::NodesAnswerArp,
        note: format!(
            "{nodes} also {answer} ARP for {ip}, which {owner} owns: {their} for every LB IP on a local interface such as kube-ipvs0 (kube-proxy in IPVS mode with strictARP off: net.ipv4.conf.all.arp_ignore=0), and arp-guard there is in monitor mode; clients may cache the wrong MAC. Fix: set strictARP: true in kube-proxy's configuration (ConfigMap kube-system/kube-proxy, ipvs.strictARP) and restart kube-proxy, or set net.ipv4.conf.all.arp_ignore=1 and arp_announce=2 on those nodes; arp-guard in enforce mode stops these answers meanwhile"
        ),
        node_at_fault: None,
    })
}

/// Whether a finding about an IP whose responders are `macs` is told by the
/// owner's Event already: every MAC other than the owner's belongs to a
/// node whose kernel answers (`answering`), by the presence records
/// (`who`: MAC -> node, interface), and there is one such.
pub fn told(
    macs: &[[u8; 6]],
    owner: Option<&str>,
    who: &BTreeMap<[u8; 6], (String, String)>,
    answering: &BTreeSet<String>,
) -> bool {
    let node = |m: &[u8; 6]| who.get(m).map(|(n, _)| n.as_str());
    let others: Vec<Option<&str>> = (macs.iter())
        .map(node)
        .filter(|n| n.is_none() || *n != owner)
        .collect();
    !others.is_empty()
        && owner.is_some()
        && others
            .iter()
            .all(|n| n.is_some_and(|n| answering.contains(n)))
}

/// Whether `f` is what the answering kernels make others see, told by the
/// owner's Event already: a conflict (passive or asked) among the owner
/// and nodes whose kernels answer, or stale clients on a node whose kernel
/// answers (`here_answers`: this one).
pub fn silenced(
    f: &Finding,
    owner: Option<&str>,
    who: &BTreeMap<[u8; 6], (String, String)>,
    answering: &BTreeSet<String>,
    here_answers: bool,
) -> bool {
    match f {
        Finding::Conflict { macs, .. } => {
            let macs: Vec<[u8; 6]> = macs.iter().filter_map(|m| parse_mac(m)).collect();
            told(&macs, owner, who, answering)
        }
        Finding::Probe {
            verdict: ProbingVerdict::Conflict,
            answered_by,
            ..
        } => told(&macs_in(answered_by), owner, who, answering),
        Finding::StaleClient { .. } => here_answers,
        _ => false,
    }
}

/// Whether `f` is a conflict the answering kernels may explain (judged
/// once the presence records had time to say whose kernels answer).
pub fn explicable(f: &Finding) -> bool {
    matches!(
        f,
        Finding::Conflict { .. }
            | Finding::Probe {
                verdict: ProbingVerdict::Conflict,
                ..
            }
    )
}

/// The MACs a finding's words name (`02:00:..` anywhere in them).
pub fn macs_in(words: &[String]) -> Vec<[u8; 6]> {
    (words.iter())
        .flat_map(|w| w.split(|c: char| !(c.is_ascii_hexdigit() || c == ':')))
        .filter_map(parse_mac)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;
    const IP: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(198, 51, 100, 100));
    const A: [u8; 6] = [2, 0, 0, 0, 0, 0xa];
    const B: [u8; 6] = [2, 0, 0, 0, 0, 0xb];
    const C: [u8; 6] = [2, 0, 0, 0, 0, 0xc];
    const X: [u8; 6] = [2, 0, 0, 0, 0, 0x66];

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    #[test]
    fn a_kernel_answer_for_an_ip_held_elsewhere_is_arp_ignore_for_a_while() {
        assert!(is_arp_ignore(true, false, false, IP));
        assert!(!is_arp_ignore(true, true, false, IP), "a stale VIP on eth0");
        assert!(
            !is_arp_ignore(true, false, true, IP),
            "stopped: enforce mode"
        );
        assert!(!is_arp_ignore(false, false, false, IP), "owned here");
        assert!(!is_arp_ignore(
            true,
            false,
            false,
            "fd00::1".parse().unwrap()
        ));
        assert!(answers_now(Some(100 * S), 100 * S + 600 * S));
        assert!(!answers_now(Some(100 * S), 100 * S + 601 * S));
        assert!(!answers_now(None, 100 * S));
    }

    #[test]
    fn the_owner_names_every_other_node_whose_kernel_answers_and_the_fix() {
        assert_eq!(nodes_answer(IP, "node-a", &set(&[])), None);
        assert_eq!(nodes_answer(IP, "node-a", &set(&["node-a"])), None);
        let o = nodes_answer(IP, "node-a", &set(&["node-a", "node-b", "node-c"])).unwrap();
        assert_eq!(o.reason, Reason::NodesAnswerArp);
        assert!(o.reason.warning());
        assert!(
            o.note.starts_with(
                "node-b, node-c also answer ARP for 198.51.100.100, which node-a owns: their kernels answer"
            ),
            "{}",
            o.note
        );
        for w in ["strictARP: true", "arp_ignore=1", "enforce mode"] {
            assert!(o.note.contains(w), "{w}: {}", o.note);
        }
        assert!(o.note.len() <= 1024, "{}", o.note.len());
        let many: Vec<String> = (0..100)
            .map(|i| format!("node-{i:03}-with-a-long-name"))
            .collect();
        let o = nodes_answer(IP, "node-a", &many.iter().cloned().collect()).unwrap();
        assert!(
            o.note.contains("and 94 more nodes") && o.note.len() <= 1024,
            "{}",
            o.note
        );
        let o = nodes_answer(IP, "node-a", &set(&["node-b"])).unwrap();
        assert!(o.note.contains("node-b also answers ARP") && o.note.contains("its kernel"));
    }

    #[test]
    fn what_the_answering_kernels_make_others_see_is_told_once() {
        let who: BTreeMap<[u8; 6], (String, String)> =
            [(A, "node-a"), (B, "node-b"), (C, "node-c")]
                .into_iter()
                .map(|(m, n)| (m, (n.to_string(), "eth0".to_string())))
                .collect();
        let answering = set(&["node-b", "node-c"]);
        // Two answers to one probe: the owner and a node whose kernel answers.
        assert!(told(&[A, C], Some("node-a"), &who, &answering));
        assert!(told(&[B, C], Some("node-a"), &who, &answering));
        // A device outside the cluster, or a node whose kernel does not
        // answer, is another story.
        assert!(!told(&[A, X], Some("node-a"), &who, &answering));
        assert!(!told(&[A, B], Some("node-a"), &who, &set(&["node-c"])));
        // The owner alone, or no owner known: nothing to tell.
        assert!(!told(&[A], Some("node-a"), &who, &answering));
        assert!(!told(&[B, C], None, &who, &answering));
        let words = vec![
            "node-b (eth0, 02:00:00:00:00:0b)".to_string(),
            "02:00:00:00:00:66 (not a guarded node: a device outside the cluster)".to_string(),
        ];
        assert_eq!(macs_in(&words), vec![B, X]);
    }

    #[test]
    fn conflicts_and_stale_clients_of_answering_kernels_are_silenced() {
        let who: BTreeMap<[u8; 6], (String, String)> = [(A, "node-a"), (B, "node-b")]
            .into_iter()
            .map(|(m, n)| (m, (n.to_string(), "eth0".to_string())))
            .collect();
        let answering = set(&["node-b"]);
        let conflict = Finding::Conflict {
            ip: IP,
            claimed_elsewhere: true,
            macs: vec!["02:00:00:00:00:0b".into(), "02:00:00:00:00:0a".into()],
            ended: false,
        };
        assert!(silenced(&conflict, Some("node-a"), &who, &answering, false));
        assert!(!silenced(&conflict, Some("node-a"), &who, &set(&[]), false));
        let probe = |verdict| Finding::Probe {
            ip: IP,
            verdict,
            ended: false,
            owner: Some("node-a".into()),
            answered_by: vec![
                "node-a (eth0, 02:00:00:00:00:0a)".into(),
                "node-b (eth0, 02:00:00:00:00:0b)".into(),
            ],
            unanswered: 0,
            interface: "eth0".into(),
        };
        assert!(silenced(
            &probe(ProbingVerdict::Conflict),
            Some("node-a"),
            &who,
            &answering,
            false
        ));
        // A silent owner is its own story.
        assert!(!silenced(
            &probe(ProbingVerdict::SilentOwner),
            Some("node-a"),
            &who,
            &answering,
            true
        ));
        assert!(explicable(&conflict) && explicable(&probe(ProbingVerdict::Conflict)));
        assert!(!explicable(&probe(ProbingVerdict::SilentOwner)));
        let stale = Finding::StaleClient {
            ip: IP,
            client_ip: "198.51.100.1".into(),
            mac: "02:00:00:00:00:01".into(),
        };
        assert!(silenced(&stale, Some("node-a"), &who, &answering, true));
        assert!(!silenced(&stale, Some("node-a"), &who, &answering, false));
    }
}
