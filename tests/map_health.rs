//! The maps kept healthy: drift repaired, the liveness gate opening in two
//! steps when heartbeats stop, a full map failing safe, counters of departed
//! IPs reclaimed with bounded metrics, a full counter map still deciding.

use std::time::Duration;

use anyhow::Context as _;

use testbed::{
    bed::{Bed, FOREIGN, OTHER},
    wait_for, wait_until, ArpSpec, RawSocket,
};

/// The guard's program on eth0 egress of the namespace the calling thread
/// is in: from the TCX chain, else from the netlink filter (kernels before
/// 6.6, the VM lane's 5.10 and 6.1).
fn attached_program() -> anyhow::Result<aya::programs::ProgramInfo> {
    use aya::programs::{SchedClassifier, TcAttachType};
    if testbed::kernel::has_tcx() {
        let (_, progs) = SchedClassifier::query_tcx("eth0", TcAttachType::Egress)?;
        return progs
            .into_iter()
            .find(|p| p.name_as_str().is_some_and(|n| n.starts_with("arp_guard")))
            .context("no arp-guard program in eth0's TCX chain");
    }
    let out = std::process::Command::new("tc")
        .args(["filter", "show", "dev", "eth0", "egress"])
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let id: u32 = text
        .lines()
        .filter(|l| l.contains("arp_guard"))
        .find_map(|l| {
            let mut w = l.split_whitespace();
            w.find(|x| *x == "id")?;
            w.next()?.parse().ok()
        })
        .with_context(|| format!("no arp-guard filter on eth0: {text}"))?;
    aya::programs::loaded_programs()
        .flatten()
        .find(|p| p.id() == id)
        .context("the filter's program is not loaded")
}

/// The periodic full reconcile repairs maps changed behind the daemon's back.
#[test]
fn drifted_maps_are_repaired() {
    use aya::maps::{HashMap, Map, MapData};
    testbed::require_root();
    let bed = Bed::new("drift").unwrap();
    let guard = bed.start(&["--resync", "1s"]).unwrap();
    assert_eq!(bed.resolve(&FOREIGN.to_string()), None);
    // Delete FOREIGN's entry from the attached program's LB_IPS map, as a
    // stray `bpftool map delete` would.
    bed.node
        .enter(|| {
            let prog = attached_program()?;
            for id in prog.map_ids()?.unwrap_or_default() {
                let data = MapData::from_id(id)?;
                if data.info()?.name_as_str() == Some(guard_common::MAP_LB_IPS) {
                    let mut m: HashMap<MapData, u32, guard_common::LbEntry> =
                        HashMap::try_from(Map::HashMap(data))?;
                    m.remove(&u32::from(FOREIGN))?;
                }
            }
            Ok(())
        })
        .unwrap();
    let line = guard.expect_log("BPF maps drifted", Duration::from_secs(5));
    assert!(line.contains("\"entries\":1"), "{line}");
    assert_eq!(
        bed.resolve(&FOREIGN.to_string()),
        None,
        "repaired: the foreign IP is guarded again"
    );
    // A swap that keeps IF_ADDRS the same size: UNKNOWN_ON_EGRESS's entry
    // replaced by a made-up one. Its kernel reply (unknown, on the egress
    // interface) would now be dropped; the drift is seen by content.
    let on_egress = testbed::bed::UNKNOWN_ON_EGRESS;
    assert_eq!(bed.resolve(&on_egress.to_string()), Some(bed.node_mac));
    bed.node
        .enter(move || {
            // SAFETY: if_nametoindex with a NUL-terminated name.
            let ifindex = unsafe { libc::if_nametoindex(c"eth0".as_ptr()) };
            let prog = attached_program()?;
            for id in prog.map_ids()?.unwrap_or_default() {
                let data = MapData::from_id(id)?;
                if data.info()?.name_as_str() == Some(guard_common::MAP_IF_ADDRS) {
                    let mut m: HashMap<MapData, guard_common::IfAddrKey, u8> =
                        HashMap::try_from(Map::HashMap(data))?;
                    let key = |a: std::net::Ipv4Addr| guard_common::IfAddrKey {
                        ifindex,
                        addr: u32::from(a),
                    };
                    m.remove(&key(on_egress))?;
                    m.insert(key(std::net::Ipv4Addr::new(198, 51, 100, 250)), 1, 0)?;
                }
            }
            Ok(())
        })
        .unwrap();
    assert!(
        wait_for(Duration::from_secs(5), || guard
            .lines("BPF maps drifted")
            .iter()
            .any(|l| l.contains("\"entries\":2"))
            .then_some(()))
        .is_some(),
        "{}",
        guard.log_text()
    );
    assert_eq!(
        bed.resolve(&on_egress.to_string()),
        Some(bed.node_mac),
        "repaired: the address is known on the egress interface again"
    );
}

