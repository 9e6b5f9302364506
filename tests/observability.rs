//! What an operator sees: `/metrics`, `/healthz`, `/readyz`, `arp-guard
//! status | explain | events`, and the drop-event stream with its in-kernel
//! rate limit, read back after causing drops in namespaces.

use std::{
    io::{BufRead as _, BufReader},
    net::SocketAddr,
    process::Stdio,
    sync::{Arc, Mutex},
    time::Duration,
};

use testbed::{
    bed::{Bed, FOREIGN, OWNED, PEER_IP},
    guard_binary, wait_for, wait_until, ArpSpec, RawSocket,
};

const API: &str = "127.0.0.1:9477";

/// GET `path` from the daemon's API inside `bed`'s node namespace.
fn get(bed: &Bed, path: &str) -> (u16, String) {
    let path = path.to_owned();
    bed.node
        .enter(move || guard::testing::get(API.parse::<SocketAddr>().unwrap(), &path))
        .unwrap()
}

fn cli(bed: &Bed, args: &[&str]) -> String {
    let mut a = vec![guard_binary().to_str().unwrap().to_owned()];
    a.extend(args.iter().map(|s| s.to_string()));
    let a: Vec<&str> = a.iter().map(String::as_str).collect();
    bed.node.exec(&a).unwrap()
}

/// The value of the series `name{labels}` in a Prometheus text scrape.
fn series(scrape: &str, name_and_labels: &str) -> Option<f64> {
    scrape
        .lines()
        .find_map(|l| l.strip_prefix(name_and_labels)?.trim().parse().ok())
}

