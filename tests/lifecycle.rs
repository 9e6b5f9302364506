//! The daemon over time: ownership-file reloads (valid, invalid, atomic
//! replace), the interface-address LB source, and clean detach on signals.

use std::time::Duration;

use anyhow::Context as _;

use testbed::{
    bed::{Bed, FOREIGN, NODE, OTHER, OWNED},
    guard_binary, wait_for, wait_until, ArpSpec, Daemon, RawSocket,
};

const RESOLVE: Duration = Duration::from_secs(3);

/// Flush the peer's cache, make it resolve `ip`, and return the MAC it learned.
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

fn resolve(bed: &Bed, ip: &str) -> Option<[u8; 6]> {
    bed.peer.flush_neigh("eth0").unwrap();
    bed.peer.poke(ip).unwrap();
    wait_for(RESOLVE, || bed.peer.cached_mac("eth0", ip).unwrap())
}

fn owners_with(foreign_owner: &str) -> String {
    format!(
        "ips:\n  - ip: {OWNED}\n    owner: {NODE}\n  - ip: {FOREIGN}\n    owner: {foreign_owner}\n"
    )
}

#[test]
fn ownership_file_reload_valid_and_invalid() {
    testbed::require_root();
    let bed = Bed::new("reload").unwrap();
    let guard = bed.start(&[]).unwrap();
    let f = FOREIGN.to_string();
    assert_eq!(
        resolve(&bed, &f),
        None,
        "foreign at start: the node must not answer"
    );

    // Atomic replace (write + rename), as ConfigMap updates and editors do.
    let tmp = bed.dir.path().join(".owners.tmp");
    std::fs::write(&tmp, owners_with(NODE)).unwrap();
    std::fs::rename(&tmp, &bed.owners).unwrap();
    guard.expect_log("ownership file reloaded", Duration::from_secs(5));
    assert_eq!(
        resolve(&bed, &f),
        Some(bed.node_mac),
        "now owned: the node answers"
    );

    // An invalid update in place: rejected with file, line and field; the
    // last good state (owned) stays in force.
    std::fs::write(&bed.owners, "ips:\n  - ip: 198.51.100.101\n    owner: node-a\n  - ip: 198.51.100.300\n    owner: node-b\n").unwrap();
    let line = guard.expect_log("ownership file rejected", Duration::from_secs(5));
    assert!(
        line.contains("owners.yaml:4"),
        "names file and line: {line}"
    );
    assert!(line.contains("ips[1].ip"), "names the field: {line}");
    assert_eq!(
        resolve(&bed, &f),
        Some(bed.node_mac),
        "the last good state stays in force"
    );
    assert_eq!(
        guard.count_log("ownership file rejected"),
        1,
        "one error per bad content, not one per poll"
    );

    // A truncated file (cut mid-write into invalid YAML) is rejected too.
    std::fs::write(
        &bed.owners,
        "ips:\n  - ip: 198.51.100.101\n    owner: [node-a\n",
    )
    .unwrap();
    assert!(wait_until(Duration::from_secs(5), || guard
        .count_log("ownership file rejected")
        == 2));
    assert_eq!(resolve(&bed, &f), Some(bed.node_mac));

    // A file that disappears keeps the state as well.
    std::fs::remove_file(&bed.owners).unwrap();
    guard.expect_log("ownership file unreadable", Duration::from_secs(5));
    assert_eq!(resolve(&bed, &f), Some(bed.node_mac));

    // Valid again, owned by the other node: protection is back.
    std::fs::write(&bed.owners, owners_with(OTHER)).unwrap();
    assert!(wait_until(Duration::from_secs(5), || guard
        .count_log("ownership file reloaded")
        == 2));
    assert_eq!(resolve(&bed, &f), None, "foreign again: dropped");
    assert!(
        guard.count_log("ownership changed") >= 2,
        "state changes are logged"
    );
}

