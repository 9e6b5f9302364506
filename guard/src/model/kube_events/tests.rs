use super::*;

const IP: &str = "198.51.100.100";

fn facts(owned_here: bool) -> IpFacts<'static> {
    IpFacts {
        node: "node-b",
        owned_here,
        why: "Lease default/kubevip-web held by node-a",
        changed_ago: Duration::from_secs(3600),
    }
}

fn thresholds() -> Thresholds {
    Thresholds {
        split_brain_after: Duration::from_secs(10),
        stale_clients: 2,
        silent_after: Duration::from_secs(3),
    }
}

fn drop_line(origin: &str, state: &str, verdict: &str) -> String {
    serde_json::json!({
        "time": "1.0", "interface": "eth0", "lb_ip": IP, "family": "ipv4",
        "requester_ip": IP, "requester_mac": "02:00:00:00:00:02", "kind": "gratuitous",
        "origin": origin, "state": state, "verdict": verdict,
    })
    .to_string()
}

#[test]
fn only_a_speakers_stopped_announcement_of_a_foreign_ip_is_a_finding() {
    assert!(matches!(
        parse(&drop_line("speaker", "foreign", "dropped")),
        Some(Finding::SpeakerStopped { stopped: true, .. })
    ));
    assert!(matches!(
        parse(&drop_line("redirect", "foreign", "would_drop")),
        Some(Finding::SpeakerStopped { stopped: false, .. })
    ));
    assert_eq!(parse(&drop_line("kernel", "foreign", "dropped")), None);
    assert_eq!(parse(&drop_line("speaker", "unknown", "dropped")), None);
    assert_eq!(parse(&drop_line("speaker", "foreign", "rewritten")), None);
    let line = r#"{"event":"silent_takeover","lb_ip":"198.51.100.100","time":"1.0"}"#;
    assert_eq!(
        parse(line),
        Some(Finding::SilentTakeover {
            ip: IP.parse().unwrap()
        })
    );
    let line = r#"{"event":"takeover_announced","lb_ip":"198.51.100.100"}"#;
    assert_eq!(
        parse(line),
        Some(Finding::TakeoverAnnounced {
            ip: IP.parse().unwrap()
        })
    );
}

#[test]
fn a_split_brain_speaker_counts_once_stopped_for_the_threshold() {
    let (t, mut m, t0) = (thresholds(), Memory::default(), Instant::now());
    let f = parse(&drop_line("speaker", "foreign", "dropped")).unwrap();
    // A takeover's early announcement, held and re-sent, is no split brain.
    assert_eq!(event_for(&f, &facts(false), &t, &mut m, t0), None);
    let at = |s| t0 + Duration::from_secs(s);
    assert_eq!(event_for(&f, &facts(false), &t, &mut m, at(5)), None);
    let o = event_for(&f, &facts(false), &t, &mut m, at(10)).unwrap();
    assert_eq!(o.reason, Reason::SplitBrainSpeaker);
    assert_eq!(o.node_at_fault.as_deref(), Some("node-b"));
    assert!(o.note.contains("stopped 3 of them"), "{}", o.note);
    // After a long pause a new run starts from zero.
    assert_eq!(event_for(&f, &facts(false), &t, &mut m, at(80)), None);
    // Takeovers back and forth: each one's early announcements end with
    // this node the owner, and never add up to a run.
    let owned = Finding::TakeoverAnnounced {
        ip: IP.parse().unwrap(),
    };
    assert_eq!(event_for(&owned, &facts(true), &t, &mut m, at(81)), None);
    for s in (100..200).step_by(5) {
        assert_eq!(event_for(&f, &facts(false), &t, &mut m, at(s)), None);
        assert_eq!(event_for(&owned, &facts(true), &t, &mut m, at(s)), None);
    }
    // The IP changed hands between two of them (a takeover not timed, as
    // right after a start): a new run.
    let mut changed = facts(false);
    assert_eq!(event_for(&f, &changed, &t, &mut m, at(300)), None);
    changed.changed_ago = Duration::from_secs(2);
    assert_eq!(event_for(&f, &changed, &t, &mut m, at(312)), None);
    changed.changed_ago = Duration::from_secs(12);
    assert!(event_for(&f, &changed, &t, &mut m, at(322)).is_some());
}

#[test]
fn only_the_owner_reports_a_conflict() {
    let (t, mut m, now) = (thresholds(), Memory::default(), Instant::now());
    let f = Finding::Conflict {
        ip: IP.parse().unwrap(),
        claimed_elsewhere: true,
        macs: vec!["02:00:00:00:00:99".into()],
        ended: false,
    };
    assert_eq!(event_for(&f, &facts(false), &t, &mut m, now), None);
    let o = event_for(&f, &facts(true), &t, &mut m, now).unwrap();
    assert_eq!(o.reason, Reason::ResponderConflict);
    assert!(o.reason.warning());
    let ended = Finding::Conflict {
        ip: IP.parse().unwrap(),
        claimed_elsewhere: true,
        macs: vec![],
        ended: true,
    };
    let o = event_for(&ended, &facts(true), &t, &mut m, now).unwrap();
    assert_eq!(o.reason, Reason::ResponderConflictResolved);
    assert!(!o.reason.warning());
}

