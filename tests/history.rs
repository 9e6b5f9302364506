//! What the guard knew of recent moves survives its restarts: a rolling
//! upgrade (SIGTERM with `--on-exit keep`, then a new daemon) and a crash
//! (SIGKILL). The node of the test bed loses an LB IP (clients still send
//! to it: one follows, one stays stale) and takes another over (silently);
//! after each restart `/clients`, `arp-guard clients`, the takeover record
//! and the IP's `since` are what they were, the loss is still "moved away
//! N s ago" (not `not_owned_here`), and nothing is reported twice. A
//! history that cannot be taken (corrupt, another version, not a history
//! at all) is said in one line and the daemon guards as ever; a flood of
//! forged MACs keeps it bounded; `--refresh-stale-clients` still knows the
//! owner after a restart (and, without the history, does not). All under
//! the DaemonSet's capabilities.

use std::{
    net::Ipv4Addr,
    path::Path,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::Duration,
};

use serde_json::Value;
use testbed::{
    bed::{Bed, Bpffs, FOREIGN, NODE, OTHER, OWNED},
    guard_binary, ip_bytes,
    takeover::{Style, TakeoverBed, LB},
    wait_for, Daemon, Netns, RawSocket,
};

const CLIENT_A: [u8; 6] = [0x02, 0, 0x5e, 0, 0x53, 0xc1];
const CLIENT_B: [u8; 6] = [0x02, 0, 0x5e, 0, 0x53, 0xc2];
const CLIENT_A_IP: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 31);
const CLIENT_B_IP: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 32);
const A: &str = "02:00:5e:00:53:c1";
const B: &str = "02:00:5e:00:53:c2";

/// As the DaemonSet runs it (`--on-exit keep`), with thresholds a test
/// can wait for, and a liveness gate no restart reaches (not the subject).
const ARGS: [&str; 8] = [
    "--on-exit",
    "keep",
    "--stale-client-after",
    "3s",
    "--heartbeat-stale-after",
    "10m",
    "--heartbeat-dead-after",
    "20m",
];

fn start(bed: &Bed, pins: &Path) -> Daemon {
    let dir = pins.to_str().unwrap();
    let args = [&["--pin-dir", dir][..], &ARGS].concat();
    bed.start_wrapped(&testbed::deploy::daemonset_wrapper(), &args)
        .unwrap()
}

fn api(ns: &Netns, path: &str) -> Value {
    let path = path.to_owned();
    let (code, body) = ns
        .enter(move || Ok(testbed::http_get("127.0.0.1:9477", &path)))
        .unwrap();
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

/// The clients of `ip` once `ok` holds for them.
fn clients_of(ns: &Netns, ip: Ipv4Addr, ok: impl Fn(&Value) -> bool) -> Value {
    wait_for(Duration::from_secs(15), || {
        let e = api(ns, "/clients")["ips"][ip.to_string()].clone();
        ok(&e).then_some(e)
    })
    .unwrap_or_else(|| panic!("clients of {ip}: {:#}", api(ns, "/clients")))
}

fn client<'a>(e: &'a Value, mac: &str) -> &'a Value {
    e["clients"]
        .as_array()
        .and_then(|a| a.iter().find(|c| c["mac"] == mac))
        .unwrap_or_else(|| panic!("no client {mac} in {e:#}"))
}

/// The node's `/status` row for `ip`.
fn status_row(ns: &Netns, ip: Ipv4Addr) -> Value {
    let v = api(ns, "/status");
    v["ips"]
        .as_array()
        .and_then(|rows| rows.iter().find(|r| r["ip"] == ip.to_string()).cloned())
        .unwrap_or(Value::Null)
}

fn metric(ns: &Netns, series: &str) -> Option<f64> {
    let (_, text) = ns
        .enter(|| Ok(testbed::http_get("127.0.0.1:9477", "/metrics")))
        .unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
}