/// The liveness gate, with the daemon frozen (SIGSTOP: no more heartbeats).
/// Fresh: foreign is dropped from any origin. Stale: foreign is judged as
/// unknown (a speaker passes, the kernel's reply is still dropped). Dead:
/// everything passes. Heartbeats again (SIGCONT): enforced again.
#[test]
fn liveness_gate_opens_in_two_steps_when_heartbeats_stop() {
    testbed::require_root();
    let bed = Bed::new("gate").unwrap();
    let mut guard = bed
        .start(&[
            "--heartbeat-stale-after",
            "2s",
            "--heartbeat-dead-after",
            "5s",
        ])
        .unwrap();
    let speaker = RawSocket::open(&bed.node, "eth0").unwrap();
    let garp = ArpSpec::gratuitous(2, bed.node_mac, FOREIGN).to_bytes();
    let f = FOREIGN.to_string();
    assert!(
        !speaker.send(&garp).unwrap(),
        "fresh: foreign speaker frame dropped"
    );
    assert_eq!(bed.resolve(&f), None);
    let pid = guard.pid() as i32;
    // SAFETY: signals to our own child.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    let frozen = std::time::Instant::now();
    // Stale (after 2 s): the speaker passes...
    assert!(wait_for(Duration::from_secs(4), || speaker
        .send(&garp)
        .unwrap()
        .then_some(()))
    .is_some());
    // (The last heartbeat may be up to 500 ms older than the freeze.)
    assert!(
        frozen.elapsed() >= Duration::from_millis(1400),
        "not before the stale threshold"
    );
    // ...the kernel's reply does not (unknown + kernel).
    assert_eq!(bed.resolve(&f), None);
    // Dead (after 5 s): the kernel's reply passes too.
    let learned = wait_for(Duration::from_secs(8), || bed.resolve(&f));
    assert_eq!(learned, Some(bed.node_mac));
    assert!(
        frozen.elapsed() >= Duration::from_millis(4400),
        "not before the dead threshold"
    );
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGCONT) };
    assert!(
        wait_until(Duration::from_secs(3), || !speaker.send(&garp).unwrap()),
        "enforced again"
    );
    assert_eq!(bed.resolve(&f), None);
    assert!(bed.total("heartbeat_stale").unwrap() >= 1);
    assert!(bed.total("heartbeat_dead_passed").unwrap() >= 1);
    guard.stop(libc::SIGTERM, Duration::from_secs(10)).unwrap();
}

/// A full LB IP map fails safe: the IPs that did not fit are not guarded
/// (their frames pass), and they are reported in the log and the status.
#[test]
fn a_full_map_fails_safe_and_reports() {
    use testbed::bed::FOREIGN_ON_EGRESS;
    testbed::require_root();
    let bed = Bed::new("full").unwrap();
    let status = bed.dir.path().join("status.json");
    // Six LB IPs, room for three: .101-.103 fit (ascending order), .104-.106 do not.
    let guard = bed
        .start(&[
            "--max-lb-ips",
            "3",
            "--status-file",
            status.to_str().unwrap(),
        ])
        .unwrap();
    let line = guard.expect_log("map full", Duration::from_secs(5));
    assert!(
        line.contains("\"count\":3") && line.contains("198.51.100.105"),
        "{line}"
    );
    assert_eq!(
        bed.resolve(&FOREIGN.to_string()),
        None,
        "an IP that fit is guarded"
    );
    assert_eq!(
        bed.resolve(&FOREIGN_ON_EGRESS.to_string()),
        Some(bed.node_mac),
        "one that did not fit passes"
    );
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&status).unwrap()).unwrap();
    assert_eq!(v["not_enforced"], 3, "{v}");
    assert_eq!(v["lb_ips"]["total"], 6, "{v}");
    assert!(v["map_memory_bytes"].as_u64().unwrap() > 0, "{v}");
}

