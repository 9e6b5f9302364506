//! `kubectl arp-guard`, as an operator with a laptop and a kubeconfig runs
//! it: through Debian's real `kubectl` (which finds `kubectl-arp_guard`, the
//! plugin crate's binary, on PATH), from the management network's namespace, against the fake API
//! server, which serves the guard Pods and pods/exec over WebSocket
//! (v5/v4.channel.k8s.io) and runs each exec'd command in that node's
//! namespace with the DaemonSet's privileges. The guards are the real
//! daemon on each node.
//!
//! - a takeover with a stale client: `status` names the new owner, its
//!   takeover and the stale client on the old owner, read from the nodes'
//!   ArpGuardNodes (no exec) with how fresh each row is; `clients` lists
//!   the count labelled with that node; JSON and YAML say the same;
//!   `--live` asks the guards (pods/exec) and says the same; the
//!   read-only role alone grants the views from the API, the exec role
//!   the rest, and every rule of both is used;
//! - a guard that hangs (SIGSTOP): `--live` lists it as not answering
//!   after --node-timeout; from the API its last word is shown and its
//!   Pod not Ready;
//! - a 403 on pods/exec: the views from the API need none; `--live` is one
//!   error naming the verb, the resource and the role, exit 2; a 403 on a
//!   read the same;
//! - a Pod that is not Ready, and a node with no guard Pod: listed;
//! - (the proxy kubectl would take, and no other: `tests/proxy.rs`);
//! - completion, through kubectl's own plugin completion.

use std::{process::Command, time::Duration};

use serde_json::Value;
use testbed::{
    bed::TempDir,
    cluster_bed::{ClusterBed, PRESENCE_NS},
    fake_api::{objects, Resource},
    laptop::{serve_execs, Laptop},
    stale_client::{ignore_gratuitous, Traffic},
    takeover::{Style, TakeoverBed, LB},
    Daemon,
};

/// Presence on (the records name the node behind a MAC), stale after 3 s,
/// the findings written at most every second.
const GUARD_ARGS: &[&str] = &[
    "--presence-period",
    "1s",
    "--presence-namespace",
    PRESENCE_NS,
    "--stale-client-after",
    "3s",
    "--node-report-interval",
    "1s",
];

/// Every exec ran one of the guard's read-only commands, asking for JSON
/// or its table.
fn only_read_only_execs(bed: &ClusterBed) {
    let execs = bed.api.execs();
    assert!(!execs.is_empty());
    for e in execs {
        assert_eq!(
            e.command.first().map(String::as_str),
            Some("arp-guard"),
            "{e:?}"
        );
        let sub = e.command.get(1).map(String::as_str);
        assert!(
            matches!(
                sub,
                Some("status" | "clients" | "responders" | "explain" | "doctor")
            ),
            "{e:?}"
        );
        assert_eq!(e.namespace, PRESENCE_NS);
        assert_eq!(e.container, "arp-guard");
    }
}

fn row<'a>(out: &'a str, starts: &str) -> &'a str {
    out.lines()
        .find(|l| l.starts_with(starts))
        .unwrap_or_else(|| panic!("no line {starts:?} in\n{out}"))
}