/// The move: OWNED goes to the other node, FOREIGN comes to this one (a
/// takeover nobody announces: silent).
fn move_ips(bed: &Bed) {
    let owners = testbed::bed::default_owners()
        .replace(
            &format!("- ip: {OWNED}\n    owner: {NODE}"),
            &format!("- ip: {OWNED}\n    owner: {OTHER}"),
        )
        .replace(
            &format!("- ip: {FOREIGN}\n    owner: {OTHER}"),
            &format!("- ip: {FOREIGN}\n    owner: {NODE}"),
        );
    bed.replace_owners(&owners).unwrap();
}

/// Client B sends to `ip` through the node's MAC every 200 ms until told to
/// stop; how many it sent.
fn client_b(bed: &Bed, ip: Ipv4Addr) -> (Arc<AtomicBool>, std::thread::JoinHandle<u64>) {
    let stop = Arc::new(AtomicBool::new(false));
    let wire = RawSocket::open(&bed.peer, "eth0").unwrap();
    let f = ip_bytes(
        CLIENT_B,
        bed.node_mac,
        CLIENT_B_IP.into(),
        ip.into(),
        Some(9),
    );
    let s = stop.clone();
    let t = std::thread::spawn(move || {
        let mut sent = 0;
        while !s.load(Ordering::Relaxed) {
            wire.send(&f).unwrap();
            sent += 1;
            std::thread::sleep(Duration::from_millis(200));
        }
        sent
    });
    (stop, t)
}

/// What the guard says of the move and the takeover, to compare across a
/// restart.
#[derive(Debug)]
struct Seen {
    clients: Value,
    takeover: Value,
    since_lost: Value,
    since_taken: Value,
}

fn seen(bed: &Bed) -> Seen {
    let clients = clients_of(&bed.node, OWNED, |e| {
        e["cause"] == "after_move" && e["stale"] == 1 && e["sending"] == 1
    });
    let (lost, taken) = (status_row(&bed.node, OWNED), status_row(&bed.node, FOREIGN));
    Seen {
        clients,
        takeover: taken["takeover"].clone(),
        since_lost: lost["since_unix"].clone(),
        since_taken: taken["since_unix"].clone(),
    }
}

/// After a restart: the same move, the same clients (B's counts going on),
/// the same takeover, and nothing reported again by the new daemon.
fn same_as_before(bed: &Bed, guard: &Daemon, before: &Seen) {
    // B's packets since the last write before a SIGKILL are lost with the
    // daemon: its count goes on from there, and catches up as it sends.
    let b0 = client(&before.clients, B)["packets"].as_u64();
    clients_of(&bed.node, OWNED, |e| {
        e["clients"]
            .as_array()
            .and_then(|a| a.iter().find(|c| c["mac"] == B))
            .is_some_and(|c| c["packets"].as_u64() > b0)
    });
    let now = seen(bed);
    let (b0, b1) = (&before.clients, &now.clients);
    eprintln!("before: {b0:#}\nafter: {b1:#}");
    assert!(
        b1["moved_ago_s"].as_u64() >= b0["moved_ago_s"].as_u64(),
        "{b1:#}"
    );
    assert!(b1["packets_total"].as_u64() >= b0["packets_total"].as_u64());
    let (a0, a1) = (client(b0, A), client(b1, A));
    assert_eq!(a1["status"], "gone", "{b1:#}");
    assert_eq!(
        (
            &a1["packets"],
            &a1["failover_s"],
            &a1["first_seen_ago_s"].is_u64()
        ),
        (&a0["packets"], &a0["failover_s"], &true),
        "A followed before the restart: {b1:#}"
    );
    let (s0, s1) = (client(b0, B), client(b1, B));
    assert_eq!(s1["status"], "stale");
    assert!(
        s1["packets"].as_u64() > s0["packets"].as_u64(),
        "counted on: {b1:#}"
    );
    assert!(s1["first_seen_ago_s"].as_u64() >= s0["first_seen_ago_s"].as_u64());
    assert!(s1["misdirected_s"].as_f64() > s0["misdirected_s"].as_f64());
    assert_eq!(now.takeover, before.takeover, "the takeover record");
    assert_eq!(now.since_lost, before.since_lost, "since the move");
    assert_eq!(now.since_taken, before.since_taken, "since the takeover");
    assert_eq!(
        metric(&bed.node, "arp_guard_stale_clients{cause=\"after_move\"}"),
        Some(1.0)
    );
    assert_eq!(
        metric(
            &bed.node,
            "arp_guard_stale_clients{cause=\"not_owned_here\"}"
        ),
        Some(0.0)
    );
    let out = bed
        .node
        .exec_output(&[guard_binary().to_str().unwrap(), "clients"])
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table.contains("moved away") && !table.contains("not owned here"),
        "{table}"
    );
    assert_eq!(out.status.code(), Some(1), "a stale client: exit 1");
    // Reported by the daemon before: not again.
    assert_eq!(guard.count_log("stale client:"), 0, "{}", guard.log_text());
    assert_eq!(guard.count_log("silent takeover"), 0);
    assert_eq!(guard.count_log("history of recent moves ignored"), 0);
}