/// What a careless operator or an attacker can put at the file's path: a
/// FIFO nobody writes (a plain read would block forever), a symlink to
/// /dev/zero (a plain read would grow without end), a file over the limit.
/// Each is refused at once, logged once with the path, the last good state
/// stays, later valid edits are applied, and SIGTERM still ends the daemon.
#[test]
fn hostile_ownership_files_are_refused_without_blocking() {
    testbed::require_root();
    let bed = Bed::new("hostile").unwrap();
    let mut guard = bed.start(&["--ownership-file-max-bytes", "4096"]).unwrap();
    let f = FOREIGN.to_string();
    assert_eq!(resolve(&bed, &f), None, "foreign at start");
    let problems = [
        ("FIFO", "is a FIFO"),
        ("/dev/zero", "is a character device"),
        ("too big", "more than the limit of 4096"),
    ];
    for (i, (what, message)) in problems.iter().enumerate() {
        // Made beside it and renamed over it: a poll never finds the file
        // missing in between (that would be a problem of its own).
        let next = bed.owners.with_extension("next");
        match *what {
            "FIFO" => testbed::mkfifo(&next),
            "/dev/zero" => std::os::unix::fs::symlink("/dev/zero", &next).unwrap(),
            _ => std::fs::write(
                &next,
                format!("# {}\n{}", "x".repeat(8192), owners_with(NODE)),
            )
            .unwrap(),
        }
        std::fs::rename(&next, &bed.owners).unwrap();
        let line = guard
            .wait_log(message, Duration::from_secs(5))
            .unwrap_or_else(|| panic!("{what}: {}", guard.log_text()));
        assert!(
            line.contains("owners.yaml"),
            "{what}: names the path: {line}"
        );
        // Many polls later (every 200 ms): still one line per problem.
        std::thread::sleep(Duration::from_secs(1));
        assert_eq!(guard.count_log(message), 1, "{what}: logged once");
        assert_eq!(guard.count_log("ownership file unreadable"), i + 1);
        assert_eq!(resolve(&bed, &f), None, "{what}: the last good state stays");
        assert!(guard.rss_kib() < 100 * 1024, "{what}: memory stays bounded");
    }
    // A valid edit after all that is applied.
    std::fs::remove_file(&bed.owners).unwrap();
    std::fs::write(&bed.owners, owners_with(NODE)).unwrap();
    guard.expect_log("ownership file reloaded", Duration::from_secs(5));
    assert_eq!(resolve(&bed, &f), Some(bed.node_mac), "now owned");
    // And with a FIFO in place again, SIGTERM still ends the daemon promptly.
    std::fs::remove_file(&bed.owners).unwrap();
    testbed::mkfifo(&bed.owners);
    std::thread::sleep(Duration::from_millis(500));
    let status = guard.stop(libc::SIGTERM, Duration::from_secs(5)).unwrap();
    assert!(status.success(), "{status:?}");
}

#[test]
fn lb_ips_from_interface_track_its_addresses() {
    testbed::require_root();
    let bed = Bed::new("ifsrc").unwrap();
    // Zero configuration: no ownership file, every address on kube-ipvs0 is unknown.
    let guard = Daemon::start(
        &bed.node,
        &[
            "-i",
            "eth0",
            "--node-name",
            NODE,
            "--lb-ips-from",
            "kube-ipvs0",
        ],
    )
    .unwrap();
    let ip = "198.51.100.120";
    // Not yet on kube-ipvs0: the node does not answer for it at all.
    assert_eq!(resolve(&bed, ip), None);
    bed.node
        .ip(&["addr", "add", &format!("{ip}/32"), "dev", "kube-ipvs0"])
        .unwrap();
    let added = guard.expect_log(&format!("\"lb_ip\":\"{ip}\""), Duration::from_secs(5));
    assert!(added.contains("LB IP added"), "{added}");
    // kube-proxy's address is now local, the kernel would answer, the guard drops it.
    assert_eq!(
        resolve(&bed, ip),
        None,
        "strictARP semantics: no reply for an unknown LB IP"
    );
    assert!(
        bed.packets(ip.parse().unwrap(), "reply", "kernel", "dropped")
            .unwrap()
            >= 1
    );
    // The same IP on the uplink itself (as kube-vip's leader does) is answered: arp_ignore=1 rule.
    bed.node
        .ip(&["addr", "add", &format!("{ip}/32"), "dev", "eth0"])
        .unwrap();
    // The address table is read after a netlink notification; give it a moment.
    let learned = wait_for(Duration::from_secs(5), || resolve(&bed, ip));
    assert_eq!(learned, Some(bed.node_mac));
    bed.node
        .ip(&["addr", "del", &format!("{ip}/32"), "dev", "eth0"])
        .unwrap();
    bed.node
        .ip(&["addr", "del", &format!("{ip}/32"), "dev", "kube-ipvs0"])
        .unwrap();
    guard.expect_log("LB IP removed", Duration::from_secs(5));
    // The pre-existing kube-ipvs0 addresses were picked up at start.
    assert_eq!(
        resolve(&bed, &OWNED.to_string()),
        None,
        "no file: OWNED is just another unknown LB IP here"
    );
}