/// A takeover with a client that stays on the old owner: one command shows
/// the new owner, its takeover, and the stale client on the node it still
/// reaches; `clients` lists that client labelled with that node.
#[test]
fn a_takeover_with_a_stale_client_in_one_command() {
    testbed::require_root();
    let mut t = TakeoverBed::new_wrapped(
        "kp1",
        Style::Cilium,
        true,
        GUARD_ARGS,
        &testbed::deploy::daemonset_wrapper(),
    )
    .unwrap();
    serve_execs(&t.bed);
    ignore_gratuitous(&t.bed.peer, LB);
    let _traffic = Traffic::start(&t.bed.peer, LB);
    let laptop = Laptop::new(&t.bed);
    // Every guard's findings in the API (once it is ready): a quiet cluster.
    let before = testbed::wait_for(Duration::from_secs(30), || {
        let r = laptop.run(&["status"]);
        (r.code == 0).then_some(r)
    })
    .expect("a quiet cluster: nothing found, every guard reported");
    assert!(
        row(&before.out, &LB.to_string()).contains("node-a"),
        "{}",
        before.out
    );
    t.bed.api.reset_tally();
    t.take_over().unwrap();
    // node-a's census calls the client stale 3 s after the move; its
    // object says so at its next write.
    let stale = testbed::wait_for(Duration::from_secs(30), || {
        let (code, v) = laptop.json(&["status"]);
        let ip = v["ips"]
            .as_array()?
            .iter()
            .find(|i| i["ip"] == LB.to_string())?
            .clone();
        (code == 1
            && ip["clients"]["node-a"]["stale"].as_u64() >= Some(1)
            && ip["owner"] == "node-b")
            .then_some(ip)
    })
    .expect("the stale client on node-a, the owner node-b");
    assert_eq!(stale["service"], "default/web");
    assert!(
        stale["takeover"]["at_unix"].as_u64().is_some(),
        "node-b's takeover: {stale:#}"
    );
    assert_eq!(stale["owner_guard"]["answered"], true);
    assert!(stale["as_of"].as_u64().is_some(), "how fresh: {stale:#}");
    let table = laptop.run(&["status"]);
    assert_eq!(table.code, 1, "a stale client is a finding");
    let line = row(&table.out, &LB.to_string());
    for want in [
        "default/web",
        "node-b",
        "1 on node-a",
        "ago, announced in",
        "s ago",
    ] {
        assert!(line.contains(want), "{want:?} in {line:?}");
    }
    assert!(
        table.out.contains("guards: 2 of 2 reported"),
        "{}",
        table.out
    );
    // Wide: each guard's uplinks, with why they were chosen.
    let wide = laptop.run(&["status", "-o", "wide"]);
    assert!(
        wide.out.contains("node-a: guards eth0 (--interface eth0)"),
        "{}",
        wide.out
    );
    // The same through YAML.
    let yaml = laptop.run(&["status", "-o", "yaml"]);
    let y: Value = serde_saphyr::from_str(&yaml.out).unwrap();
    assert_eq!(y["ips"][0]["owner"], "node-b");
    // `clients`: the count, labelled with the node it still reaches.
    let clients = laptop.run(&["clients", &LB.to_string()]);
    assert_eq!(clients.code, 1);
    let line = row(&clients.out, "node-a");
    assert!(line.contains(&LB.to_string()), "{line}");
    assert!(
        !clients.out.lines().any(|l| l.starts_with("node-b ")),
        "node-b has none:\n{}",
        clients.out
    );
    let responders = laptop.run(&["responders"]);
    assert!(
        responders.code == 0 || responders.code == 1,
        "{}",
        responders.err
    );
    assert!(
        t.bed.api.execs().is_empty(),
        "the views from the API exec nothing"
    );
    // Nothing but reads, and only what the read-only role grants.
    viewer_grants_what_the_views_read(&t.bed);
    // Live: each guard asked now (pods/exec), the same story, and each
    // client's MAC.
    let (code, live) = laptop.json(&["status", "--live"]);
    assert_eq!(code, 1);
    assert_eq!(live["source"], "live");
    let ip = (live["ips"].as_array().unwrap().iter())
        .find(|i| i["ip"] == LB.to_string())
        .unwrap();
    assert_eq!(ip["owner"], "node-b");
    assert!(
        ip["clients"]["node-a"]["stale"].as_u64() >= Some(1),
        "{ip:#}"
    );
    assert!(
        laptop
            .run(&["status", "--live"])
            .out
            .contains("guards: 2 of 2 answered"),
        "live: answered"
    );
    let clients = laptop.run(&["clients", "--live", &LB.to_string()]);
    assert_eq!(clients.code, 1);
    let line = row(&clients.out, "node-a");
    assert!(
        line.contains(&LB.to_string()) && line.contains("stale"),
        "{line}"
    );
    // One node only.
    let (_, v) = laptop.json(&["status", "--node", "node-b"]);
    assert_eq!(v["guards"].as_array().map(Vec::len), Some(1));
    assert_eq!(v["guards"][0]["node"], "node-b");
    // explain: every node's own answer, labelled.
    let explain = laptop.run(&["explain", &LB.to_string()]);
    for n in ["node-a", "node-b"] {
        assert!(
            explain.out.lines().any(|l| l.starts_with(n)),
            "{n}:\n{}",
            explain.out
        );
    }
    let events = laptop.run(&["events"]);
    assert!(events.code == 0 || events.code == 1, "{}", events.err);
    // A server that cannot select arp-guard's Events: the cluster's are
    // read in bounded pages and filtered here, to the same rows.
    let now = objects::renew_now();
    for (name, controller) in [("ours", "arp-guard"), ("theirs", "metallb")] {
        t.bed.api.put_event(serde_json::json!({
            "metadata": {"namespace": "default", "name": name},
            "eventTime": now, "type": "Warning", "reason": name,
            "reportingController": controller, "reportingInstance": "node-a",
            "regarding": {"kind": "Service", "namespace": "default", "name": "web"},
        }));
    }
    let (_, want) = laptop.json(&["events"]);
    let want = want.as_array().cloned().unwrap_or_default();
    assert!(want.iter().any(|e| e["reason"] == "ours"), "{want:?}");
    assert!(!want.iter().any(|e| e["reason"] == "theirs"), "{want:?}");
    t.bed.api.set_event_field_selectors_old(true);
    let lists = t.bed.api.event_lists();
    let (_, got) = laptop.json(&["events"]);
    let reasons = |v: &[Value]| v.iter().map(|e| e["reason"].clone()).collect::<Vec<_>>();
    assert_eq!(reasons(got.as_array().unwrap()), reasons(&want));
    assert_eq!(t.bed.api.event_lists(), lists + 2, "refused, then one page");
    t.bed.api.set_event_field_selectors_old(false);
    only_read_only_execs(&t.bed);
    the_rbac_component_is_what_the_plugin_asks(&t.bed);
}

