//! The guard's feed against Go's own HTTP server (`tests/go/apipeer`,
//! net/http as kube-apiserver serves a watch; [`testbed::go_peer`]): the
//! real daemon in a node namespace reads the peer in another over TLS
//! (offering `h2` and `http/1.1` by ALPN), with `--announcer cilium` and
//! watches the server ends every 2 s (`--kube-watch-timeout 2s`).
//!
//! Each test states what must hold of a client of net/http's watches:
//! the feed syncs and follows a Lease moved by a watch event; a watch the
//! server ended is resumed without a relist on the same connection; a
//! connection the server closed between two watches is replaced; lines
//! split across many tiny, slow chunks are whole events; a 1xx before the
//! 200 is skipped; and ALPN settles on `http/1.1` though `h2` is offered.
//! Where Go is missing the tests say `SKIPPED` (`cargo xtask test`
//! installs it and requires it).

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use serde_json::{json, Value};
use testbed::{
    bed::TempDir,
    cluster_bed::LEASE_RENEWED,
    fake_api::{objects, tls::TestCa},
    go_peer::{self, GoPeer, PeerRequest, Stats, Tls},
    netns::{kube_ipvs0, veth},
    wait_for, Daemon, Netns,
};

const LB: &str = "198.51.100.100";
const API: &str = "203.0.113.1:6443";
/// Within this a Lease move reaches the guard; well under the feed's idle
/// deadline (the watch timeout + 10 s), after which a stuck stream is
/// relisted and would see the move anyway.
const CHANGE: Duration = Duration::from_secs(6);
/// Every feed failure counts here (a stream's, the API check's).
const FEED_ERRORS: &str = "arp_guard_errors_total{cause=\"kubernetes_feed\"}";
/// The streams of `--announcer cilium`.
const STREAMS: [&str; 2] = ["services", "leases"];

/// A node namespace (eth0 203.0.113.11, the LB IP on kube-ipvs0) and the
/// Go peer's (203.0.113.1:6443, TLS with a per-test CA) on one veth pair;
/// the Service `web` and its Cilium Lease held by node-a are stored.
struct GoBed {
    peer: GoPeer,
    kubeconfig: PathBuf,
    _dir: TempDir,
    node: Netns,
    _api: Netns,
}