#[test]
fn stale_clients_count_from_the_threshold() {
    let (t, mut m, now) = (thresholds(), Memory::default(), Instant::now());
    let client = |c: &str| Finding::StaleClient {
        ip: IP.parse().unwrap(),
        client_ip: c.into(),
        mac: "02:00:00:00:00:01".into(),
    };
    assert_eq!(
        event_for(&client("a"), &facts(false), &t, &mut m, now),
        None
    );
    assert_eq!(
        event_for(&client("a"), &facts(false), &t, &mut m, now),
        None
    );
    let o = event_for(&client("b"), &facts(false), &t, &mut m, now).unwrap();
    assert_eq!(o.reason, Reason::StaleClients);
}

#[test]
fn the_largest_stale_clients_threshold_is_reached() {
    let t = Thresholds {
        stale_clients: MAX_STALE_LISTED,
        ..thresholds()
    };
    let (mut m, now) = (Memory::default(), Instant::now());
    let client = |i: usize| Finding::StaleClient {
        ip: IP.parse().unwrap(),
        client_ip: format!("198.51.100.{}", 30 + i),
        mac: format!("02:00:00:00:00:{i:02x}"),
    };
    for i in 1..MAX_STALE_LISTED {
        assert_eq!(event_for(&client(i), &facts(false), &t, &mut m, now), None);
    }
    let o = event_for(&client(MAX_STALE_LISTED), &facts(false), &t, &mut m, now).unwrap();
    assert_eq!(o.reason, Reason::StaleClients);
    assert_eq!(
        o.note.matches(" (02:").count(),
        MAX_STALE_LISTED,
        "{}",
        o.note
    );
}

fn occ(reason: Reason) -> Occurrence {
    Occurrence {
        reason,
        note: String::new(),
        node_at_fault: None,
    }
}

#[test]
fn the_limiter_spaces_each_stream_and_caps_the_node() {
    let t0 = Instant::now();
    let limits = Limits {
        per_stream: Duration::from_secs(60),
        per_minute: 3,
    };
    let mut l = Limiter::new(limits, t0);
    let key = |s: &str, r| (s.to_owned(), r);
    // A flapping IP: many occurrences, one publish per stream and period.
    for _ in 0..100 {
        l.offer(
            key("default/web", Reason::SilentTakeover),
            occ(Reason::SilentTakeover),
        );
    }
    assert_eq!(l.due(t0).len(), 1);
    l.offer(
        key("default/web", Reason::SilentTakeover),
        occ(Reason::SilentTakeover),
    );
    assert!(l.due(t0 + Duration::from_secs(30)).is_empty());
    assert_eq!(l.due(t0 + Duration::from_secs(60)).len(), 1);
    // The node's budget: 3 a minute, the rest wait.
    for i in 0..5 {
        l.offer(
            key(&format!("default/s{i}"), Reason::SilentTakeover),
            occ(Reason::SilentTakeover),
        );
    }
    // (the minute that began at t0 + 60 s has one publish in it already)
    assert_eq!(l.due(t0 + Duration::from_secs(61)).len(), 2);
    assert_eq!(l.waiting(), 3);
    assert!(l.due(t0 + Duration::from_secs(90)).is_empty());
    assert_eq!(l.due(t0 + Duration::from_secs(121)).len(), 3);
    assert_eq!(l.waiting(), 0);
    // Waiting streams are bounded.
    for i in 0..MAX_PENDING + 10 {
        l.offer(
            key(&format!("x/{i}"), Reason::StaleClients),
            occ(Reason::StaleClients),
        );
    }
    assert_eq!(
        l.offer(
            key("x/new", Reason::StaleClients),
            occ(Reason::StaleClients)
        ),
        Offered::Dropped
    );
}

#[test]
fn nodes_answering_arp_is_told_at_most_hourly() {
    let t0 = Instant::now();
    let limits = Limits {
        per_stream: Duration::from_secs(60),
        per_minute: 30,
    };
    let mut l = Limiter::new(limits, t0);
    let key = ("default/web".to_owned(), Reason::NodesAnswerArp);
    let at = |s| t0 + Duration::from_secs(s);
    // The owner offers it every few seconds while it lasts.
    let mut published = Vec::new();
    for s in (0..7300).step_by(5) {
        l.offer(key.clone(), occ(Reason::NodesAnswerArp));
        if !l.due(at(s)).is_empty() {
            published.push(s);
        }
    }
    assert_eq!(published, [0, 3600, 7200]);
    assert_eq!(
        Reason::NodesAnswerArp.interval(Duration::from_secs(7200)),
        Duration::from_secs(7200)
    );
    assert_eq!(
        Reason::SilentOwner.interval(Duration::from_secs(60)),
        Duration::from_secs(60)
    );
}