/// What the laptop (its address on the management network) asked.
fn laptop_asked(bed: &ClusterBed) -> Vec<testbed::deploy::Request> {
    let laptop: std::net::IpAddr = "203.0.113.1".parse().unwrap();
    (bed.api.scopes().into_iter())
        .filter(|(peer, ..)| *peer == laptop)
        .map(|(_, verb, res, ns)| (verb, res, ns))
        .collect()
}

/// The views from the API (`status`, `clients`, `responders` since the
/// tally was reset) read only what the read-only role grants: no exec,
/// no write.
fn viewer_grants_what_the_views_read(bed: &ClusterBed) {
    use testbed::deploy::{covers, grants_of};
    let viewer = grants_of(
        "components/kubectl-plugin/rbac.yaml",
        Some("arp-guard-viewer"),
    );
    for a in laptop_asked(bed) {
        assert!(matches!(a.0, "get" | "list" | "watch"), "not a read: {a:?}");
        assert!(
            viewer.iter().any(|g| covers(g, &a)),
            "the views asked {a:?}, which arp-guard-viewer does not grant"
        );
    }
}

/// Every request the plugin made is allowed by
/// deploy/components/kubectl-plugin, and every rule of both roles there
/// was used (but `get` on pods/exec, which API servers before 1.35
/// authorize the WebSocket upgrade with).
fn the_rbac_component_is_what_the_plugin_asks(bed: &ClusterBed) {
    use testbed::deploy::{covers, grants};
    let granted = grants("components/kubectl-plugin/rbac.yaml");
    let asked = laptop_asked(bed);
    for a in &asked {
        assert!(
            granted.iter().any(|g| covers(g, a)),
            "the plugin asked {a:?}, which the component does not grant (in that namespace)"
        );
    }
    for g in &granted {
        if (g.0.as_str(), g.1.as_str()) != ("get", "pods/exec") {
            assert!(
                asked.iter().any(|a| covers(g, a)),
                "the component grants {g:?}, which the plugin never asked where it applies"
            );
        }
    }
}

