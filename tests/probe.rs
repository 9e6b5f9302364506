//! `arp-guard probe` from a client on a bridged segment where zero, one and
//! two nodes answer for an IP, with and without the guard on the nodes:
//! counts, MACs, verdicts and exit codes; TCP connects attributed per MAC
//! (pinned and flushed neighbour entries); Ctrl-C; no CAP_NET_RAW.

use std::{
    io::{BufRead as _, BufReader},
    net::Ipv4Addr,
    process::{Output, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;
use testbed::{guard_binary, segment::Segment};

/// Held by node1 alone.
const ONE: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 100);
/// Held by node1 and node2 (kube-ipvs0 on both, strictARP off).
const BOTH: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 101);
/// Held by nobody.
const NONE: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 102);
const PORT: u16 = 8080;

fn segment(tag: &str) -> Segment {
    testbed::require_root();
    Segment::new(tag, &[&[ONE, BOTH], &[BOTH]]).unwrap()
}

/// `arp-guard probe -i eth0 <args>` in the client namespace.
fn probe(seg: &Segment, args: &[&str]) -> Output {
    let bin = guard_binary();
    let mut cmd = vec![bin.to_str().unwrap(), "probe", "-i", "eth0"];
    cmd.extend(args);
    seg.client.exec_output(&cmd).unwrap()
}

/// The same with `-o json`: (exit code, document).
fn probe_json(seg: &Segment, args: &[&str]) -> (i32, Value) {
    let out = probe(seg, &[args, &["-o", "json"]].concat());
    let doc = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: stdout {:?}, stderr {:?}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code().unwrap(), doc)
}

fn ip(doc: &Value, ip: Ipv4Addr) -> &Value {
    doc["ips"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["ip"] == ip.to_string())
        .unwrap_or_else(|| panic!("{ip} not in {doc}"))
}

/// (node name, MAC report) of each MAC seen for the IP.
fn macs<'a>(seg: &'a Segment, r: &'a Value) -> Vec<(&'a str, &'a Value)> {
    r["macs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (seg.node_of(m["mac"].as_str().unwrap()).unwrap_or("?"), m))
        .collect()
}

fn n(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a number: {v}"))
}

/// Replies within one of the requests (the last may still be on its way).
fn about_one_each(r: &Value, key: &str) {
    let (req, got) = (n(&r["requests"]), n(&r[key]));
    assert!(
        req >= 8 && got + 1 >= req && got <= req,
        "{key} {got} for {req} requests: {r}"
    );
}

#[test]
fn zero_one_and_two_responders_without_the_guard() {
    let seg = segment("prb0");
    let args = ["--interval", "100ms", "--duration", "1s"];
    let (code, doc) = probe_json(
        &seg,
        &[
            &args[..],
            &["203.0.113.100", "203.0.113.101", "203.0.113.102"],
        ]
        .concat(),
    );
    assert_eq!(code, 1, "a conflict and a silent IP: {doc}");
    assert_eq!(
        (doc["ok"].as_bool(), doc["interrupted"].as_bool()),
        (Some(false), Some(false))
    );

    let one = ip(&doc, ONE);
    assert_eq!(one["verdict"], "one_responder");
    about_one_each(one, "replies");
    about_one_each(one, "answered");
    let seen = macs(&seg, one);
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].0, "node1");

    let both = ip(&doc, BOTH);
    assert_eq!(
        (both["verdict"].as_str(), n(&both["responders"])),
        (Some("conflict"), 2)
    );
    let mut who: Vec<&str> = macs(&seg, both).iter().map(|(w, _)| *w).collect();
    who.sort();
    assert_eq!(who, ["node1", "node2"]);
    for (_, m) in macs(&seg, both) {
        let mut per_mac = m.clone();
        per_mac["requests"] = both["requests"].clone();
        about_one_each(&per_mac, "replies");
    }
    assert!(
        n(&both["rounds_with_several"]) + 1 >= n(&both["requests"]),
        "{both}"
    );

    let none = ip(&doc, NONE);
    assert_eq!(
        (none["verdict"].as_str(), n(&none["replies"])),
        (Some("no_responder"), 0)
    );
    assert!(n(&none["requests"]) >= 8);

    // Each alone: the exit code follows the verdict; the table says it.
    let out = probe(&seg, &[&args[..], &["203.0.113.100"]].concat());
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("203.0.113.100  one responder"), "{text}");
    assert!(text.contains("verdict: OK, one responder per IP"), "{text}");
    let out = probe(&seg, &[&args[..], &["203.0.113.102"]].concat());
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("203.0.113.102: no responder"));
    let out = probe(&seg, &[&args[..], &["203.0.113.101"]].concat());
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("203.0.113.101  2 responders: conflict"),
        "{text}"
    );
    assert!(
        text.contains("(2 responders!)"),
        "live line for the second MAC: {text}"
    );
}