#[test]
fn the_active_census_verdicts_are_events_naming_the_owner() {
    let (t, mut m, now) = (thresholds(), Memory::default(), Instant::now());
    let line = |event: &str, by: &[&str]| {
        serde_json::json!({"time": "1.0", "event": event, "lb_ip": IP, "owner": "node-a",
            "answered_by": by, "unanswered": 3, "interface": "eth1"})
        .to_string()
    };
    let judge_line = |l: String, m: &mut Memory| {
        let f = parse(&l).unwrap();
        event_for(&f, &facts(false), &t, m, now)
    };
    let o = judge_line(line("silent_owner", &[]), &mut m).unwrap();
    assert_eq!(o.reason, Reason::SilentOwner);
    assert_eq!(o.node_at_fault.as_deref(), Some("node-a"));
    assert!(
        o.note.contains(
            "node-a owns 198.51.100.100 but nobody answered 3 requests in a row from node-b"
        ),
        "{}",
        o.note
    );
    let o = judge_line(
        line("silent_owner", &["02:00:5e:00:53:66 (not a guarded node)"]),
        &mut m,
    )
    .unwrap();
    assert!(o.note.contains("only 02:00:5e:00:53:66"), "{}", o.note);
    let o = judge_line(
        line("owner_wrong_interface", &["node-a (eth1, 02:..)"]),
        &mut m,
    )
    .unwrap();
    assert_eq!(o.reason, Reason::OwnerWrongInterface);
    assert!(o.note.contains("interface eth1"), "{}", o.note);
    // A conflict seen by an asker (not the owner) is an Event, its end a Normal one.
    let o = judge_line(line("probe_conflict", &["a", "b"]), &mut m).unwrap();
    assert_eq!(
        (o.reason, o.reason.warning()),
        (Reason::ResponderConflict, true)
    );
    let o = judge_line(line("probe_conflict_ended", &["a"]), &mut m).unwrap();
    assert_eq!(
        (o.reason, o.reason.warning()),
        (Reason::ResponderConflictResolved, false)
    );
    // The end of silence is said in the log only.
    assert_eq!(judge_line(line("silent_owner_ended", &["a"]), &mut m), None);
}

#[test]
fn a_split_election_is_posted_by_one_live_holder_on_every_service() {
    use guard_wire::api::{SharedService, SplitElection};
    let share = |svc: &str, holder: &str| SharedService {
        service: svc.into(),
        holder: Some(holder.into()),
        record: format!("Lease kube-system/cilium-l2announce-{svc} held by {holder}"),
        local: false,
    };
    let split = SplitElection {
        services: vec![
            share("default/web", "node-a"),
            share("default/web2", "node-b"),
        ],
        settled_on: None,
        settle: "not settled: --settle-shared-ips is off".into(),
    };
    let ip: IpAddr = "198.51.100.100".parse().unwrap();
    // Every guard computes the same poster, one of the holders.
    let p = split::poster(ip, &split, None).unwrap();
    assert!(["node-a", "node-b"].contains(&p));
    let live = [
        "node-c".to_owned(),
        "node-a".to_owned(),
        "node-b".to_owned(),
    ];
    assert_eq!(split::poster(ip, &split, Some(&live)), Some(p));
    // A holder whose guard is not live does not post; no live holder: the
    // holders still choose among themselves.
    let other = if p == "node-a" { "node-b" } else { "node-a" };
    let without = ["node-c".to_owned(), other.to_owned()];
    assert_eq!(split::poster(ip, &split, Some(&without)), Some(other));
    assert_eq!(
        split::poster(ip, &split, Some(&["node-c".to_owned()])),
        Some(p)
    );
    let ev = split::split_election(ip, &split);
    assert_eq!(ev.len(), 2);
    for (svc, o) in &ev {
        assert_eq!(o.reason, Reason::SplitElection);
        assert!(
            o.note.contains("default/web2") && o.note.contains(svc),
            "{}",
            o.note
        );
        assert!(
            o.note
                .contains("Cilium L2 announcements hold one Lease per Service"),
            "{}",
            o.note
        );
    }
    let done = split::split_resolved(ip, &["default/web".into(), "default/web2".into()]);
    assert!(done.iter().all(|(_, o)| !o.reason.warning()));
}

/// Every end the daemon posts ends the Warning `kubectl arp-guard` pairs it
/// with (guard_wire::events), and every pair there names reasons the
/// daemon posts.
#[test]
fn each_end_is_paired_with_its_warning_as_the_plugin_reads_them() {
    let name = |r: &Reason| r.as_str();
    for end in Reason::ALL.iter().filter(|r| !r.warning()) {
        let pair = (guard_wire::events::ENDED_BY.iter()).find(|(_, e)| *e == name(end));
        let (warning, _) = pair.unwrap_or_else(|| panic!("{end:?} ends nothing the plugin knows"));
        let w = Reason::ALL.iter().find(|r| name(r) == *warning);
        assert!(
            w.is_some_and(|w| w.warning()),
            "{warning} is no Warning reason"
        );
    }
    assert_eq!(
        guard_wire::events::ENDED_BY.len(),
        Reason::ALL.iter().filter(|r| !r.warning()).count()
    );
}