/// A two-node bed with `web` owned by node-a, the guards running, the
/// execs served.
fn quiet_bed(tag: &str) -> (ClusterBed, Vec<Daemon>) {
    let bed = ClusterBed::new(tag, &[LB]).unwrap();
    bed.api.apply(
        Resource::Services,
        objects::service("default", "web", &[&LB.to_string()]),
    );
    bed.cilium_service("web", &[&LB.to_string()], "node-a", 600);
    let mut args = vec!["--announcer", "cilium"];
    args.extend_from_slice(GUARD_ARGS);
    let guards = bed.start(&args).unwrap();
    serve_execs(&bed);
    (bed, guards)
}

/// Resumes a stopped daemon whatever happens.
struct Stopped(u32);

impl Drop for Stopped {
    fn drop(&mut self) {
        // SAFETY: kill(2) with a pid and a signal.
        unsafe { libc::kill(self.0 as i32, libc::SIGCONT) };
    }
}

/// A guard that hangs costs the deadline, not the command: asked live it
/// is listed as not answering, the other answered; from the API its last
/// word stays, said to come from a guard whose Pod is not Ready.
#[test]
fn a_hung_guard_is_listed_as_not_answering() {
    testbed::require_root();
    let (bed, guards) = quiet_bed("kp2");
    let laptop = Laptop::new(&bed);
    let reported = testbed::wait_until(Duration::from_secs(30), || {
        laptop
            .run(&["status"])
            .out
            .contains("guards: 2 of 2 reported")
    });
    assert!(reported);
    // SAFETY: kill(2) with a pid and a signal.
    unsafe { libc::kill(guards[0].pid() as i32, libc::SIGSTOP) };
    let _resume = Stopped(guards[0].pid());
    // The kubelet finds node-a's guard not Ready (its /readyz silent).
    let stale = testbed::wait_for(Duration::from_secs(20), || {
        let r = laptop.run(&["status"]);
        r.out
            .contains("node-a: reported, but its Pod is not Ready")
            .then_some(r)
    })
    .expect("node-a's Pod not Ready");
    assert_eq!(stale.code, 1);
    let line = row(&stale.out, &LB.to_string());
    assert!(line.contains("(node-a not Ready)"), "{line}");
    drop(_resume);
    // SAFETY: kill(2) with a pid and a signal.
    unsafe { libc::kill(guards[1].pid() as i32, libc::SIGSTOP) };
    let _resume = Stopped(guards[1].pid());
    let r = laptop.run(&["status", "--live", "--node-timeout", "3s"]);
    assert_eq!(r.code, 1, "a guard without an answer is a finding");
    assert!(r.took < Duration::from_secs(12), "{:?}", r.took);
    assert!(
        r.out
            .contains("node-b: not answering (no answer within 3s)"),
        "{}",
        r.out
    );
    assert!(r.out.contains("guards: 1 of 2 answered"), "{}", r.out);
    assert!(row(&r.out, &LB.to_string()).contains("node-a"), "{}", r.out);
    // Asked alone, it is a command that could not ask: exit 2, saying why.
    let r = laptop.run(&[
        "status",
        "--live",
        "--node",
        "node-b",
        "--node-timeout",
        "3s",
    ]);
    assert_eq!(r.code, 2, "no guard answered: not a finding");
    assert!(
        r.err
            .contains("no guard answered (node-b: not answering (no answer within 3s))"),
        "{}",
        r.err
    );
}