fn attached(bed: &Bed) -> bool {
    bed.node
        .exec(&[guard_binary().to_str().unwrap(), "counters", "-i", "eth0"])
        .is_ok()
}

#[test]
fn sigterm_and_sigint_detach_cleanly() {
    testbed::require_root();
    let bed = Bed::new("sig").unwrap();
    let f = FOREIGN.to_string();
    for signal in [libc::SIGTERM, libc::SIGINT] {
        let mut guard = bed.start(&[]).unwrap();
        assert!(attached(&bed));
        assert_eq!(resolve(&bed, &f), None);
        let status = guard.stop(signal, Duration::from_secs(10)).unwrap();
        assert!(
            status.success(),
            "clean exit on signal {signal}: {status:?}\n{}",
            guard.log_text()
        );
        assert!(
            guard.log_text().contains("guard detached"),
            "{}",
            guard.log_text()
        );
        assert!(guard.log_text().contains("final counters"));
        assert!(
            !attached(&bed),
            "no program may stay attached after signal {signal}"
        );
        // With the guard gone the kernel's reply reaches the neighbour again.
        assert_eq!(resolve(&bed, &f), Some(bed.node_mac));
        let links = bed
            .node
            .exec(&["bpftool", "net", "show", "dev", "eth0"])
            .unwrap();
        assert!(!links.contains("arp_guard"), "{links}");
    }
}

#[test]
fn netlink_attach_mode_works_and_cleans_up() {
    testbed::require_root();
    let bed = Bed::new("nl").unwrap();
    let mut guard = bed.start(&["--attach", "netlink"]).unwrap();
    assert!(
        guard.log_text().contains("netlink-clsact"),
        "{}",
        guard.log_text()
    );
    let filters = bed
        .node
        .exec(&["tc", "filter", "show", "dev", "eth0", "egress"])
        .unwrap();
    assert!(filters.contains("arp_guard"), "{filters}");
    assert_eq!(resolve(&bed, &FOREIGN.to_string()), None);
    assert_eq!(resolve(&bed, &OWNED.to_string()), Some(bed.node_mac));
    guard.stop(libc::SIGTERM, Duration::from_secs(10)).unwrap();
    let filters = bed
        .node
        .exec(&["tc", "filter", "show", "dev", "eth0", "egress"])
        .unwrap();
    assert!(
        !filters.contains("arp_guard"),
        "filter left behind: {filters}"
    );
    assert_eq!(resolve(&bed, &FOREIGN.to_string()), Some(bed.node_mac));
}

