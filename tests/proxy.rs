//! The API server reached through a real proxy from Debian, as kubectl
//! reaches it: tinyproxy (HTTP CONNECT with Basic credentials) and
//! microsocks (SOCKS5 with a user and a password), the fake API server
//! answering only connections from the proxy's address (anything direct is
//! closed at once and counted). Through the proxy go the guard's watches,
//! its API check, its Events, its presence record and its ArpGuardNode,
//! whether the proxy is the kubeconfig's `proxy-url` or `HTTP_PROXY`; and
//! `kubectl arp-guard`'s reads and execs, where kubectl would take a proxy
//! and not where it would not. A proxy that dies mid-watch is a stream
//! failure like any other: blind, degraded after `--stale-after`, the
//! owner's IP never taken away, fresh again when it returns.

use std::{net::Ipv4Addr, time::Duration};

use testbed::{
    cluster_bed::{check, ClusterBed, CILIUM_PRESENCE_ARGS, PRESENCE_NS},
    fake_api::{objects, Resource},
    laptop::{serve_execs, Laptop, Ran},
    proxy::{self, Kind, Proxy},
    wait_until, ArpSpec, RawSocket,
};

const LB: &str = "198.51.100.100";
const CHANGE: Duration = Duration::from_secs(10);
/// Where the proxies listen (on the management bridge, beside the API).
const LISTEN_HTTP: &str = "203.0.113.2:3128";
const LISTEN_SOCKS: &str = "203.0.113.2:1080";
const API: &str = "203.0.113.1:6443";

fn lb() -> Ipv4Addr {
    LB.parse().unwrap()
}

/// A bed whose API answers only the proxies' address; `web` on [`LB`],
/// its Lease held by node-a for ten minutes.
fn bed(tag: &str) -> ClusterBed {
    testbed::require_root();
    let bed = ClusterBed::new(tag, &[lb()]).unwrap();
    bed.cilium_service("web", &[LB], "node-a", 600);
    bed.api.only_from(Some(proxy::out()));
    bed
}

/// The bed's kubeconfig with `proxy-url: url`, written beside it as `name`.
fn with_proxy_url(bed: &ClusterBed, name: &str, url: &str) -> std::path::PathBuf {
    let kc = std::fs::read_to_string(&bed.kubeconfig).unwrap();
    let server = "    server: http://203.0.113.1:6443\n";
    assert!(kc.contains(server), "{kc}");
    let path = bed.kubeconfig.with_file_name(name);
    std::fs::write(
        &path,
        kc.replace(server, &format!("{server}    proxy-url: {url}\n")),
    )
    .unwrap();
    path
}

/// Guard node `i` with `kubeconfig` and `env` set.
fn start(
    bed: &mut ClusterBed,
    i: usize,
    kubeconfig: &std::path::Path,
    env: &[(&str, String)],
    args: &[&str],
) -> testbed::Daemon {
    let own = std::mem::replace(&mut bed.kubeconfig, kubeconfig.to_owned());
    let mut wrapper = vec!["env".to_owned()];
    wrapper.extend(env.iter().map(|(k, v)| format!("{k}={v}")));
    let d = bed.start_on_wrapped(i, &wrapper, args, Duration::from_secs(30));
    bed.kubeconfig = own;
    d.unwrap()
}

/// Cilium and presence as the beds' tests run them, findings written each
/// second, and a split-brain speaker one after 2 s (an Event to post);
/// then `extra`.
fn args<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    let mut a = CILIUM_PRESENCE_ARGS.to_vec();
    a.extend(["--node-report-interval", "1s", "--split-brain-after", "2s"]);
    a.extend(extra);
    a
}

/// Debian's tinyproxy on the management bridge, with credentials.
fn http_proxy(bed: &ClusterBed) -> Proxy {
    Proxy::start(Kind::Http, &bed.switch, "br1", LISTEN_HTTP.parse().unwrap()).unwrap()
}

/// A SOCKS5 server (microsocks) on the management bridge, with credentials.
fn socks_proxy(bed: &ClusterBed) -> Proxy {
    Proxy::start(
        Kind::Socks5,
        &bed.switch,
        "br1",
        LISTEN_SOCKS.parse().unwrap(),
    )
    .unwrap()
}