#[test]
fn with_the_guard_only_the_owner_answers() {
    let mut seg = segment("prbg");
    seg.guard(&[(ONE.into(), "node1"), (BOTH.into(), "node1")])
        .unwrap();
    let args = [
        "--interval",
        "100ms",
        "--duration",
        "1s",
        "203.0.113.100",
        "203.0.113.101",
    ];
    let (code, doc) = probe_json(&seg, &args);
    assert_eq!(code, 0, "{doc}");
    assert_eq!(doc["ok"], true);
    let both = ip(&doc, BOTH);
    assert_eq!(both["verdict"], "one_responder");
    let seen = macs(&seg, both);
    assert_eq!((seen.len(), seen[0].0), (1, "node1"), "{both}");
    about_one_each(both, "replies");
    // node2's kernel answered every request; its guard dropped each reply.
    let counters =
        testbed::daemon::counters_json(&seg.nodes[1].ns, &guard_binary(), "eth0").unwrap();
    let dropped: u64 = counters["counters"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["lb_ip"] == BOTH.to_string() && r["verdict"] == "dropped")
        .map(|r| n(&r["packets"]))
        .sum();
    assert!(
        dropped + 1 >= n(&both["requests"]),
        "node2 dropped {dropped}: {counters}"
    );

    // A guard that says node2 owns it instead: node2 answers, node1 is stopped.
    drop(seg);
    let mut seg = segment("prbh");
    seg.guard(&[(BOTH.into(), "node2")]).unwrap();
    let (code, doc) = probe_json(
        &seg,
        &["--interval", "100ms", "--count", "5", "203.0.113.101"],
    );
    assert_eq!(code, 0, "{doc}");
    assert_eq!(macs(&seg, ip(&doc, BOTH))[0].0, "node2");
}

/// node1 serves the port, node2 drops SYNs: per MAC, the connects show it.
#[test]
fn connects_are_attributed_to_each_responder() {
    let seg = segment("prbc");
    seg.listen(0, BOTH, PORT).unwrap();
    seg.drop_syns(1, BOTH, PORT).unwrap();
    let common = [
        "--interval",
        "250ms",
        "--count",
        "8",
        "--connect-timeout",
        "150ms",
        "--connect",
    ];
    let target = format!("{BOTH}:{PORT}");

    // pin: each responder in turn, so both are tested.
    let (code, doc) = probe_json(&seg, &[&common[..], &[&target, "--neigh", "pin"]].concat());
    assert_eq!(code, 1, "{doc}");
    let both = ip(&doc, BOTH);
    assert_eq!(
        (both["verdict"].as_str(), both["port"].as_u64()),
        (Some("conflict"), Some(8080))
    );
    // Pins begin once a responder is known: the first round's answers can
    // come after its connects were planned (probe6 saw it in the 6.1 lane),
    // so 7 or 8 connects, alternating, each counted to the MAC it went to.
    let mut made = 0;
    for (who, m) in macs(&seg, both) {
        let c = &m["connect"];
        match who {
            "node1" => {
                assert!(
                    (3..=4).contains(&n(&c["ok"])) && n(&c["failed"]) == 0,
                    "{m}"
                );
                made += n(&c["ok"]);
            }
            "node2" => {
                assert!(
                    n(&c["ok"]) == 0 && (3..=4).contains(&n(&c["timed_out"])),
                    "{m}"
                );
                made += n(&c["timed_out"]);
            }
            other => panic!("connect to {other}: {m}"),
        }
    }
    assert!((7..=8).contains(&made), "{made} connects: {both}");
    // The pins are gone.
    let left = seg
        .client
        .ip(&["neigh", "show", "nud", "permanent"])
        .unwrap();
    assert!(left.trim().is_empty(), "pins left behind: {left}");

    // flush: the kernel's race picks; whatever it picked, the outcome
    // follows the MAC.
    let (_, doc) = probe_json(
        &seg,
        &[&common[..], &[&target, "--neigh", "flush"]].concat(),
    );
    let both = ip(&doc, BOTH);
    let mut attempts = 0;
    for (who, m) in macs(&seg, both) {
        let c = &m["connect"];
        attempts += n(&c["ok"]) + n(&c["failed"]);
        match who {
            "node1" => assert_eq!(n(&c["failed"]), 0, "{m}"),
            "node2" => assert_eq!(n(&c["ok"]), 0, "{m}"),
            other => panic!("connect to {other}: {m}"),
        }
    }
    assert_eq!(attempts, 8, "{both}");
    assert_eq!(
        n(&both["unresolved"]["ok"]) + n(&both["unresolved"]["failed"]),
        0
    );

    // One responder that serves: all well, exit 0.
    seg.listen(0, ONE, PORT).unwrap();
    let (code, doc) = probe_json(
        &seg,
        &[
            "--interval",
            "100ms",
            "--count",
            "4",
            "--connect",
            &format!("{ONE}:{PORT}"),
            "--neigh",
            "flush",
        ],
    );
    assert_eq!(code, 0, "{doc}");
    assert_eq!(n(&ip(&doc, ONE)["macs"][0]["connect"]["ok"]), 4, "{doc}");
}