/// Protection has no gap while the view changes: a speaker keeps announcing a
/// foreign IP while the ownership file is reloaded and kube-ipvs0 addresses
/// come and go; not one of its frames may reach the neighbour.
#[test]
fn reloads_open_no_gap() {
    testbed::require_root();
    let bed = Bed::new("nogap").unwrap();
    let guard = bed.start(&[]).unwrap();
    let cap = RawSocket::open(&bed.peer, "eth0").unwrap();
    let speaker = RawSocket::open(&bed.node, "eth0").unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let frame = ArpSpec::gratuitous(2, bed.node_mac, FOREIGN).to_bytes();
    let sender = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut sent = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                speaker.send(&frame).unwrap();
                sent += 1;
                std::thread::sleep(Duration::from_micros(500));
            }
            sent
        })
    };
    let extra = "198.51.100.150";
    for round in 0..6 {
        // Another IP changes owner in the file: a reload that rewrites the map.
        let owner = if round % 2 == 0 { NODE } else { OTHER };
        std::fs::write(
            &bed.owners,
            format!(
                "{}  - ip: {extra}\n    owner: {owner}\n",
                testbed::bed::default_owners()
            ),
        )
        .unwrap();
        let want = round + 1;
        assert!(
            wait_until(Duration::from_secs(5), || guard
                .count_log("ownership file reloaded")
                >= want),
            "reload {want} not seen:\n{}",
            guard.log_text()
        );
        // An address comes and goes on kube-ipvs0.
        let a = format!("198.51.100.{}/32", 160 + round);
        bed.node
            .ip(&["addr", "add", &a, "dev", "kube-ipvs0"])
            .unwrap();
        std::thread::sleep(Duration::from_millis(100));
        bed.node
            .ip(&["addr", "del", &a, "dev", "kube-ipvs0"])
            .unwrap();
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let sent = sender.join().unwrap();
    let leaked: Vec<_> = cap
        .collect_arp(Duration::from_millis(300))
        .unwrap()
        .into_iter()
        .filter(|c| c.spa == FOREIGN)
        .collect();
    assert!(
        leaked.is_empty(),
        "{} of {sent} foreign announcements got through",
        leaked.len()
    );
    let dropped = bed
        .packets(FOREIGN, "gratuitous", "speaker", "dropped")
        .unwrap();
    assert_eq!(dropped, sent, "every frame sent was judged and dropped");
    assert!(
        sent > 1000,
        "the speaker kept sending during the reloads ({sent})"
    );
}

/// The periodic full reconcile repairs maps changed behind the daemon's back.
#[test]
fn drifted_maps_are_repaired() {
    use aya::maps::{HashMap, Map, MapData};
    testbed::require_root();
    let bed = Bed::new("drift").unwrap();
    let guard = bed.start(&["--resync", "1s"]).unwrap();
    assert_eq!(resolve(&bed, &FOREIGN.to_string()), None);
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
        resolve(&bed, &FOREIGN.to_string()),
        None,
        "repaired: the foreign IP is guarded again"
    );
    // A swap that keeps IF_ADDRS the same size: UNKNOWN_ON_EGRESS's entry
    // replaced by a made-up one. Its kernel reply (unknown, on the egress
    // interface) would now be dropped; the drift is seen by content.
    let on_egress = testbed::bed::UNKNOWN_ON_EGRESS;
    assert_eq!(resolve(&bed, &on_egress.to_string()), Some(bed.node_mac));
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
        resolve(&bed, &on_egress.to_string()),
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
    assert_eq!(resolve(&bed, &f), None);
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
    assert_eq!(resolve(&bed, &f), None);
    // Dead (after 5 s): the kernel's reply passes too.
    let learned = wait_for(Duration::from_secs(8), || resolve(&bed, &f));
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
    assert_eq!(resolve(&bed, &f), None);
    assert!(bed.total("heartbeat_stale").unwrap() >= 1);
    assert!(bed.total("heartbeat_dead_passed").unwrap() >= 1);
    guard.stop(libc::SIGTERM, Duration::from_secs(10)).unwrap();
}

/// SIGHUP does not kill the daemon (its default action would): it re-applies.
#[test]
fn sighup_reapplies_and_keeps_running() {
    testbed::require_root();
    let bed = Bed::new("hup").unwrap();
    let mut guard = bed.start(&[]).unwrap();
    // SAFETY: a signal to our own child.
    unsafe { libc::kill(guard.pid() as i32, libc::SIGHUP) };
    guard.expect_log("SIGHUP", Duration::from_secs(5));
    assert_eq!(resolve(&bed, &FOREIGN.to_string()), None, "still guarding");
    let status = guard.stop(libc::SIGTERM, Duration::from_secs(10)).unwrap();
    assert!(status.success());
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
        resolve(&bed, &FOREIGN.to_string()),
        None,
        "an IP that fit is guarded"
    );
    assert_eq!(
        resolve(&bed, &FOREIGN_ON_EGRESS.to_string()),
        Some(bed.node_mac),
        "one that did not fit passes"
    );
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&status).unwrap()).unwrap();
    assert_eq!(v["not_enforced"], 3, "{v}");
    assert_eq!(v["lb_ips"]["total"], 6, "{v}");
    assert!(v["map_memory_bytes"].as_u64().unwrap() > 0, "{v}");
}

