//! The guard as a pod runs it: no --kubeconfig, the API from
//! `KUBERNETES_SERVICE_HOST`/`_PORT`, the service-account token and CA from
//! /var/run/secrets/kubernetes.io/serviceaccount (a test directory mounted
//! there in a private mount namespace of the guard's own), the fake API over
//! HTTPS with a test CA and bearer tokens.
//!
//! What the guard must do when its own access breaks (a server certificate
//! it does not trust, a rejected token, missing permissions): say so once,
//! plainly, with what to fix; be not ready; and keep the safe degraded state
//! — the owner keeps answering for its IP, a non-owner degrades foreign to
//! unknown after --stale-after.

use std::{
    net::Ipv4Addr,
    time::{Duration, Instant},
};

use testbed::{
    cluster_bed::{check, ClusterBed, ServiceAccount, API, SA_DIR},
    fake_api::{
        objects,
        tls::{ServerIdentity, TestCa},
        FakeApi, Resource,
    },
    wait_for, wait_until, ArpSpec, Daemon, RawSocket,
};

const LB: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 100);
const CHANGE: Duration = Duration::from_secs(8);
const SYNC: Duration = Duration::from_secs(20);
const TOKEN: &str = "sa-token-one";
const NEW_TOKEN: &str = "sa-token-two";
/// kube 5 re-reads the token file once its copy is 50 s old (see the report
/// in `a_rotated_token_is_picked_up_without_a_restart`); this covers that,
/// the next request, and a slow machine.
const TOKEN_RELOAD: Duration = Duration::from_secs(75);

/// A two-node bed whose API speaks HTTPS (a certificate from `ca`, for its
/// IP) and accepts [`TOKEN`]; Service `web` (LB) is announced by node-a.
struct Setup {
    bed: ClusterBed,
    server: ServerIdentity,
    sa: ServiceAccount,
}

impl Setup {
    fn new(tag: &str) -> Setup {
        let ca = TestCa::new("arp-guard test CA").unwrap();
        let server = ca.server(API.ip()).unwrap();
        let bed =
            ClusterBed::with_api(tag, &[LB], |sw| FakeApi::start_tls(sw, API, &server)).unwrap();
        bed.api.set_tokens(&[TOKEN], &[]);
        // A Lease long enough never to expire during a test.
        bed.cilium_service("web", &["198.51.100.100"], "node-a", 600);
        let sa = ServiceAccount::new(bed.dir.path(), TOKEN, &ca.pem).unwrap();
        Setup { bed, server, sa }
    }

    /// Both guards, in-cluster, with `args` after the common ones.
    fn start(&self, args: &[&str]) -> Vec<Daemon> {
        let mut a = vec!["--announcer", "cilium"];
        a.extend_from_slice(args);
        (0..2)
            .map(|i| self.bed.start_incluster_on(i, &self.sa, &a, SYNC).unwrap())
            .collect()
    }

    /// `GET path` on node `i`'s local API: (status code, body).
    fn get(&self, i: usize, path: &'static str) -> (u16, String) {
        self.bed.nodes[i]
            .ns
            .enter(move || guard::testing::get("127.0.0.1:9477".parse().unwrap(), path))
            .unwrap()
    }

    /// node-b's speaker: a gratuitous ARP for LB; whether it left the node.
    fn speaker_passes(&self) -> bool {
        let node_b = &self.bed.nodes[1];
        let speaker = RawSocket::open(&node_b.ns, "eth0").unwrap();
        speaker
            .send(&ArpSpec::gratuitous(2, node_b.mac, LB).to_bytes())
            .unwrap()
    }
}