#[test]
fn ctrl_c_prints_the_summary_so_far_and_removes_pins() {
    let seg = segment("prbi");
    seg.listen(0, ONE, PORT).unwrap();
    let spawned = Instant::now();
    let mut child = seg
        .client
        .command(&guard_binary())
        .args([
            "probe",
            "-i",
            "eth0",
            "--interval",
            "100ms",
            "--duration",
            "60s",
        ])
        .args([
            "--connect",
            &format!("{ONE}:{PORT}"),
            "--neigh",
            "pin",
            "--connect-timeout",
            "50ms",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    // What starting up (sockets, pins) costs on this machine: the floor the
    // exit below (sockets closed, pins removed) is measured against.
    let start_up = spawned.elapsed();
    assert!(
        first.contains("Ctrl-C prints the summary so far"),
        "{first}"
    );
    std::thread::sleep(Duration::from_millis(800));
    let pinned = seg
        .client
        .ip(&["neigh", "show", "nud", "permanent"])
        .unwrap();
    assert!(
        pinned.contains(&ONE.to_string()),
        "pinned while it runs: {pinned}"
    );
    let sent = Instant::now();
    // How long it has been probing (since it said so).
    let ran = sent - spawned - start_up;
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    let status = child.wait().unwrap();
    // It stops at the signal, not at its --duration: within 2 s more than
    // its start-up took (a slow machine, the VM lane's, is slow at both).
    assert!(
        sent.elapsed() < start_up + Duration::from_secs(2),
        "took {:?} (start-up {start_up:?})",
        sent.elapsed()
    );
    let text = rest.join("\n");
    assert_eq!(status.code(), Some(0), "one responder that serves: {text}");
    assert!(text.contains("interrupted: the summary so far"), "{text}");
    assert!(text.contains("203.0.113.100  one responder"), "{text}");
    let rounds: u64 = text
        .split(" round(s)")
        .next()
        .and_then(|s| s.rsplit(' ').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no round count in {text}"));
    // One round per 100 ms interval of the time it ran, none after the
    // signal: counted against how long it actually ran (the sleep above is
    // longer on a slow machine), at least half of them.
    let paced = (ran.as_millis() / 100) as u64;
    assert!(
        (paced / 2..=paced + 2).contains(&rounds),
        "{rounds} rounds in {ran:?}: {text}"
    );
    let left = seg
        .client
        .ip(&["neigh", "show", "nud", "permanent"])
        .unwrap();
    assert!(left.trim().is_empty(), "pins left behind: {left}");
}

#[test]
fn without_cap_net_raw_the_error_names_it() {
    let seg = segment("prbp");
    let bin = guard_binary();
    let bin = bin.to_str().unwrap();
    for wrapper in [
        &["setpriv", "--bounding-set=-all", "--inh-caps=-all"][..],
        &[
            "setpriv",
            "--reuid",
            "65534",
            "--regid",
            "65534",
            "--clear-groups",
        ][..],
    ] {
        let cmd = [
            wrapper,
            &[bin, "probe", "-i", "eth0", "--count", "1", "203.0.113.100"],
        ]
        .concat();
        let out = seg.client.exec_output(&cmd).unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{wrapper:?}: {err}");
        assert!(
            err.contains("CAP_NET_RAW") && err.contains("run it as root"),
            "{err}"
        );
    }
    // CAP_NET_RAW alone: probing works, changing the neighbour table does not.
    let raw_only = ["setpriv", "--bounding-set=-all,+net_raw", "--inh-caps=-all"];
    let cmd = [
        &raw_only[..],
        &[bin, "probe", "-i", "eth0", "--count", "1", "203.0.113.100"],
    ]
    .concat();
    let out = seg.client.exec_output(&cmd).unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let cmd = [
        &raw_only[..],
        &[
            bin,
            "probe",
            "-i",
            "eth0",
            "--count",
            "1",
            "--connect",
            "80",
            "--neigh",
            "pin",
            "203.0.113.100",
        ],
    ]
    .concat();
    let out = seg.client.exec_output(&cmd).unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("CAP_NET_ADMIN"), "{err}");
    // Not there, not Ethernet.
    for (iface, why) in [
        ("nope", "no interface \"nope\""),
        ("lo", "not an Ethernet interface"),
    ] {
        let out = seg
            .client
            .exec_output(&[bin, "probe", "-i", iface, "--count", "1", "203.0.113.100"])
            .unwrap();
        assert_eq!(out.status.code(), Some(2));
        assert!(String::from_utf8_lossy(&out.stderr).contains(why));
    }
}