/// Interfaces come and go: a pattern that matches nothing at start is a
/// warning; an interface that appears, is deleted and re-created, or is
/// renamed into the pattern gets the guard.
#[test]
fn interfaces_are_attached_as_they_come_and_go() {
    use testbed::netns::veth;
    testbed::require_root();
    let bed = Bed::new("plug").unwrap();
    let status = bed.dir.path().join("status.json");
    let guard = bed
        .start(&["-i", "up*", "--status-file", status.to_str().unwrap()])
        .unwrap();
    guard.expect_log(
        "no interface matches --interface up*",
        Duration::from_secs(5),
    );
    let state = || -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(&status).unwrap()).unwrap()
    };
    assert!(state()["interfaces"]
        .as_array()
        .unwrap()
        .iter()
        .any(|i| i["name"] == "up*" && i["state"] == "missing"));

    // A second uplink: node side `dev`, neighbour side `peer_dev`, on 203.0.113.0/24.
    let plug = |dev: &str, peer_dev: &str| {
        veth(&bed.node, dev, &bed.peer, peer_dev).unwrap();
        bed.node
            .ip(&["addr", "add", "203.0.113.11/24", "dev", dev])
            .unwrap();
        bed.peer
            .ip(&["addr", "add", "203.0.113.1/24", "dev", peer_dev])
            .unwrap();
    };
    // Does the node's kernel answer a request for `ip` arriving on `peer_dev`'s link?
    let answers = |peer_dev: &str, ip: std::net::Ipv4Addr| {
        let sock = RawSocket::open(&bed.peer, peer_dev).unwrap();
        let mac = bed.peer.mac(peer_dev).unwrap();
        sock.drain();
        sock.send(&ArpSpec::request(mac, "203.0.113.1".parse().unwrap(), ip).to_bytes())
            .unwrap();
        sock.wait_arp(Duration::from_millis(800), |c| c.op == 2 && c.spa == ip)
            .unwrap()
            .is_some()
    };
    let attached = |name: &str, n: usize| {
        wait_for(Duration::from_secs(5), || {
            (guard
                .lines("guard attached to egress")
                .iter()
                .filter(|l| l.contains(&format!("\"interface\":\"{name}\"")))
                .count()
                >= n)
                .then_some(())
        })
        .is_some()
    };

    plug("up1", "up1p");
    assert!(attached("up1", 1), "{}", guard.log_text());
    assert!(!answers("up1p", FOREIGN), "guarded as soon as it appeared");
    assert!(answers("up1p", OWNED));

    // Deleted and re-created (a new ifindex): guarded again.
    bed.node.ip(&["link", "del", "up1"]).unwrap();
    guard.expect_log("guarded interface disappeared", Duration::from_secs(5));
    plug("up1", "up1p");
    assert!(attached("up1", 2), "{}", guard.log_text());
    assert!(!answers("up1p", FOREIGN));

    // Renamed into the pattern.
    bed.node.ip(&["link", "del", "up1"]).unwrap();
    plug("tmp9", "tmp9p");
    assert!(
        answers("tmp9p", FOREIGN),
        "tmp9 matches no pattern: not guarded"
    );
    bed.node.ip(&["link", "set", "tmp9", "down"]).unwrap();
    bed.node
        .ip(&["link", "set", "tmp9", "name", "up2"])
        .unwrap();
    bed.node.ip(&["link", "set", "up2", "up"]).unwrap();
    assert!(attached("up2", 1), "{}", guard.log_text());
    assert!(wait_until(Duration::from_secs(3), || !answers(
        "tmp9p", FOREIGN
    )));
    assert!(state()["interfaces"]
        .as_array()
        .unwrap()
        .iter()
        .any(|i| i["name"] == "up2" && i["state"] == "attached"));
}