impl GoBed {
    /// None where Go is missing (the test is skipped, said once).
    fn new(tag: &str, mode: Value) -> Option<GoBed> {
        testbed::require_root();
        let bin = go_peer::binary()?;
        let node = Netns::new(&format!("{tag}-n")).unwrap();
        let api = Netns::new(&format!("{tag}-a")).unwrap();
        veth(&node, "eth0", &api, "eth0").unwrap();
        node.ip(&["addr", "add", "203.0.113.11/24", "dev", "eth0"])
            .unwrap();
        api.ip(&["addr", "add", "203.0.113.1/24", "dev", "eth0"])
            .unwrap();
        kube_ipvs0(&node, &[LB.parse().unwrap()]).unwrap();
        for ns in [&node, &api] {
            ns.sysctl("net.ipv6.conf.all.disable_ipv6", "1").unwrap();
        }
        let dir = TempDir::new(tag).unwrap();
        let api_addr: SocketAddr = API.parse().unwrap();
        let ca = TestCa::new("go-peer-ca").unwrap();
        let (cert, key) = ca.server(api_addr.ip()).unwrap().pem();
        let [cert_file, key_file, ca_file, kubeconfig] =
            ["tls.crt", "tls.key", "ca.crt", "kubeconfig"].map(|f| dir.path().join(f));
        std::fs::write(&cert_file, cert).unwrap();
        std::fs::write(&key_file, key).unwrap();
        std::fs::write(&ca_file, &ca.pem).unwrap();
        let tls = Tls {
            cert: &cert_file,
            key: &key_file,
        };
        let peer = GoPeer::start(&api, &bin, api_addr, Some(tls)).unwrap();
        peer.set_mode(mode);
        peer.apply("nodes", objects::node_with_ips("node-a", &["203.0.113.11"]));
        peer.apply("services", objects::service("default", "web", &[LB]));
        peer.apply(
            "leases",
            objects::cilium_lease("web", "node-a", 60, LEASE_RENEWED),
        );
        let config = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: go\n  cluster:\n    server: https://{API}\n    \
             certificate-authority: {}\ncontexts:\n- name: go\n  context: {{cluster: go, user: go}}\n\
             current-context: go\nusers:\n- name: go\n  user: {{token: go-peer-token}}\n",
            ca_file.display()
        );
        std::fs::write(&kubeconfig, config).unwrap();
        Some(GoBed {
            peer,
            kubeconfig,
            _dir: dir,
            node,
            _api: api,
        })
    }

    /// The guard on the node, synced with the peer.
    fn start_guard(&self) -> Daemon {
        let kc = self.kubeconfig.to_string_lossy().into_owned();
        let d = Daemon::start(
            &self.node,
            &[
                "-i",
                "eth0",
                "--node-name",
                "node-a",
                "--kubeconfig",
                &kc,
                "--lb-ips-from",
                "kube-ipvs0",
                "--announcer",
                "cilium",
                "--kube-watch-timeout",
                "2s",
                "--presence-period",
                "0",
                "--kube-events",
                "false",
                "--node-report-interval",
                "0",
            ],
        )
        .unwrap();
        d.expect_log(
            "initial sync from the Kubernetes API done",
            Duration::from_secs(10),
        );
        d
    }

    /// The guard's state for [`LB`] in its `/status`.
    fn state(&self) -> Option<String> {
        let (_, body) = (self.node)
            .enter(|| guard::testing::get("127.0.0.1:9477".parse().unwrap(), "/status"))
            .ok()?;
        let v: Value = serde_json::from_str(&body).ok()?;
        let row = v["ips"].as_array()?.iter().find(|r| r["ip"] == LB)?.clone();
        row["state"].as_str().map(str::to_owned)
    }

    /// Wait up to [`CHANGE`] for [`LB`] to be `want`; else fail with what
    /// the peer served and the guard logged.
    #[track_caller]
    fn expect_state(&self, guard: &Daemon, want: &str, why: &str) {
        let mut last = None;
        let ok = wait_for(CHANGE, || {
            last = self.state();
            (last.as_deref() == Some(want)).then_some(())
        });
        if ok.is_none() {
            panic!(
                "{why}: {LB} stayed {last:?}, not {want:?}, for {CHANGE:?}\n{}\nthe guard's log:\n{}",
                served(&self.peer.stats()),
                guard.log_text()
            );
        }
    }

    /// Move the Lease of `web` to `holder`.
    fn move_lease(&self, holder: &str, renewed: &str) {
        self.peer
            .apply("leases", objects::cilium_lease("web", holder, 60, renewed));
    }

    /// Feed failures the guard counted.
    fn feed_errors(&self) -> f64 {
        testbed::counter(&self.node, FEED_ERRORS)
    }

    /// Wait until each stream has asked `n` watches; the peer's records.
    fn watches(&self, n: usize, within: Duration) -> Stats {
        self.until(within, &format!("{n} watches per stream"), |s, res| {
            s.watches(res).len() >= n
        })
    }

    /// Wait until the server has ended `n` watches of each stream.
    fn ended(&self, n: usize, within: Duration) -> Stats {
        let what = format!("{n} watches per stream ended by the server");
        self.until(within, &what, |s, res| ended(s, res).len() >= n)
    }

    /// Wait until `done` holds for every stream; the peer's records.
    fn until(&self, within: Duration, what: &str, done: impl Fn(&Stats, &str) -> bool) -> Stats {
        let mut last = None;
        let ok = wait_for(within, || {
            let s = self.peer.stats();
            let all = STREAMS.iter().all(|r| done(&s, r));
            last = Some(s.clone());
            all.then_some(s)
        });
        ok.unwrap_or_else(|| panic!("not {what} within {within:?}\n{}", served(&last.unwrap())))
    }
}