#[test]
fn metrics_status_explain_and_health() {
    testbed::require_root();
    let bed = Bed::new("obs").unwrap();
    let _guard = bed.start(&[]).unwrap();
    // Cause decisions: the neighbour asks for a foreign and an owned IP.
    for ip in [FOREIGN, OWNED] {
        bed.peer.flush_neigh("eth0").unwrap();
        bed.peer.poke(&ip.to_string()).unwrap();
    }
    for (ip, action) in [(FOREIGN, "dropped"), (OWNED, "passed")] {
        assert!(
            wait_until(Duration::from_secs(3), || bed
                .packets(ip, "reply", "kernel", action)
                .unwrap()
                >= 1),
            "{ip} {action}"
        );
    }
    let dropped = bed.packets(FOREIGN, "reply", "kernel", "dropped").unwrap() as f64;

    let (code, m) = get(&bed, "/metrics");
    assert_eq!(code, 200);
    let frames = "arp_guard_arp_frames_total{lb_ip=\"198.51.100.102\",family=\"ipv4\",interface=\"eth0\",kind=\"reply\",origin=\"kernel\",state=\"foreign\",verdict=\"dropped\"}";
    assert!(series(&m, frames).is_some_and(|v| v >= dropped), "{m}");
    assert!(series(&m, "arp_guard_arp_frames_total{lb_ip=\"198.51.100.101\",family=\"ipv4\",interface=\"eth0\",kind=\"reply\",origin=\"kernel\",state=\"owned\",verdict=\"passed\"}").is_some_and(|v| v >= 1.0), "{m}");
    assert_eq!(
        series(&m, "arp_guard_lb_ips{state=\"foreign\",family=\"ipv4\"}"),
        Some(2.0),
        "{m}"
    );
    assert_eq!(
        series(&m, "arp_guard_lb_ips{state=\"owned\",family=\"ipv4\"}"),
        Some(2.0),
        "{m}"
    );
    assert_eq!(
        series(
            &m,
            &format!(
                "arp_guard_programs_attached{{interface=\"eth0\",attach=\"{}\"}}",
                if testbed::kernel::has_tcx() {
                    "tcx"
                } else {
                    "netlink-clsact"
                }
            )
        ),
        Some(1.0),
        "{m}"
    );
    assert_eq!(
        series(&m, "arp_guard_mode{mode=\"enforce\"}"),
        Some(1.0),
        "{m}"
    );
    assert!(
        series(&m, "arp_guard_map_updates_total{op=\"write\"}").is_some_and(|v| v >= 6.0),
        "{m}"
    );
    assert!(
        series(&m, "arp_guard_datapath_frames_total{class=\"arp\"}").is_some_and(|v| v >= 2.0),
        "{m}"
    );
    assert!(
        m.contains("# TYPE arp_guard_arp_frames_total counter"),
        "{m}"
    );
    // Without a feed its families are absent (the node name's match with
    // its holders too), and presence's (it needs the API); without a memory limit found (this machine's cgroups may have
    // none), so is the limit's; the refreshes of stale clients only with
    // --refresh-stale-clients (tests/refresh.rs, tests/presence.rs); the
    // active census's only with presence (tests/probing.rs).
    let absent_here = [
        "arp_guard_node_name_unmatched",
        "arp_guard_memory_limit_bytes",
        "arp_guard_presence_nodes",
        "arp_guard_client_refreshes_total",
        "arp_guard_probes_sent_total",
        "arp_guard_probe_send_errors_total",
        "arp_guard_probe_ips",
        "arp_guard_probe_interval_seconds",
    ];
    for name in guard::testing::metric_names()
        .iter()
        .filter(|n| !n.contains("feed") && !absent_here.contains(&n.as_str()))
    {
        assert!(
            m.contains(&format!("# TYPE {name}")),
            "{name} missing from the scrape:\n{m}"
        );
    }

    assert_eq!(get(&bed, "/healthz").0, 200);
    assert_eq!(get(&bed, "/readyz"), (200, "ready\n".to_owned()));

    let v: serde_json::Value = serde_json::from_str(&cli(&bed, &["status", "-o", "json"])).unwrap();
    assert_eq!(v["ready"], true);
    let row = v["ips"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["ip"] == FOREIGN.to_string())
        .unwrap()
        .clone();
    assert_eq!(row["state"], "foreign");
    assert!(
        row["source"]
            .as_str()
            .unwrap()
            .contains("ownership file line"),
        "{row}"
    );
    assert!(row["counters"]["dropped"].as_u64().unwrap() >= 1, "{row}");
    let table = cli(&bed, &["status"]);
    assert!(
        table.lines().any(|l| l
            .split_whitespace()
            .take(2)
            .eq(["198.51.100.102", "foreign"])),
        "{table}"
    );

    let text = cli(&bed, &["explain", &FOREIGN.to_string()]);
    assert!(
        text.contains("is foreign on this node") && text.contains("ownership file line"),
        "{text}"
    );
    let e: serde_json::Value =
        serde_json::from_str(&cli(&bed, &["explain", &FOREIGN.to_string(), "-o", "json"])).unwrap();
    let verdict = |kind: &str, origin: &str| {
        e["would"]
            .as_array()
            .unwrap()
            .iter()
            .find(|w| w["kind"] == kind && w["origin"] == origin)
            .map(|w| w["verdict"].as_str().unwrap().to_owned())
    };
    assert_eq!(verdict("reply", "kernel").as_deref(), Some("dropped"));
    assert_eq!(
        verdict("announce_leak", "speaker").as_deref(),
        Some("rewritten")
    );
    let e: serde_json::Value =
        serde_json::from_str(&cli(&bed, &["explain", &PEER_IP.to_string(), "-o", "json"])).unwrap();
    assert_eq!(e["lb_ip"], false);
}

#[test]
fn readyz_names_what_is_missing_and_clients_say_when_no_daemon_runs() {
    testbed::require_root();
    let bed = Bed::new("ready").unwrap();
    let out = bed
        .node
        .exec_output(&[guard_binary().to_str().unwrap(), "status"])
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("no arp-guard daemon answers on 127.0.0.1:9477"),
        "{out:?}"
    );
    let _guard = bed.start(&["-i", "bond0.*"]).unwrap();
    let (code, body) = get(&bed, "/readyz");
    assert_eq!(code, 503);
    assert!(
        body.contains("no interface matches --interface bond0.*"),
        "{body}"
    );
}