/// Everything the guard asks and writes goes through an HTTP CONNECT
/// proxy with credentials, named by the kubeconfig (node-a) or by
/// `HTTP_PROXY` (node-b, the fake API being http://): it syncs, follows a
/// move, posts an Event, asks the API check on the datapath's hint, writes
/// its presence record and its ArpGuardNode; nothing went direct.
#[test]
fn the_guard_reads_and_writes_through_an_http_proxy() {
    let mut bed = bed("px1");
    let proxy = http_proxy(&bed);
    let proxied = with_proxy_url(&bed, "kubeconfig-http", &proxy.url());
    let plain = bed.kubeconfig.clone();
    let a = start(&mut bed, 0, &proxied, &[], &args(&[]));
    let env = [
        ("HTTP_PROXY", proxy.url()),
        ("NO_PROXY", "example.net".into()),
    ];
    let b = start(&mut bed, 1, &plain, &env, &args(&[]));
    a.expect_log(
        "reaching the Kubernetes API through a proxy",
        Duration::ZERO,
    );
    let said = b.expect_log(
        "reaching the Kubernetes API through a proxy",
        Duration::ZERO,
    );
    assert!(
        said.contains("HTTP_PROXY") && !said.contains(Kind::Http.password()),
        "named, without its password: {said}"
    );
    check(bed.wait_answer(lb(), Some("node-a"), CHANGE));
    // A split-brain speaker on node-b: stopped (the hint: node-b's API
    // check), heard by node-a's census (its Event on the Service).
    let speaker = RawSocket::open(&bed.nodes[1].ns, "eth0").unwrap();
    let garp = ArpSpec::gratuitous(2, bed.nodes[1].mac, lb()).to_bytes();
    let posted = wait_until(Duration::from_secs(30), || {
        let _ = speaker.send(&garp);
        std::thread::sleep(Duration::from_millis(300));
        !bed.api.events().is_empty()
    });
    assert!(posted, "no Event through the proxy");
    // The move, through the watches.
    bed.api.apply(
        Resource::Leases,
        objects::cilium_lease("web", "node-b", 600, "2026-11-30T10:05:00.000000Z"),
    );
    check(bed.wait_answer(lb(), Some("node-b"), CHANGE));
    for n in ["node-a", "node-b"] {
        let record = format!("arp-guard-{n}");
        assert!(
            testbed::wait_for(CHANGE, || bed.api.object(
                Resource::Leases,
                PRESENCE_NS,
                &record
            ))
            .is_some(),
            "{n}'s presence record"
        );
        assert!(
            testbed::wait_for(CHANGE, || bed.api.object(Resource::GuardNodes, "", n)).is_some(),
            "{n}'s ArpGuardNode"
        );
    }
    assert!(proxy.tunnels_to(API) >= 4, "{}", proxy.log_text());
    assert_eq!(bed.api.refused(), 0, "nothing went around the proxy");
    let checks = (bed.api.tally().iter())
        .filter(|((_, verb, res), _)| *verb == "get" && res.starts_with("services"))
        .count();
    assert!(checks > 0, "the API check on the hint, through the proxy");
    drop((a, b));
}

/// A proxy killed mid-watch: every stream fails (not a clean end), both
/// guards go blind and degrade after --stale-after; the owner keeps its IP
/// all along, node-b's speaker passes once it is degraded; the proxy back,
/// both are fresh again and node-b stops its speaker again. Wrong
/// credentials are an error that names the proxy's answer.
#[test]
fn a_proxy_that_dies_mid_watch_is_a_stream_failure_like_any_other() {
    let mut bed = bed("px2");
    let mut proxy = http_proxy(&bed);
    let proxied = with_proxy_url(&bed, "kubeconfig-http", &proxy.url());
    let args = args(&["--stale-after", "5s"]);
    let guards = [
        start(&mut bed, 0, &proxied, &[], &args),
        start(&mut bed, 1, &proxied, &[], &args),
    ];
    check(bed.wait_answer(lb(), Some("node-a"), CHANGE));
    let speaker = RawSocket::open(&bed.nodes[1].ns, "eth0").unwrap();
    let garp = ArpSpec::gratuitous(2, bed.nodes[1].mac, lb()).to_bytes();
    assert!(!speaker.send(&garp).unwrap(), "foreign on node-b");
    proxy.kill();
    for g in &guards {
        g.expect_log("ownership feed stale", Duration::from_secs(20));
    }
    assert_eq!(
        bed.who_answers(lb()).as_deref(),
        Some("node-a"),
        "the owner's IP kept"
    );
    assert!(
        speaker.send(&garp).unwrap(),
        "degraded node-b: its speaker passes"
    );
    proxy.restart().unwrap();
    for g in &guards {
        g.expect_log("fresh again", Duration::from_secs(40));
    }
    assert!(
        wait_until(CHANGE, || !speaker.send(&garp).unwrap()),
        "foreign again on node-b"
    );
    assert_eq!(bed.api.refused(), 0, "nothing went around the proxy");
    // No credentials: the proxy's refusal is the error.
    let anonymous = with_proxy_url(
        &bed,
        "kubeconfig-anonymous",
        &proxy.url_without_credentials(),
    );
    let text = bed.doctor(0, &anonymous);
    assert!(
        text.contains("proxy authorization required"),
        "the proxy's refusal named: {text}"
    );
}