/// The neighbour learns `want` for `ip` every time it asks, for `how_long`.
fn always_answers(bed: &ClusterBed, ip: Ipv4Addr, want: &str, how_long: Duration) {
    let end = Instant::now() + how_long;
    while Instant::now() < end {
        assert_eq!(
            bed.who_answers(ip).as_deref(),
            Some(want),
            "the owner's ARP replies must keep flowing"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// In-cluster configuration over HTTPS with a bearer token: the guards sync,
/// the owner's kernel answers, the other node's reply and speaker are
/// stopped, and a Lease move is followed. The host's /run is untouched.
#[test]
fn in_cluster_config_over_https_syncs_and_enforces() {
    testbed::require_root();
    let s = Setup::new("icl");
    let guards = s.start(&[]);
    for g in &guards {
        g.expect_log("reading ownership from the Kubernetes API", SYNC);
    }
    assert!(
        s.bed.api.token_uses(TOKEN) > 0,
        "requests carried the token"
    );
    check(s.bed.wait_answer(LB, Some("node-a"), CHANGE));
    for _ in 0..3 {
        assert_eq!(s.bed.who_answers(LB).as_deref(), Some("node-a"));
    }
    assert!(
        wait_until(CHANGE, || !s.speaker_passes()),
        "foreign on node-b: its speaker is stopped"
    );
    for i in 0..2 {
        let (code, body) = s.get(i, "/readyz");
        assert_eq!(code, 200, "{body}");
    }
    // The mount stayed in the guards' own namespaces.
    assert!(
        !std::path::Path::new(SA_DIR).exists() && !std::path::Path::new("/run/secrets").exists(),
        "the host's /run must be untouched"
    );
    // The watch over HTTPS delivers: the Lease moves to node-b.
    s.bed.api.apply(
        Resource::Leases,
        objects::cilium_lease("web", "node-b", 600, "2026-11-30T10:00:05.000000Z"),
    );
    check(s.bed.wait_answer(LB, Some("node-b"), CHANGE));
    for g in &guards {
        assert_eq!(
            g.count_log("Kubernetes API feed failing"),
            0,
            "{}",
            g.log_text()
        );
    }
}

/// The kubelet rotates a projected token well before it expires, writing
/// the new one into the file while the old one still works. kube 5 re-reads
/// the token file once the copy it holds is 50 s old (kube-client 5.0.0,
/// src/client/auth/mod.rs: `TokenFile`, reloaded when within `TEN_SEC` of
/// `expires_at` = read time + `SIXTY_SEC`), not on a 401. So: the new token
/// shows up in the guards' requests within about a minute, without a
/// restart; once the old one is revoked, the guards keep working.
#[test]
fn a_rotated_token_is_picked_up_without_a_restart() {
    testbed::require_root();
    let s = Setup::new("rot");
    // Short watches: every few seconds each guard opens its watches anew,
    // so each new request shows which token it carries.
    let guards = s.start(&["--stale-after", "3s", "--kube-watch-timeout", "5s"]);
    let pids: Vec<u32> = guards.iter().map(Daemon::pid).collect();
    check(s.bed.wait_answer(LB, Some("node-a"), CHANGE));
    // Rotation: the file gets the new token; the server accepts both.
    s.bed.api.set_tokens(&[TOKEN, NEW_TOKEN], &[]);
    s.sa.write_token(NEW_TOKEN).unwrap();
    let written = Instant::now();
    assert!(
        wait_until(TOKEN_RELOAD, || s.bed.api.token_uses(NEW_TOKEN) > 0),
        "the new token was never used"
    );
    let first = written.elapsed();
    // Both guards switched: the old token is no longer presented.
    let mut last = (s.bed.api.token_uses(TOKEN), Instant::now());
    let switched = wait_until(TOKEN_RELOAD, || {
        let n = s.bed.api.token_uses(TOKEN);
        if n != last.0 {
            last = (n, Instant::now());
        }
        last.1.elapsed() >= Duration::from_secs(5)
    });
    assert!(switched, "the old token is still in use");
    eprintln!(
        "new token first used {first:?} after the file changed, by both guards after {:?}",
        written.elapsed() - Duration::from_secs(5)
    );
    // The old token is revoked. Every watch is opened again since (with
    // the new token), and a change is followed.
    s.bed.api.set_tokens(&[NEW_TOKEN], &[]);
    let uses = s.bed.api.token_uses(NEW_TOKEN);
    let conns = s.bed.api.connections();
    std::thread::sleep(Duration::from_secs(7));
    let requests = s.bed.api.token_uses(NEW_TOKEN) - uses;
    assert!(requests >= 4, "new watches");
    // Each watch the server ended is followed by the next on the same TLS
    // connection (the new token goes in the request, not the connection).
    let opened = s.bed.api.connections() - conns;
    assert!(
        opened * 2 <= requests,
        "{opened} connections for {requests} requests"
    );
    s.bed.api.apply(
        Resource::Leases,
        objects::cilium_lease("web", "node-b", 600, "2026-11-30T10:00:05.000000Z"),
    );
    check(s.bed.wait_answer(LB, Some("node-b"), CHANGE));
    std::thread::sleep(Duration::from_secs(4));
    for (g, pid) in guards.iter().zip(pids) {
        assert_eq!(g.pid(), pid);
        assert!(
            std::path::Path::new(&format!("/proc/{pid}")).exists(),
            "not restarted"
        );
        for needle in [
            "token rejected",
            "ownership feed stale",
            "Kubernetes API feed failing",
        ] {
            assert_eq!(g.count_log(needle), 0, "{needle}: {}", g.log_text());
        }
    }
    for i in 0..2 {
        assert_eq!(s.get(i, "/readyz").0, 200);
    }
}

/// The guard's own access breaks (`refuse`): each guard logs one line
/// naming the cause (`summary`) and what to fix; `/readyz` answers 503 with
/// that reason and `/status` shows it; node-a keeps answering for the IP it
/// owns, node-b degrades foreign to unknown after --stale-after (its speaker
/// passes, its kernel still does not). After `fix`, all of it is undone
/// within `recover`, without a restart.
fn refused_access(
    tag: &str,
    refuse: impl FnOnce(&Setup),
    summary: &str,
    fix: impl FnOnce(&Setup),
    recover: Duration,
) {
    testbed::require_root();
    let s = Setup::new(tag);
    let guards = s.start(&["--stale-after", "3s"]);
    check(s.bed.wait_answer(LB, Some("node-a"), CHANGE));
    assert!(
        wait_until(CHANGE, || !s.speaker_passes()),
        "foreign on node-b"
    );
    // Let the watches run a while (a bookmark each), as they have long
    // before a fault in a real cluster: a cut watch is then no failure.
    std::thread::sleep(Duration::from_secs(2));
    refuse(&s);
    for g in &guards {
        let line = g.expect_log(summary, Duration::from_secs(20));
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["level"], "ERROR", "{line}");
        assert!(
            v["fix"].as_str().is_some_and(|f| f.len() > 20),
            "the line says what to fix: {line}"
        );
    }
    for i in 0..2 {
        let mut last = (0, String::new());
        let not_ready = wait_until(Duration::from_secs(5), || {
            last = s.get(i, "/readyz");
            last.0 == 503 && last.1.contains(summary)
        });
        assert!(not_ready, "node {i} /readyz: {last:?}");
    }
    guards[1].expect_log("ownership feed stale", Duration::from_secs(15));
    assert!(
        wait_for(Duration::from_secs(3), || s.speaker_passes().then_some(())).is_some(),
        "degraded node-b: foreign judged unknown, its speaker passes"
    );
    // Never an outage of an owned IP (and node-b's kernel still stopped).
    always_answers(&s.bed, LB, "node-a", Duration::from_secs(6));
    let (_, status) = s.get(1, "/status");
    let v: serde_json::Value = serde_json::from_str(&status).unwrap();
    let feed = &v["feed"];
    assert!(
        feed["degraded"] == true
            && feed["problem"]
                .as_str()
                .is_some_and(|p| p.contains(summary)),
        "{v}"
    );
    // Retried all along, logged once.
    for g in &guards {
        assert_eq!(g.count_log(summary), 1, "{}", g.log_text());
    }
    fix(&s);
    for g in &guards {
        g.expect_log("fresh again", recover);
    }
    for i in 0..2 {
        assert!(wait_until(Duration::from_secs(5), || s.get(i, "/readyz").0 == 200));
    }
    assert!(wait_until(CHANGE, || !s.speaker_passes()), "foreign again");
    check(s.bed.wait_answer(LB, Some("node-a"), CHANGE));
}

/// The API server's certificate changes to one from a CA the guards' ca.crt
/// does not hold (say, a control plane re-issued under a new CA before the
/// pods' bundle was updated).
#[test]
fn a_server_certificate_from_another_ca_is_refused_safely() {
    let other = TestCa::new("another CA").unwrap();
    let foreign = other.server(API.ip()).unwrap();
    refused_access(
        "ca",
        |s| s.bed.api.set_identity(&foreign).unwrap(),
        "TLS certificate verification of the Kubernetes API failed",
        |s| s.bed.api.set_identity(&s.server).unwrap(),
        Duration::from_secs(20),
    );
}

/// The token is revoked (401). A new one appears in the file (as after the
/// ServiceAccount's token is re-issued): picked up within kube's reload
/// period, without a restart.
#[test]
fn a_rejected_token_is_refused_safely_until_a_new_one_comes() {
    refused_access(
        "401",
        |s| {
            s.bed.api.set_tokens(&[], &[]);
            s.bed.api.drop_watches();
        },
        "Kubernetes API token rejected (401 Unauthorized)",
        |s| {
            s.sa.write_token(NEW_TOKEN).unwrap();
            s.bed.api.set_tokens(&[NEW_TOKEN], &[]);
        },
        TOKEN_RELOAD,
    );
}

/// The token is valid but the ServiceAccount lost its permissions (403).
#[test]
fn missing_permissions_are_refused_safely() {
    refused_access(
        "403",
        |s| {
            s.bed.api.set_tokens(&[], &[TOKEN]);
            s.bed.api.drop_watches();
        },
        "Kubernetes API access forbidden (403 Forbidden)",
        |s| s.bed.api.set_tokens(&[TOKEN], &[]),
        Duration::from_secs(20),
    );
}

/// A guard started with a CA bundle that does not hold the server's CA never
/// syncs; it says why once and is not ready (nothing is owned before a sync,
/// so nothing is taken away).
#[test]
fn a_wrong_ca_bundle_at_start_is_reported_once() {
    testbed::require_root();
    let s = Setup::new("ca0");
    let other = TestCa::new("another CA").unwrap();
    s.sa.write_ca(&other.pem).unwrap();
    let summary = "TLS certificate verification of the Kubernetes API failed";
    let g = s
        .bed
        .spawn_incluster_on(1, &s.sa, &["--announcer", "cilium"])
        .unwrap();
    let line = g.expect_log(summary, Duration::from_secs(20));
    assert!(line.contains("UnknownIssuer"), "{line}");
    let (code, body) = s.get(1, "/readyz");
    assert_eq!(code, 503);
    assert!(
        body.contains("not synced") && body.contains(summary),
        "{body}"
    );
    std::thread::sleep(Duration::from_secs(5));
    assert_eq!(g.count_log(summary), 1, "{}", g.log_text());
    assert_eq!(g.count_log("initial sync"), 0);
}