/// The peer's records, one request a line, for a failure's message.
fn served(s: &Stats) -> String {
    let mut out = String::from(
        "what the Go peer served (conn, request, status, end, events/bookmarks/chunks):\n",
    );
    for r in &s.requests {
        out += &format!(
            "  conn {} {} {} {} {} {:?} {}/{}/{}\n",
            r.conn, r.proto, r.method, r.uri, r.status, r.end, r.events, r.bookmarks, r.chunks
        );
    }
    for c in &s.connections {
        out += &format!(
            "  conn {}: alpn {:?}, {}, {} requests, {} watches{}\n",
            c.id,
            c.alpn,
            c.proto,
            c.requests,
            c.watches,
            if c.closed_by_server {
                ", closed by the peer"
            } else {
                ""
            }
        );
    }
    out
}

/// The watches of `res` the server ended, in order.
fn ended(s: &Stats, res: &str) -> Vec<PeerRequest> {
    (s.watches(res).into_iter())
        .filter(|w| w.end == "timeout")
        .cloned()
        .collect()
}

/// The guard syncs from Go's server and follows a Lease moved by a watch
/// event; every watch the server ends (the handler returns: net/http's
/// last chunk, the connection kept) is resumed from its resourceVersion,
/// without a relist, on the same connection; a move after two such ends
/// still arrives.
#[test]
fn follows_lease_moves_and_resumes_watches_on_the_same_connection() {
    let Some(bed) = GoBed::new("gok", json!({})) else {
        return;
    };
    let guard = bed.start_guard();
    bed.expect_state(&guard, "owned", "the Lease held by node-a after the sync");
    bed.move_lease("node-b", "2026-11-30T10:00:05.000000Z");
    bed.expect_state(&guard, "foreign", "a Lease move served as a watch event");
    let s = bed.ended(2, Duration::from_secs(10));
    for res in STREAMS {
        assert_eq!(s.lists(res), 1, "{res}: relisted\n{}", served(&s));
        let w = s.watches(res);
        assert!(
            w.iter().all(|x| x.conn == w[0].conn),
            "{res}: each watch after one the server ended rides its connection\n{}",
            served(&s)
        );
    }
    bed.move_lease("node-a", "2026-11-30T10:00:10.000000Z");
    bed.expect_state(&guard, "owned", "a move after two resumed watches");
    assert_eq!(bed.feed_errors(), 0.0, "{}", guard.log_text());
}

/// The peer closes a connection once the watch on it has ended (an idle
/// keep-alive connection closed by the server, without a `Connection:
/// close`): the next watch goes to a new connection, with no relist and
/// no failure, and a Lease move still arrives.
#[test]
fn a_connection_closed_between_two_watches_is_reopened() {
    let Some(bed) = GoBed::new("goc", json!({"closeAfterWatch": true})) else {
        return;
    };
    let guard = bed.start_guard();
    bed.expect_state(&guard, "owned", "the Lease held by node-a after the sync");
    let s = bed.ended(2, Duration::from_secs(12));
    for res in STREAMS {
        assert_eq!(s.lists(res), 1, "{res}: relisted\n{}", served(&s));
        let done = ended(&s, res);
        assert!(done.len() >= 2, "{}", served(&s));
        for pair in done.windows(2) {
            assert_ne!(
                pair[0].conn,
                pair[1].conn,
                "{res}: a watch on a connection the peer closed\n{}",
                served(&s)
            );
            let closed = s
                .connection(pair[0].conn)
                .is_some_and(|c| c.closed_by_server);
            assert!(closed, "the peer closed it\n{}", served(&s));
        }
    }
    bed.move_lease("node-b", "2026-11-30T10:00:05.000000Z");
    bed.expect_state(
        &guard,
        "foreign",
        "a move after the connections were closed",
    );
    assert_eq!(
        bed.feed_errors(),
        0.0,
        "a closed keep-alive connection is replaced, not a failure:\n{}",
        guard.log_text()
    );
}