#[test]
fn drop_events_stream_with_a_rate_limit() {
    testbed::require_root();
    let bed = Bed::new("events").unwrap();
    let guard = bed
        .start(&["--event-rate", "50", "--event-burst", "20"])
        .unwrap();
    // `arp-guard events -o json` tails the stream.
    let mut tail = bed
        .node
        .command(&guard_binary())
        .args(["events", "-o", "json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let lines = Arc::new(Mutex::new(Vec::<String>::new()));
    let sink = lines.clone();
    let stdout = tail.stdout.take().unwrap();
    std::thread::spawn(move || {
        for l in BufReader::new(stdout).lines().map_while(Result::ok) {
            sink.lock().unwrap().push(l);
        }
    });
    let speaker = RawSocket::open(&bed.node, "eth0").unwrap();
    let frame = ArpSpec::gratuitous(2, bed.node_mac, FOREIGN).to_bytes();
    // Subscribed once a first drop's event arrives (a fixed pause is too
    // short on the VM lane's emulated CPUs); then a pause for the bucket to
    // refill, and the counts from here on.
    let mut warm_up = 0u64;
    assert!(wait_until(Duration::from_secs(20), || {
        assert!(!speaker.send(&frame).unwrap(), "foreign: dropped");
        warm_up += 1;
        std::thread::sleep(Duration::from_millis(100));
        !lines.lock().unwrap().is_empty()
    }));
    std::thread::sleep(Duration::from_millis(1000));
    let m0 = get(&bed, "/metrics").1;
    let delivered0 = series(&m0, "arp_guard_drop_events_total{outcome=\"delivered\"}").unwrap();
    let suppressed0 = series(&m0, "arp_guard_drop_events_total{outcome=\"suppressed\"}").unwrap();
    assert_eq!(delivered0 + suppressed0, warm_up as f64);
    // (Warm-up frames sent before the subscription were delivered to the
    // ring buffer but not to this tail: from here on both count alike.)
    let lines0 = lines.lock().unwrap().len();
    // The warm-up's own events were logged too (on the VM lane's emulated
    // CPUs it can take seconds): only the flood's lines are counted below.
    let logged0 = guard.count_log("announcement stopped");
    let flood = 3000u64;
    let started = std::time::Instant::now();
    for _ in 0..flood {
        assert!(!speaker.send(&frame).unwrap(), "foreign: dropped");
    }
    let elapsed = started.elapsed().as_secs_f64();
    std::thread::sleep(Duration::from_millis(800));
    let m = get(&bed, "/metrics").1;
    let delivered =
        series(&m, "arp_guard_drop_events_total{outcome=\"delivered\"}").unwrap() - delivered0;
    let suppressed =
        series(&m, "arp_guard_drop_events_total{outcome=\"suppressed\"}").unwrap() - suppressed0;
    assert_eq!(
        delivered + suppressed,
        flood as f64,
        "every drop made an event, delivered or suppressed"
    );
    // At most the burst plus the rate for the flood's duration, on each of the CPUs.
    let cpus = std::thread::available_parallelism().map_or(2, |n| n.get()) as f64;
    let bound = (20.0 + 50.0 * (elapsed + 0.1)) * cpus;
    assert!(
        delivered >= 20.0 && delivered <= bound,
        "delivered {delivered}, bound {bound:.0} ({elapsed:.3} s flood)"
    );
    assert!(suppressed >= flood as f64 - bound);
    // The tail got every delivered event, with its fields.
    // Generous: the VM lane's emulated CPUs deliver slowly.
    assert!(wait_until(Duration::from_secs(15), || {
        (lines.lock().unwrap().len() - lines0) as f64 >= delivered
    }));
    let got = lines.lock().unwrap()[lines0..].to_vec();
    assert_eq!(got.len() as f64, delivered, "one line per delivered event");
    let e: serde_json::Value = serde_json::from_str(&got[0]).unwrap();
    assert_eq!(e["lb_ip"], FOREIGN.to_string());
    assert_eq!(
        (
            e["kind"].as_str(),
            e["origin"].as_str(),
            e["verdict"].as_str(),
            e["state"].as_str()
        ),
        (
            Some("gratuitous"),
            Some("speaker"),
            Some("dropped"),
            Some("foreign")
        )
    );
    assert_eq!(
        e["requester_ip"],
        FOREIGN.to_string(),
        "a gratuitous ARP targets its own IP"
    );
    assert_eq!(e["requester_mac"], "ff:ff:ff:ff:ff:ff");
    assert_eq!(e["interface"], "eth0");
    // The daemon logged a few one by one (5 per second) and summarised the
    // rest: at most 5 lines per one-second window the flood's events were
    // read in (its duration, one more for straddling, one for the last reads).
    let windows = elapsed.ceil() as usize + 2;
    let logged = guard.count_log("announcement stopped") - logged0;
    assert!(
        logged <= 5 * windows,
        "bursts are summarised: {logged} lines for {delivered} events in {windows} windows"
    );
    guard.expect_log("burst: more events like these", Duration::from_secs(3));
    let _ = tail.kill();
    let _ = tail.wait();
}

/// Open `n` connections to the API from inside the node namespace, each
/// having sent `prefix` (an unfinished request).
fn open_connections(bed: &Bed, n: usize, prefix: &'static str) -> Vec<std::net::TcpStream> {
    bed.node
        .enter(move || {
            let mut out = Vec::new();
            for _ in 0..n {
                let Ok(mut s) = std::net::TcpStream::connect(API) else {
                    break;
                };
                use std::io::Write as _;
                let _ = s.write_all(prefix.as_bytes());
                out.push(s);
            }
            Ok(out)
        })
        .unwrap()
}

/// Closed by the server: a read sees EOF or a reset.
fn closed_by_server(s: &mut std::net::TcpStream) -> bool {
    use std::io::Read as _;
    s.set_read_timeout(Some(Duration::from_millis(10))).unwrap();
    let mut b = [0u8; 512];
    match s.read(&mut b) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => !matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ),
    }
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

/// Any local user can connect to the API. Slow clients (slowloris), a flood
/// of connections, running the daemon out of file descriptors, and wrong
/// methods must never stop it: it keeps answering once they are gone.
#[test]
fn the_api_survives_its_clients() {
    testbed::require_root();
    let bed = Bed::new("apidos").unwrap();
    let guard = bed.start(&[]).unwrap();
    let fds_before = open_fds(guard.pid());

    // 300 clients that never finish their headers.
    let mut slow = open_connections(&bed, 300, "GET /metrics HTTP/1.1\r\nHost: x\r\n");
    assert_eq!(slow.len(), 300);
    // Once the daemon has taken them in (its listener's accept queue is
    // empty: awaited, not assumed after a fixed time, which an emulated CPU
    // may not meet), it holds at most its connection limit of them (the
    // evicted ones' descriptors are closed as their tasks end)...
    assert!(
        wait_until(Duration::from_secs(30), || accept_queue(guard.pid()) == 0),
        "the daemon takes in every connection ({} waiting)",
        accept_queue(guard.pid())
    );
    let at_most = fds_before + guard::testing::MAX_CONNECTIONS + 4;
    assert!(
        wait_until(Duration::from_secs(10), || open_fds(guard.pid()) <= at_most),
        "{} fds",
        open_fds(guard.pid())
    );
    // ...and a probe still gets through meanwhile (it evicts the oldest).
    assert_eq!(
        get(&bed, "/healthz").0,
        200,
        "the kubelet's probe is not locked out"
    );
    // ...and closes every one once the header timeout passes.
    let all_closed = wait_for(
        guard::testing::HEADER_TIMEOUT + Duration::from_secs(3),
        || slow.iter_mut().all(closed_by_server).then_some(()),
    );
    assert!(all_closed.is_some(), "slow clients are dropped");
    drop(slow);
    assert_eq!(get(&bed, "/healthz").0, 200, "and the API answers");

    // Methods other than GET/HEAD.
    let (code, _) = bed
        .node
        .enter(|| {
            use std::io::{Read as _, Write as _};
            let mut s = std::net::TcpStream::connect(API)?;
            s.write_all(b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")?;
            let mut r = String::new();
            s.read_to_string(&mut r)?;
            Ok((r.lines().next().unwrap_or("").to_owned(), r))
        })
        .map(|(status, r)| (status.contains(" 405 "), r))
        .unwrap();
    assert!(code, "POST answers 405");

    // Out of file descriptors: the daemon may open only a few more (the
    // soft limit; lowering and raising it within the hard one needs no
    // privilege).
    let pid = guard.pid().to_string();
    let limit = open_fds(guard.pid()) + 6;
    let out = std::process::Command::new("prlimit")
        .args(["--pid", &pid, &format!("--nofile={limit}:")])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let hog = open_connections(&bed, 40, "GET /healthz HTTP/1.1\r\nHost: x\r\n");
    // accept fails with EMFILE
    let cannot = "the API cannot accept connections";
    let again = "the API accepts connections again";
    guard.expect_log(cannot, Duration::from_secs(30));
    // The shortage lasts while the daemon retries (its back-off starts at
    // 10 ms and doubles): this episode spans several failed attempts.
    std::thread::sleep(Duration::from_millis(300));
    drop(hog);
    let out = std::process::Command::new("prlimit")
        .args(["--pid", &pid, "--nofile=1024:"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(
        wait_until(Duration::from_secs(30), || get(&bed, "/healthz").0 == 200),
        "the API answers again once descriptors are free"
    );
    guard.expect_log(again, Duration::from_secs(30));
    // Once per episode, not per attempt: each "cannot accept" is followed
    // by one "accepts again", never by another "cannot accept", and the
    // daemon logged fewer episodes than the failed accepts it counted. How
    // many episodes there are is not the point: on a slow machine (the VM
    // lane's emulated CPUs) a hog connection may time out and another take
    // its place, starting another one.
    // (The last episode's end may still be on its way through the log pipe.)
    wait_until(Duration::from_secs(10), || {
        guard.count_log(cannot) == guard.count_log(again)
    });
    let (_, scrape) = get(&bed, "/metrics");
    let attempts = series(&scrape, "arp_guard_errors_total{cause=\"api_accept\"}").unwrap_or(0.0);
    let episodes = guard.count_log(cannot);
    assert_eq!(
        episodes,
        guard.count_log(again),
        "each episode logged once, start and end"
    );
    let log = guard.log_text();
    let marks: Vec<&str> = log
        .lines()
        .filter_map(|l| [cannot, again].into_iter().find(|m| l.contains(m)))
        .collect();
    assert_eq!(
        marks,
        [cannot, again].repeat(episodes),
        "start, end, start, end..."
    );
    assert!(
        episodes >= 1 && (episodes as f64) < attempts,
        "{episodes} episodes logged for {attempts} failed accepts"
    );
}

/// Connections waiting in the accept queue of the API's listener (port
/// 9477) in process `pid`'s network namespace: `rx_queue` of the listening
/// socket in /proc/<pid>/net/tcp.
fn accept_queue(pid: u32) -> u64 {
    let table = std::fs::read_to_string(format!("/proc/{pid}/net/tcp")).unwrap();
    let listener = table.lines().skip(1).find_map(|l| {
        // sl local_address rem_address st tx_queue:rx_queue ...
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.get(1)?.ends_with(":2505") && *f.get(3)? == "0A").then(|| f.get(4).copied())?
    });
    let queues = listener.unwrap_or_else(|| panic!("no listener on port 9477:\n{table}"));
    let rx = queues.split(':').nth(1).expect("tx_queue:rx_queue");
    u64::from_str_radix(rx, 16).expect("hex")
}

/// `--metrics-listen` on the node's address: a scraper off the node (the
/// neighbour) reads /metrics there and nothing else; the state endpoints
/// answer only on the loopback API.
#[test]
fn metrics_listener_serves_only_metrics_off_the_node() {
    testbed::require_root();
    let bed = Bed::new("scrape").unwrap();
    let metrics = format!("{}:9478", testbed::bed::NODE_IP);
    let _guard = bed.start(&["--metrics-listen", &metrics]).unwrap();
    let scrape = |path: &str| {
        let (addr, path) = (metrics.parse::<SocketAddr>().unwrap(), path.to_owned());
        bed.peer
            .enter(move || guard::testing::get(addr, &path))
            .unwrap()
    };
    let (code, body) = scrape("/metrics");
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("arp_guard_programs_attached"), "{body}");
    for path in [
        "/status",
        "/explain?ip=198.51.100.102",
        "/events",
        "/counters",
        "/readyz",
    ] {
        assert_eq!(scrape(path).0, 404, "{path} is not served off the node");
    }
    assert_eq!(get(&bed, "/status").0, 200, "the loopback API still has it");
}