/// No right to exec: the views from the API need none; `--live` is one
/// error that names the verb, the resource and the role, exit 2, nothing
/// else tried. No right to read what the plugin reads: the same.
#[test]
fn a_403_is_one_error_naming_what_to_grant() {
    testbed::require_root();
    let (bed, _guards) = quiet_bed("kp3");
    let laptop = Laptop::new(&bed);
    bed.api.deny("pods/exec");
    let read = testbed::wait_for(Duration::from_secs(30), || {
        let r = laptop.run(&["status"]);
        (r.code == 0).then_some(r)
    });
    assert!(read.is_some(), "read-only: no exec needed");
    let r = laptop.run(&["status", "--live"]);
    assert_eq!(r.code, 2, "could not ask");
    assert!(
        r.err
            .contains("`create` on pods/exec (namespace arp-guard)"),
        "{}",
        r.err
    );
    assert!(
        r.err.contains("cannot create resource \"pods/exec\""),
        "the API's own words: {}",
        r.err
    );
    assert!(r.err.contains("arp-guard-operator"), "{}", r.err);
    assert_eq!(
        r.err.lines().filter(|l| l.contains("forbidden")).count(),
        1,
        "one error:\n{}",
        r.err
    );
    assert!(bed.api.execs().is_empty());
    bed.api.deny("services");
    let r = laptop.run(&["status"]);
    assert_eq!(r.code, 2);
    assert!(r.err.contains("`list` on services (cluster)"), "{}", r.err);
    assert!(r.err.contains("arp-guard-viewer"), "{}", r.err);
}

/// A guard whose Pod is not Ready is listed as such (it still answers),
/// and so is a node with no guard Pod at all.
#[test]
fn not_ready_and_missing_guards_are_listed() {
    testbed::require_root();
    let (bed, _guards) = quiet_bed("kp4");
    bed.kubelet.pin("node-b", false);
    bed.api.apply(Resource::Nodes, objects::node("node-z"));
    let laptop = Laptop::new(&bed);
    let r = testbed::wait_for(Duration::from_secs(10), || {
        let r = laptop.run(&["status"]);
        r.out
            .contains("node-b: reported, but its Pod is not Ready")
            .then_some(r)
    })
    .expect("node-b listed as not Ready");
    assert_eq!(r.code, 1);
    assert!(
        r.out.contains("node-z: no guard Pod on this node"),
        "{}",
        r.out
    );
    let (_, v) = laptop.json(&["status"]);
    let z = v["guards"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["node"] == "node-z")
        .unwrap()
        .clone();
    assert_eq!(z["unanswered"]["state"], "no_guard_pod");
    // Listed, not a finding: the DaemonSet may not be meant to run there.
    let r = laptop.run(&["clients"]);
    assert_eq!(r.code, 0, "{}{}", r.out, r.err);
    // Nodes that cannot be read: said, with why, whatever the view.
    bed.api.deny("nodes");
    let r = laptop.run(&["clients"]);
    assert_eq!(r.code, 0, "{}{}", r.out, r.err);
    assert!(
        r.err.contains("the cluster's Nodes could not be read ("),
        "{}",
        r.err
    );
}

/// kubectl completes the plugin's subcommands and flags through
/// `kubectl_complete-arp_guard`.
#[test]
fn completion_through_kubectl() {
    testbed::require_root();
    let bin = TempDir::new("kubectl-complete").unwrap();
    for name in ["kubectl-arp_guard", "kubectl_complete-arp_guard"] {
        std::os::unix::fs::symlink(testbed::plugin_binary(), bin.path().join(name)).unwrap();
    }
    let path = format!("{}:/usr/bin:/bin", bin.path().display());
    let direct = Command::new(bin.path().join("kubectl_complete-arp_guard"))
        .args(["sta"])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&direct.stdout), "status\n:4\n");
    let Ok(o) = Command::new("kubectl")
        .env("PATH", &path)
        .args(["__complete", "arp-guard", "cli"])
        .output()
    else {
        eprintln!("no kubectl here");
        return;
    };
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.lines().any(|l| l == "clients"), "{out}");
}