/// LB IPs churn through (Services come and go): counter rows of IPs that
/// left are reclaimed after the grace period, so the counter map never fills
/// up with the past and new IPs are always counted per IP; /metrics keeps at
/// most --metrics-max-ip-series per-IP series.
#[test]
fn counters_of_departed_ips_are_reclaimed_and_metrics_stay_bounded() {
    testbed::require_root();
    let bed = Bed::new("churn").unwrap();
    // 64 LB IPs at most: the counter map then holds 1,024 rows; 8 rounds of
    // 60 IPs with 3 decisions each (1,440 rows) would fill it without reclaim.
    let guard = bed
        .start(&[
            "--max-lb-ips",
            "64",
            "--counter-grace",
            "1s",
            "--metrics-max-ip-series",
            "50",
        ])
        .unwrap();
    let pool = churn_pool();
    let speaker = RawSocket::open(&bed.node, "eth0").unwrap();
    let rows_for = |ips: &[std::net::Ipv4Addr]| -> usize {
        let c = bed.counters().unwrap();
        c["counters"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| ips.iter().any(|ip| r["lb_ip"] == ip.to_string()))
            .count()
    };
    let mut reloads = 0;
    for round in pool.chunks(60).take(8) {
        reloads += 1;
        churn_round(&bed, &guard, &speaker, round, reloads);
        assert_eq!(
            rows_for(round),
            3 * round.len(),
            "every new IP is counted per IP"
        );
        // Rows of the IPs that left go once the grace period has passed.
        let earlier: Vec<_> = pool[..reloads * 60 - 60].to_vec();
        assert!(
            // A deadline for "once the grace period has passed", not a
            // bound on it: a loaded, emulated machine takes longer.
            wait_until(Duration::from_secs(60), || rows_for(&earlier) == 0),
            "rows of departed IPs are reclaimed ({} left)",
            rows_for(&earlier)
        );
        assert_eq!(
            rows_for(round),
            3 * round.len(),
            "the current IPs keep theirs"
        );
    }
    // 1,440 rows went through a map of 1,024 and it never filled.
    assert_eq!(
        bed.total("counter_map_full").unwrap(),
        0,
        "the map never filled"
    );
    // /metrics: at most 50 per-IP series, the rest summed as "other".
    let (code, m) = bed
        .node
        .enter(|| guard::testing::get("127.0.0.1:9477".parse().unwrap(), "/metrics"))
        .unwrap();
    assert_eq!(code, 200);
    let per_ip = m
        .lines()
        .filter(|l| l.starts_with("arp_guard_arp_frames_total{") && !l.contains("lb_ip=\"other\""))
        .count();
    assert_eq!(per_ip, 50, "{m}");
    assert!(m.contains("lb_ip=\"other\""), "{m}");
    assert!(m.contains("arp_guard_metrics_folded_series 130"), "{m}");
}