/// Watch lines written in pieces of 1 to 7 bytes, each flushed (its own
/// chunk) 1 ms after the last: every Lease move still arrives whole.
#[test]
fn split_and_slow_writes_still_give_whole_events() {
    let mode = json!({"split": 7, "splitDelayMs": 1});
    let Some(bed) = GoBed::new("gos", mode) else {
        return;
    };
    let guard = bed.start_guard();
    bed.expect_state(&guard, "owned", "the Lease held by node-a after the sync");
    for (i, (holder, want)) in [
        ("node-b", "foreign"),
        ("node-a", "owned"),
        ("node-b", "foreign"),
    ]
    .into_iter()
    .enumerate()
    {
        bed.move_lease(
            holder,
            &format!("2026-11-30T10:00:{:02}.000000Z", 5 * (i + 1)),
        );
        bed.expect_state(&guard, want, "a move written in tiny chunks");
    }
    let s = bed.peer.stats();
    let (events, chunks) =
        (s.watches("leases").iter()).fold((0, 0), |(e, c), w| (e + w.events, c + w.chunks));
    assert!(events >= 3, "{}", served(&s));
    assert!(
        chunks >= 40 * events,
        "each event (about 600 bytes) went out in many chunks\n{}",
        served(&s)
    );
    assert_eq!(bed.feed_errors(), 0.0, "{}", guard.log_text());
}

/// A 103 Early Hints before every final answer (net/http writes it with
/// `WriteHeader(103)`): an HTTP/1.1 client skips it and reads the 200 and
/// its body. The watch's events arrive, and every watch the server ends is
/// followed by the next.
#[test]
fn a_1xx_before_the_200_is_skipped() {
    let Some(bed) = GoBed::new("go1", json!({"informational": true})) else {
        return;
    };
    let guard = bed.start_guard();
    bed.expect_state(&guard, "owned", "the Lease held by node-a after the sync");
    bed.move_lease("node-b", "2026-11-30T10:00:05.000000Z");
    bed.expect_state(&guard, "foreign", "a Lease move served after a 103");
    let s = bed.watches(2, Duration::from_secs(6));
    for res in STREAMS {
        assert!(!ended(&s, res).is_empty(), "{}", served(&s));
    }
    assert_eq!(bed.feed_errors(), 0.0, "{}", guard.log_text());
}

/// The peer offers `h2` and `http/1.1` (kube-apiserver's order): the
/// guard's watch connections must settle on `http/1.1` by ALPN, not leave
/// the choice to the server's default (a client that offers nothing gets
/// HTTP/1.1 only because net/http falls back to it; one that offered `h2`
/// would be sent HTTP/2 frames). Every request is HTTP/1.1.
#[test]
fn alpn_settles_on_http1_though_h2_is_offered() {
    let Some(bed) = GoBed::new("goa", json!({})) else {
        return;
    };
    let guard = bed.start_guard();
    bed.expect_state(&guard, "owned", "the Lease held by node-a after the sync");
    let s = bed.watches(1, Duration::from_secs(5));
    for r in &s.requests {
        assert_eq!(r.proto, "HTTP/1.1", "{}", served(&s));
    }
    let watched: Vec<_> = (s.connections.iter()).filter(|c| c.watches > 0).collect();
    assert!(!watched.is_empty(), "{}", served(&s));
    for c in watched {
        assert_eq!(
            c.alpn,
            "http/1.1",
            "connection {} (a watch's) negotiated {:?} by ALPN\n{}",
            c.id,
            c.alpn,
            served(&s)
        );
    }
    drop(guard);
}