/// Sends a foreign IP's gratuitous ARP from the node's speaker socket every
/// 0.5 ms until stopped; returns (sent, accepted by the kernel = not dropped).
fn foreign_speaker(
    bed: &Bed,
) -> (
    std::sync::Arc<std::sync::atomic::AtomicBool>,
    std::thread::JoinHandle<(u64, u64)>,
) {
    let speaker = RawSocket::open(&bed.node, "eth0").unwrap();
    let frame = ArpSpec::gratuitous(2, bed.node_mac, FOREIGN).to_bytes();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = stop.clone();
    let h = std::thread::spawn(move || {
        let (mut sent, mut passed) = (0, 0);
        while !flag.load(std::sync::atomic::Ordering::Relaxed) {
            passed += u64::from(speaker.send(&frame).unwrap());
            sent += 1;
            std::thread::sleep(Duration::from_micros(500));
        }
        (sent, passed)
    });
    (stop, h)
}

/// Pinned: a daemon killed with SIGKILL leaves its program and maps attached,
/// and the next one takes them over; not one frame the policy drops gets out
/// in between. The counters, pinned too, span both daemons.
#[test]
fn restart_after_sigkill_opens_no_gap() {
    testbed::require_root();
    let bed = Bed::new("restart").unwrap();
    let fs = testbed::bed::Bpffs::new("pins").unwrap();
    let dir = fs.path().join("arp-guard");
    let d = dir.to_str().unwrap();
    let cap = RawSocket::open(&bed.peer, "eth0").unwrap();
    let mut guard = bed.start(&["--pin-dir", d]).unwrap();
    for pin in ["prog", "map_LB_IPS", "map_COUNTERS", "map_HEARTBEAT"] {
        assert!(dir.join(pin).exists(), "{pin} pinned");
    }
    // TCX links are pinned; a netlink filter stays without a pin.
    assert_eq!(
        std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .any(|e| e.file_name().to_string_lossy().starts_with("link_")),
        testbed::kernel::has_tcx()
    );
    cap.drain();
    let (stop, sender) = foreign_speaker(&bed);
    std::thread::sleep(Duration::from_millis(300));
    guard.stop(libc::SIGKILL, Duration::from_secs(5)).unwrap();
    std::thread::sleep(Duration::from_millis(500)); // nobody home: the pinned program guards alone
    let mut guard = bed.start(&["--pin-dir", d]).unwrap();
    let took_over = if testbed::kernel::has_tcx() {
        "took over the pinned attachment"
    } else {
        "replaced an arp-guard filter left behind by an earlier run"
    };
    assert!(guard.log_text().contains(took_over), "{}", guard.log_text());
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (sent, passed) = sender.join().unwrap();
    let leaked = cap
        .collect_arp(Duration::from_millis(300))
        .unwrap()
        .into_iter()
        .filter(|c| c.spa == FOREIGN)
        .count();
    assert_eq!((passed, leaked), (0, 0), "{sent} sent through the restart");
    assert_eq!(
        bed.packets(FOREIGN, "gratuitous", "speaker", "dropped")
            .unwrap(),
        sent,
        "counted across both daemons"
    );
    assert!(sent > 1000);
    // A clean stop with the default --on-exit remove takes everything away.
    guard.stop(libc::SIGTERM, Duration::from_secs(10)).unwrap();
    assert!(!dir.exists(), "pins removed");
    assert_eq!(
        resolve(&bed, &FOREIGN.to_string()),
        Some(bed.node_mac),
        "detached"
    );
}

/// `--on-exit keep` leaves the guard enforcing after a clean stop;
/// `arp-guard uninstall` then removes every pin and attachment.
#[test]
fn keep_on_exit_then_uninstall() {
    testbed::require_root();
    let bed = Bed::new("keep").unwrap();
    let fs = testbed::bed::Bpffs::new("keep").unwrap();
    let dir = fs.path().join("arp-guard");
    let d = dir.to_str().unwrap();
    let mut guard = bed.start(&["--pin-dir", d, "--on-exit", "keep"]).unwrap();
    guard.stop(libc::SIGTERM, Duration::from_secs(10)).unwrap();
    assert!(
        guard
            .log_text()
            .contains("left attached for the next daemon"),
        "{}",
        guard.log_text()
    );
    assert_eq!(
        resolve(&bed, &FOREIGN.to_string()),
        None,
        "still guarded by the pinned program"
    );
    let out = bed
        .node
        .exec(&[
            guard_binary().to_str().unwrap(),
            "uninstall",
            "--pin-dir",
            d,
        ])
        .unwrap();
    let attachment = testbed::kernel::removed_attachment();
    assert!(
        out.contains(attachment) && out.contains("map_LB_IPS"),
        "{out}"
    );
    assert!(!dir.exists());
    assert_eq!(
        resolve(&bed, &FOREIGN.to_string()),
        Some(bed.node_mac),
        "uninstalled: nothing guards"
    );
    assert!(!attached(&bed));
}