/// A counter map that fills (IPs churn through faster than the grace period
/// reclaims their rows) fails safe: every decision is still made and
/// counted in total (`counter_map_full`), the newest IPs are still guarded,
/// and the program's log, forwarded by the daemon, says so once per CPU
/// (not once per frame).
#[test]
fn a_full_counter_map_keeps_deciding_and_says_so_once_per_cpu() {
    testbed::require_root();
    let bed = Bed::new("cfull").unwrap();
    // A counter map of 1,024 rows; 7 rounds of 60 IPs with 3 decisions each
    // (1,260 rows), none reclaimed within the hour.
    let guard = bed
        .start(&["--max-lb-ips", "64", "--counter-grace", "1h"])
        .unwrap();
    let speaker = RawSocket::open(&bed.node, "eth0").unwrap();
    let pool = churn_pool();
    let rounds: Vec<_> = pool.chunks(60).take(7).collect();
    for (i, round) in rounds.iter().enumerate() {
        churn_round(&bed, &guard, &speaker, round, i + 1);
    }
    let full = bed.total("counter_map_full").unwrap();
    assert!(
        full > 0,
        "1,260 rows went into 1,024: {}",
        bed.counters().unwrap()
    );
    let said = || guard.count_log("counter map full");
    assert!(
        wait_until(Duration::from_secs(5), || said() >= 1),
        "the log says the map is full: {}",
        guard.log_text()
    );
    // More decisions meet the full map (the last round again: its three
    // verdicts each, checked again by churn_round, still hold); each CPU
    // said it at most once.
    churn_round(&bed, &guard, &speaker, rounds[6], 7);
    assert!(bed.total("counter_map_full").unwrap() > full);
    std::thread::sleep(Duration::from_secs(2));
    // Per-CPU maps have a slot per possible CPU.
    let cpus = aya::util::nr_cpus().unwrap();
    assert!(
        (1..=cpus).contains(&said()),
        "said at most once per CPU ({cpus}): {}",
        guard.log_text()
    );
}

/// LB IPs for churn: the test nets' addresses not in the bed's own file.
fn churn_pool() -> Vec<std::net::Ipv4Addr> {
    let bed_ips: Vec<std::net::Ipv4Addr> = testbed::bed::default_owners()
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- ip: ")?.parse().ok())
        .collect();
    (2..255u8)
        .map(|i| std::net::Ipv4Addr::new(203, 0, 113, i))
        .chain((12..100u8).map(|i| std::net::Ipv4Addr::new(198, 51, 100, i)))
        .chain((107..255u8).map(|i| std::net::Ipv4Addr::new(198, 51, 100, i)))
        .filter(|ip| !bed_ips.contains(ip))
        .collect()
}

/// The ownership file becomes `round`, all owned by another node (the
/// `reloads`th reload), and each IP gets three decisions: its gratuitous
/// ARP and reply stopped, its announce leak passed (rewritten).
fn churn_round(
    bed: &Bed,
    guard: &testbed::daemon::Daemon,
    speaker: &RawSocket,
    round: &[std::net::Ipv4Addr],
    reloads: usize,
) {
    let mut file = String::from("ips:\n");
    for ip in round {
        file.push_str(&format!("  - ip: {ip}\n    owner: {OTHER}\n"));
    }
    bed.replace_owners(&file).unwrap();
    assert!(
        wait_until(Duration::from_secs(5), || guard
            .count_log("ownership file reloaded")
            >= reloads),
        "{}",
        guard.log_text()
    );
    // Applied once every IP's gratuitous ARP is stopped (the map is
    // written entry by entry, in no order the test may rely on).
    for ip in round {
        let garp = ArpSpec::gratuitous(2, bed.node_mac, *ip).to_bytes();
        assert!(wait_until(Duration::from_secs(5), || !speaker
            .send(&garp)
            .unwrap()));
    }
    // Three decisions per IP: reply, gratuitous, announce leak (all foreign).
    for ip in round {
        assert!(!speaker
            .send(&ArpSpec::gratuitous(2, bed.node_mac, *ip).to_bytes())
            .unwrap());
        assert!(!speaker
            .send(
                &ArpSpec::reply(bed.node_mac, *ip, bed.peer_mac, testbed::bed::PEER_IP).to_bytes()
            )
            .unwrap());
        assert!(speaker
            .send(&ArpSpec::request(bed.node_mac, *ip, testbed::bed::PEER_IP).to_bytes())
            .unwrap());
    }
}