#[test]
fn a_restart_keeps_what_the_guard_knew_of_recent_moves() {
    testbed::require_root();
    let bed = Bed::new("hist").unwrap();
    let fs = Bpffs::new("hist").unwrap();
    let pins = fs.path().join("arp-guard");
    let mut guard = start(&bed, &pins);
    guard.expect_log("no history of recent moves", Duration::from_secs(1));
    let wire = RawSocket::open(&bed.peer, "eth0").unwrap();
    move_ips(&bed);
    assert!(testbed::wait_until(Duration::from_secs(5), || {
        status_row(&bed.node, OWNED)["state"] == "foreign"
    }));
    // A sends three packets and follows the move; B never does.
    for _ in 0..3 {
        let f = ip_bytes(
            CLIENT_A,
            bed.node_mac,
            CLIENT_A_IP.into(),
            OWNED.into(),
            Some(9),
        );
        assert!(wire.send(&f).unwrap());
        std::thread::sleep(Duration::from_millis(100));
    }
    let (stop, b) = client_b(&bed, OWNED);
    guard.expect_log("stale client:", Duration::from_secs(10));
    guard.expect_log("silent takeover", Duration::from_secs(5));
    let before = seen(&bed);
    assert_eq!(before.takeover["silent"], true, "{:#}", before.takeover);
    assert_eq!(client(&before.clients, A)["status"], "gone");

    // A rolling upgrade: SIGTERM, then the next daemon.
    guard.stop(libc::SIGTERM, Duration::from_secs(10)).unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let guard = start(&bed, &pins);
    let line = guard.expect_log("history of recent moves read", Duration::from_secs(1));
    assert!(
        line.contains(r#""losses":1"#) && line.contains(r#""takeovers":1"#),
        "{line}"
    );
    same_as_before(&bed, &guard, &before);

    // A crash: SIGKILL, once the new daemon has written what it knows.
    std::thread::sleep(Duration::from_secs(6));
    let before = seen(&bed);
    let mut guard = guard;
    guard.stop(libc::SIGKILL, Duration::from_secs(5)).unwrap();
    let guard = start(&bed, &pins);
    guard.expect_log("history of recent moves read", Duration::from_secs(1));
    same_as_before(&bed, &guard, &before);

    stop.store(true, Ordering::Relaxed);
    b.join().unwrap();
    // B follows at last: its failover time spans both restarts.
    let e = clients_of(&bed.node, OWNED, |e| e["stale"] == 0 && e["sending"] == 0);
    assert!(client(&e, B)["failover_s"].as_f64() > Some(10.0), "{e:#}");
}

/// Pin `bytes` as the history under `dir` (pages of 4 KiB, as the daemon
/// stores it), replacing what is there.
fn pin_history(dir: &Path, bytes: &[u8]) {
    let path = dir.join("history");
    let _ = std::fs::remove_file(&path);
    let pages = bytes.len().div_ceil(4096).max(1) as u32;
    let mut a: aya::maps::Array<aya::maps::MapData, [u8; 4096]> =
        aya::maps::Array::create(pages, 0).unwrap();
    for (i, c) in bytes.chunks(4096).enumerate() {
        let mut page = [0u8; 4096];
        page[..c.len()].copy_from_slice(c);
        a.set(i as u32, page, 0).unwrap();
    }
    a.pin(&path).unwrap();
}

/// The history under `dir`, as pinned.
fn pinned_history(dir: &Path) -> Vec<u8> {
    let data = aya::maps::MapData::from_pin(dir.join("history")).unwrap();
    let a: aya::maps::Array<_, [u8; 4096]> =
        aya::maps::Array::try_from(aya::maps::Map::Array(data)).unwrap();
    (0..a.len()).flat_map(|i| a.get(&i, 0).unwrap()).collect()
}

/// A history that cannot be taken is said once, with the pin and why, and
/// the daemon starts and guards without it (then writes its own).
#[test]
fn a_history_that_cannot_be_taken_is_ignored_in_one_line() {
    testbed::require_root();
    let bed = Bed::new("histbad").unwrap();
    let fs = Bpffs::new("histbad").unwrap();
    let pins = fs.path().join("arp-guard");
    std::fs::create_dir(&pins).unwrap();
    let cases: [(&str, Vec<u8>); 4] = [
        (
            "corrupt: truncated",
            b"arp-guard-history 1 9000 00000000000000aa\n{\"node\":\"node-a\",\"ips\":[".to_vec(),
        ),
        (
            "format version 2; this arp-guard reads version 1",
            b"arp-guard-history 2 2 0\n{}".to_vec(),
        ),
        (
            "corrupt: its content does not match its checksum",
            b"arp-guard-history 1 2 0000000000000001\n{}".to_vec(),
        ),
        ("not an arp-guard history", vec![0x42; 300]),
    ];
    for (why, bytes) in cases {
        pin_history(&pins, &bytes);
        let mut guard = start(&bed, &pins);
        let line = guard.expect_log("history of recent moves ignored", Duration::from_secs(1));
        assert!(
            line.contains(why) && line.contains("arp-guard/history"),
            "{why}: {line}"
        );
        let said = guard.count_log("history of recent moves ignored");
        assert_eq!(said, 1, "{}", guard.log_text());
        // It guards as ever: the kernel's reply for a foreign IP is stopped.
        assert_eq!(
            bed.peer_learns(&[OWNED, FOREIGN]).unwrap(),
            [Some(bed.node_mac), None]
        );
        // And writes its own in its place.
        assert!(
            testbed::wait_until(Duration::from_secs(3), || pinned_history(&pins)
                .starts_with(b"arp-guard-history 1 ")),
            "{}",
            guard.log_text()
        );
        guard.stop(libc::SIGKILL, Duration::from_secs(5)).unwrap();
    }
    // A pin that is no history map at all (a map too large to be one).
    let huge = vec![0u8; 2 << 20];
    pin_history(&pins, &huge);
    let guard = start(&bed, &pins);
    let line = guard.expect_log("history of recent moves ignored", Duration::from_secs(1));
    assert!(line.contains("not a history"), "{line}");
    assert_eq!(
        bed.peer_learns(&[OWNED, FOREIGN]).unwrap(),
        [Some(bed.node_mac), None]
    );
}

/// A flood of forged source MACs, each one a misdirected client, keeps the
/// history within its bounds: the 2,048 most recent clients, under 1 MiB,
/// written and read back in milliseconds; the next daemon lists them.
#[test]
fn a_flood_keeps_the_history_bounded() {
    testbed::require_root();
    let bed = Bed::new("histfl").unwrap();
    let fs = Bpffs::new("histfl").unwrap();
    let pins = fs.path().join("arp-guard");
    let mut guard = start(&bed, &pins);
    let wire = RawSocket::open(&bed.peer, "eth0").unwrap();
    let n = 6000u32;
    for i in 0..n {
        let b = i.to_be_bytes();
        let mac = [0x02, 0x66, b[0], b[1], b[2], b[3]];
        let f = ip_bytes(
            mac,
            bed.node_mac,
            CLIENT_B_IP.into(),
            FOREIGN.into(),
            Some(9),
        );
        let _ = wire.send(&f);
    }
    clients_of(&bed.node, FOREIGN, |e| {
        e["sending"].as_u64() >= Some(u64::from(n) / 2)
    });
    let written = wait_for(Duration::from_secs(15), || {
        let lines = guard.lines("history of recent moves written");
        lines.into_iter().find(|l| {
            let v: Value = serde_json::from_str(l).unwrap_or_default();
            v["bytes"].as_u64() > Some(100_000)
        })
    })
    .unwrap_or_else(|| panic!("{}", guard.log_text()));
    eprintln!("{written}");
    let stored = pinned_history(&pins);
    let header =
        String::from_utf8_lossy(&stored[..stored.iter().position(|b| *b == b'\n').unwrap()])
            .into_owned();
    let len: usize = header.split(' ').nth(2).unwrap().parse().unwrap();
    assert!(len <= 1 << 20, "{header}");
    let body: Value = serde_json::from_slice(&stored[header.len() + 1..][..len]).unwrap();
    assert_eq!(body["clients"].as_array().unwrap().len(), 2048, "{header}");
    eprintln!("stored: {header} in a map of {} bytes", stored.len());
    guard.stop(libc::SIGKILL, Duration::from_secs(5)).unwrap();
    let guard = start(&bed, &pins);
    let line = guard.expect_log("history of recent moves read", Duration::from_secs(1));
    eprintln!("{line}");
    assert!(line.contains(r#""clients":2048"#), "{line}");
    let e = clients_of(&bed.node, FOREIGN, |e| {
        e["clients"].as_array().map_or(0, Vec::len) as u64 + e["more"].as_u64().unwrap_or(0) >= 2048
    });
    assert_eq!(e["cause"], "not_owned_here");
    assert_eq!(
        guard.count_log("stale client:"),
        0,
        "reported before the restart"
    );
}

/// The client's own stack sends UDP to the LB IP every 50 ms until told to
/// stop (so that its neighbour cache decides where it goes).
fn udp_traffic(client: &Netns) -> (Arc<AtomicBool>, std::thread::JoinHandle<()>) {
    let stop = Arc::new(AtomicBool::new(false));
    let socket = client
        .enter(|| Ok(std::net::UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))?))
        .unwrap();
    let flag = stop.clone();
    let t = std::thread::spawn(move || {
        while !flag.load(Ordering::Relaxed) {
            let _ = socket.send_to(b"stale?", (LB, 7777));
            std::thread::sleep(Duration::from_millis(50));
        }
    });
    (stop, t)
}

/// The client holds `mac` for the LB IP (reachable for long).
fn point_client_at(t: &TakeoverBed, mac: [u8; 6]) {
    t.bed.peer.set_neigh("eth0", LB, &mac, "reachable").unwrap();
}

/// `--refresh-stale-clients` across a rolling upgrade of the node that lost
/// the IP, from the census alone (no presence): the new owner announced
/// once (Cilium), before the restart, and the new daemon's census starts
/// empty; the census's claims kept in the history still say who the owner
/// is, so a client that holds the old owner's MAC after the restart is
/// taught the new owner's, as it was before. Without the history (the pin
/// removed) the owner is uncertain and nothing is sent. With the
/// Kubernetes feed: the history is taken back at its first sync.
#[test]
fn after_a_restart_the_guard_still_knows_whom_to_teach() {
    testbed::require_root();
    let wrapper = testbed::deploy::daemonset_wrapper();
    let flags = ["--refresh-stale-clients", "--presence-period", "0"];
    let mut t = TakeoverBed::new_wrapped("histrf", Style::Cilium, true, &flags, &wrapper).unwrap();
    let fs = Bpffs::new("histrf").unwrap();
    let pins = fs.path().join("arp-guard");
    let mut args = flags.to_vec();
    args.extend(["--announcer", "cilium", "--pin-dir", pins.to_str().unwrap()]);
    args.extend(ARGS);
    let sync = Duration::from_secs(20);
    // Node-a's guard as the DaemonSet runs it, with pins.
    t.guards[0]
        .stop(libc::SIGTERM, Duration::from_secs(10))
        .unwrap();
    t.guards[0] = t.bed.start_on_wrapped(0, &wrapper, &args, sync).unwrap();
    // The client ignores gratuitous ARP for the LB IP (a router's way).
    let lb = LB.to_string();
    let nft = |cmd: &[&str]| {
        t.bed
            .peer
            .exec(&[&["nft", "add"][..], cmd].concat())
            .unwrap()
    };
    nft(&["table", "arp", "router"]);
    nft(&[
        "chain",
        "arp",
        "router",
        "in",
        "{ type filter hook input priority 0; }",
    ]);
    nft(&[
        "rule", "arp", "router", "in", "arp", "daddr", "ip", &lb, "drop",
    ]);
    let (stop, traffic) = udp_traffic(&t.bed.peer);
    let (a, b) = (t.bed.nodes[0].mac, t.bed.nodes[1].mac);
    let cached = |t: &TakeoverBed| t.bed.peer.cached_mac("eth0", &lb).ok().flatten();
    assert!(testbed::wait_until(Duration::from_secs(3), || cached(&t) == Some(a)));
    t.take_over().unwrap();
    assert!(
        testbed::wait_until(Duration::from_secs(5), || cached(&t) == Some(b)),
        "taught before the restart:\n{}",
        t.guards[0].log_text()
    );
    std::thread::sleep(Duration::from_secs(6)); // written since

    // A rolling upgrade of node-a, during which the client comes back to it
    // (its entry holds node-a's MAC again, past its locktime when the new
    // daemon starts).
    let upgrade = |t: &mut TakeoverBed, keep_history: bool| {
        t.guards[0]
            .stop(libc::SIGTERM, Duration::from_secs(10))
            .unwrap();
        if !keep_history {
            std::fs::remove_file(pins.join("history")).unwrap();
        }
        point_client_at(t, a);
        std::thread::sleep(Duration::from_millis(1100));
        t.guards[0] = t.bed.start_on_wrapped(0, &wrapper, &args, sync).unwrap();
    };
    upgrade(&mut t, true);
    t.guards[0].expect_log("history of recent moves read", Duration::from_secs(1));
    let taught = testbed::wait_until(Duration::from_secs(5), || cached(&t) == Some(b));
    assert!(
        taught,
        "not taught after the restart:\n{}",
        t.guards[0].log_text()
    );
    let line = t.guards[0].expect_log("stale client refreshed", Duration::from_secs(1));
    let owner = format!("\"owner_mac\":\"{}\"", testbed::netns::fmt_mac(&b));
    assert!(
        line.contains(&owner) && line.contains("\"evidence\":\"census\""),
        "{line}"
    );

    // The control: the same upgrade without the history teaches nobody.
    upgrade(&mut t, false);
    t.guards[0].expect_log("no history of recent moves", Duration::from_secs(1));
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(cached(&t), Some(a), "{}", t.guards[0].log_text());
    let node_a = &t.bed.nodes[0].ns;
    let uncertain = "arp_guard_client_refreshes_total{outcome=\"owner_uncertain\"}";
    assert!(testbed::counter(node_a, uncertain) >= 1.0);
    assert_eq!(t.guards[0].count_log("stale client refreshed"), 0);
    stop.store(true, Ordering::Relaxed);
    traffic.join().unwrap();
}