/// bpffs unmounted under a running daemon: it stays up, keeps enforcing from
/// the maps it holds, and says so.
#[test]
fn bpffs_unmounted_under_a_running_daemon() {
    testbed::require_root();
    let bed = Bed::new("umount").unwrap();
    let fs = testbed::bed::Bpffs::new("umount").unwrap();
    let dir = fs.path().join("arp-guard");
    let mut guard = bed
        .start(&["--pin-dir", dir.to_str().unwrap(), "--resync", "1s"])
        .unwrap();
    fs.unmount_for(guard.pid()).unwrap();
    guard.expect_log("the pins are gone", Duration::from_secs(5));
    assert_eq!(resolve(&bed, &FOREIGN.to_string()), None, "still enforcing");
    // The policy can still change.
    std::fs::write(
        &bed.owners,
        testbed::bed::default_owners().replace("owner: node-b", "owner: node-a"),
    )
    .unwrap();
    guard.expect_log("ownership file reloaded", Duration::from_secs(5));
    assert_eq!(resolve(&bed, &FOREIGN.to_string()), Some(bed.node_mac));
    let status = guard.stop(libc::SIGTERM, Duration::from_secs(10)).unwrap();
    assert!(status.success(), "{}", guard.log_text());
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
    let bed_ips: Vec<std::net::Ipv4Addr> = testbed::bed::default_owners()
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- ip: ")?.parse().ok())
        .collect();
    let pool: Vec<std::net::Ipv4Addr> = (2..255u8)
        .map(|i| std::net::Ipv4Addr::new(203, 0, 113, i))
        .chain((12..100u8).map(|i| std::net::Ipv4Addr::new(198, 51, 100, i)))
        .chain((107..255u8).map(|i| std::net::Ipv4Addr::new(198, 51, 100, i)))
        .filter(|ip| !bed_ips.contains(ip))
        .collect();
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
        let mut file = String::from("ips:\n");
        for ip in round {
            file.push_str(&format!("  - ip: {ip}\n    owner: {OTHER}\n"));
        }
        let tmp = bed.dir.path().join(".owners.tmp");
        std::fs::write(&tmp, file).unwrap();
        std::fs::rename(&tmp, &bed.owners).unwrap();
        reloads += 1;
        assert!(
            wait_until(Duration::from_secs(5), || guard
                .count_log("ownership file reloaded")
                == reloads),
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
                    &ArpSpec::reply(bed.node_mac, *ip, bed.peer_mac, testbed::bed::PEER_IP)
                        .to_bytes()
                )
                .unwrap());
            assert!(speaker
                .send(&ArpSpec::request(bed.node_mac, *ip, testbed::bed::PEER_IP).to_bytes())
                .unwrap());
        }
        assert_eq!(
            rows_for(round),
            3 * round.len(),
            "every new IP is counted per IP"
        );
        // Rows of the IPs that left go once the grace period has passed.
        let earlier: Vec<_> = pool[..reloads * 60 - 60].to_vec();
        assert!(
            wait_until(Duration::from_secs(5), || rows_for(&earlier) == 0),
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

/// A second daemon on the same pin directory would run beside the first and,
/// exiting, remove the pins the first relies on for its no-gap restart. It
/// is refused, naming the first's pid; so is `uninstall` unless forced.
#[test]
fn one_daemon_per_pin_directory() {
    testbed::require_root();
    let bed = Bed::new("lock").unwrap();
    let fs = testbed::bed::Bpffs::new("lock").unwrap();
    let dir = fs.path().join("arp-guard");
    let d = dir.to_str().unwrap();
    let first = bed.start(&["--pin-dir", d]).unwrap();
    // The second one: same pins (another API port, so that the port is not
    // what stops it).
    let args = bed.args(&["--pin-dir", d, "--listen", "127.0.0.1:9478"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut second = Daemon::spawn(&bed.node, &args).unwrap();
    let status = second.wait_exit(Duration::from_secs(10)).unwrap();
    assert!(!status.success());
    let want = format!("another arp-guard (pid {}) uses --pin-dir {d}", first.pid());
    assert!(second.log_text().contains(&want), "{}", second.log_text());
    // The first one still guards, pins intact.
    assert!(dir.join("map_LB_IPS").exists());
    assert_eq!(resolve(&bed, &FOREIGN.to_string()), None);
    let bin = guard_binary();
    let uninstall = |extra: &[&str]| {
        let mut a = vec![bin.to_str().unwrap(), "uninstall", "--pin-dir", d];
        a.extend_from_slice(extra);
        bed.node.exec_output(&a).unwrap()
    };
    let out = uninstall(&[]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("arp-guard pid {} holds --pin-dir", first.pid()))
            && err.contains("--force"),
        "{err}"
    );
    assert!(dir.join("map_LB_IPS").exists(), "nothing removed");
    drop(first);
    // Once the first is gone, a new daemon takes the directory over.
    let _third = bed.start(&["--pin-dir", d]).unwrap();
    let out = uninstall(&["--force"]);
    assert!(out.status.success(), "{out:?}");
    assert!(!dir.exists());
}

/// Opens of `path` during `d`, seen by an inotify watch of this process
/// (open and close events both: inotify merges identical successive
/// events, an open after a close is not one).
fn opens_during(path: &std::path::Path, d: Duration) -> usize {
    use std::os::unix::ffi::OsStrExt as _;
    let name = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    let mask = libc::IN_OPEN | libc::IN_CLOSE_NOWRITE;
    // SAFETY: plain syscalls on a descriptor this function owns and closes;
    // the buffer outlives every read into it, and each event header read
    // from it lies within what the read returned.
    unsafe {
        let fd = libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC);
        assert!(fd >= 0);
        assert!(libc::inotify_add_watch(fd, name.as_ptr(), mask) >= 0);
        std::thread::sleep(d);
        let mut buf = [0u8; 65536];
        let mut opens = 0;
        loop {
            let got = libc::read(fd, buf.as_mut_ptr().cast(), buf.len());
            if got <= 0 {
                break;
            }
            let mut at = 0;
            while at + 16 <= got as usize {
                let ev: libc::inotify_event = std::ptr::read_unaligned(buf.as_ptr().add(at).cast());
                opens += usize::from(ev.mask & libc::IN_OPEN != 0);
                at += 16 + ev.len as usize;
            }
        }
        libc::close(fd);
        opens
    }
}

/// The daemon reads its ownership file when it changes and once per
/// `--file-poll`, not more: its own reads (inotify open events on the
/// directory it watches) do not wake another reload (they did, over and
/// over, keeping a daemon at rest busy).
#[test]
fn reading_the_ownership_file_does_not_wake_its_own_reload() {
    testbed::require_root();
    let bed = Bed::new("selfwake").unwrap();
    // The bed's usual arguments, polling once a minute instead of 5 a second.
    let args: Vec<String> = (bed.args(&[]).into_iter())
        .map(|a| if a == "200ms" { "60s".to_owned() } else { a })
        .collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let guard = Daemon::start(&bed.node, &args).unwrap();
    // A change is seen at once (and its reload reads the file)...
    std::fs::write(&bed.owners, owners_with(NODE)).unwrap();
    guard.expect_log("ownership file reloaded", Duration::from_secs(5));
    // ...and then the file is left alone.
    std::thread::sleep(Duration::from_secs(1));
    let opens = opens_during(&bed.owners, Duration::from_secs(3));
    assert!(
        opens <= 1,
        "the file was opened {opens} times in 3 s at rest"
    );
}