/// SOCKS5 with a user and a password (one that must be percent-encoded in
/// the URL), named by the kubeconfig's proxy-url: the guard syncs and
/// follows; `kubectl arp-guard status --live` reads and execs through it.
#[test]
fn socks5_with_credentials_for_the_guard_and_the_plugin() {
    let mut bed = bed("px3");
    let socks = socks_proxy(&bed);
    let proxied = with_proxy_url(&bed, "kubeconfig-socks", &socks.url());
    let before = bed.api.connections();
    let _a = start(&mut bed, 0, &proxied, &[], &args(&[]));
    let _b = start(&mut bed, 1, &proxied, &[], &args(&[]));
    check(bed.wait_answer(lb(), Some("node-a"), CHANGE));
    serve_execs(&bed);
    let mut laptop = Laptop::new(&bed);
    laptop.kubeconfig = proxied;
    let r = laptop.run(&["status", "--live"]);
    assert!(asked(&r), "{}{}", r.out, r.err);
    // The API answers the proxies' address only: every connection it
    // served came through microsocks.
    assert!(bed.api.connections() >= before + 4);
    assert_eq!(bed.api.refused(), 0);
}

/// Asked, and answered (exit 1 is a finding: a Pod not Ready yet).
fn asked(r: &Ran) -> bool {
    matches!(r.code, 0 | 1) && r.out.contains("guards: 2 of 2 answered")
}

/// The plugin takes the proxy kubectl would take, and only that one:
/// `HTTP_PROXY` for the fake API's http:// server (reads, and the guards'
/// execs over WebSocket, through tinyproxy); a kubeconfig's `proxy-url`
/// (SOCKS5) whatever `NO_PROXY` says, as client-go (also a `NO_PROXY`
/// kube-rs alone fails on); not `HTTPS_PROXY` for an http:// server, and
/// not where `NO_PROXY` excludes the server (the API then answering
/// directly).
#[test]
fn the_plugin_takes_the_proxy_kubectl_would_take() {
    let mut bed = bed("px4");
    let http = http_proxy(&bed);
    let socks = socks_proxy(&bed);
    let proxied = with_proxy_url(&bed, "kubeconfig-http", &http.url());
    let _guards = [
        start(&mut bed, 0, &proxied, &[], &args(&[])),
        start(&mut bed, 1, &proxied, &[], &args(&[])),
    ];
    serve_execs(&bed);
    let mut laptop = Laptop::new(&bed);
    let url = http.url();
    let before = http.tunnels_to(API);
    let env = [("HTTP_PROXY", url.as_str()), ("NO_PROXY", "example.net,")];
    let r = laptop.run_env(&env, &["status", "--live"]);
    assert!(asked(&r), "{}{}", r.out, r.err);
    assert!(
        http.tunnels_to(API) >= before + 2,
        "reads and execs: {}",
        http.log_text()
    );
    // NO_PROXY as kube-rs alone cannot read it (an empty entry; `*` among
    // others), and matching everything: the proxy-url all the same.
    laptop.kubeconfig = with_proxy_url(&bed, "kubeconfig-socks", &socks.url());
    let (h, c) = (http.tunnels_to(API), bed.api.connections());
    let r = laptop.run_env(&[("NO_PROXY", "example.net,,*")], &["status", "--live"]);
    assert!(asked(&r), "{}{}", r.out, r.err);
    // Through microsocks (the API answers only the proxies; tinyproxy
    // opened no more than the guards' own watches may have).
    assert!(bed.api.connections() >= c + 2);
    assert!(http.tunnels_to(API) <= h + 2, "{}", http.log_text());
    // Directly, at the server's address: the API answers anyone now.
    bed.api.only_from(None);
    laptop.kubeconfig = bed.kubeconfig.clone();
    let (h, c) = (http.tunnels_to(API), bed.api.connections());
    for env in [
        [("HTTP_PROXY", url.as_str()), ("NO_PROXY", "203.0.113.0/24")],
        [("HTTPS_PROXY", url.as_str()), ("NO_PROXY", "")],
    ] {
        let r = laptop.run_env(&env, &["status", "--live"]);
        assert!(asked(&r), "{env:?}: {}{}", r.out, r.err);
    }
    // Direct: the plugin's many connections did not go through tinyproxy
    // (the guards' own watches may have been renewed through it meanwhile).
    assert!(bed.api.connections() >= c + 4);
    assert!(http.tunnels_to(API) <= h + 2, "{}", http.log_text());
    drop(socks);
}
