//! `kubectl arp-guard`, as an operator with a laptop and a kubeconfig runs
//! it: through Debian's real `kubectl` (which finds `kubectl-arp_guard` on
//! PATH), from the management network's namespace, against the fake API
//! server, which serves the guard Pods and pods/exec over WebSocket
//! (v5/v4.channel.k8s.io) and runs each exec'd command in that node's
//! namespace with the DaemonSet's privileges. The guards are the real
//! daemon on each node.
//!
//! - a takeover with a stale client: `status` names the new owner, its
//!   takeover and the stale client on the old owner; `clients` lists the
//!   client labelled with that node; JSON and YAML say the same;
//! - a guard that hangs (SIGSTOP): listed as not answering after
//!   --node-timeout, the others answered;
//! - a 403 on pods/exec, or on a read: one error naming the verb and the
//!   resource, exit 2;
//! - a Pod that is not Ready, and a node with no guard Pod: listed;
//! - completion, through kubectl's own plugin completion.

use std::{
    path::PathBuf,
    process::Command,
    time::{Duration, Instant},
};

use serde_json::Value;
use testbed::{
    bed::TempDir,
    cluster_bed::{ClusterBed, PRESENCE_NS},
    fake_api::{objects, ExecCall, Resource},
    stale_client::{ignore_gratuitous, Traffic},
    takeover::{Style, TakeoverBed, LB},
    Daemon,
};

/// Presence on (the records name the node behind a MAC), stale after 3 s.
const GUARD_ARGS: &[&str] = &[
    "--presence-period",
    "1s",
    "--presence-namespace",
    PRESENCE_NS,
    "--stale-client-after",
    "3s",
];

/// The operator's side: the plugin on PATH under kubectl's name for it,
/// run from the management network (the switch namespace, which holds the
/// API server's address).
struct Laptop {
    bin: TempDir,
    kubeconfig: PathBuf,
    netns: String,
    kubectl: bool,
}

struct Ran {
    code: i32,
    out: String,
    err: String,
    took: Duration,
}

impl Laptop {
    fn new(bed: &ClusterBed) -> Laptop {
        let bin = TempDir::new("kubectl-plugin").unwrap();
        for name in ["kubectl-arp_guard", "kubectl_complete-arp_guard"] {
            std::os::unix::fs::symlink(testbed::guard_binary(), bin.path().join(name)).unwrap();
        }
        let kubectl = Command::new("kubectl")
            .arg("version")
            .arg("--client")
            .output()
            .is_ok_and(|o| o.status.success());
        if !kubectl {
            eprintln!("no kubectl here: the plugin is run directly");
        }
        Laptop {
            bin,
            kubeconfig: bed.kubeconfig.clone(),
            netns: bed.switch.name.clone(),
            kubectl,
        }
    }

    /// `kubectl arp-guard ARGS` (the kubeconfig given as a kubectl user
    /// would, through $KUBECONFIG).
    fn run(&self, args: &[&str]) -> Ran {
        let path = format!(
            "{}:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
            self.bin.path().display()
        );
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.netns, "env"])
            .arg(format!("PATH={path}"))
            .arg(format!("KUBECONFIG={}", self.kubeconfig.display()));
        if self.kubectl {
            c.args(["kubectl", "arp-guard"]);
        } else {
            c.arg(self.bin.path().join("kubectl-arp_guard"));
        }
        c.args(args);
        let t = Instant::now();
        let o = c.output().unwrap();
        let ran = Ran {
            code: o.status.code().unwrap_or(-1),
            out: String::from_utf8_lossy(&o.stdout).into_owned(),
            err: String::from_utf8_lossy(&o.stderr).into_owned(),
            took: t.elapsed(),
        };
        eprintln!(
            "$ kubectl arp-guard {}  (exit {}, {:?})\n{}{}",
            args.join(" "),
            ran.code,
            ran.took,
            ran.out,
            ran.err
        );
        ran
    }

    fn json(&self, args: &[&str]) -> (i32, Value) {
        let mut a = args.to_vec();
        a.extend(["-o", "json"]);
        let r = self.run(&a);
        let v = serde_json::from_str(&r.out).unwrap_or_else(|e| panic!("{e}: {}", r.out));
        (r.code, v)
    }
}

/// Each exec runs the guard's command in its node's namespace, with the
/// DaemonSet's capabilities and read-only root, as in its container.
fn serve_execs(bed: &ClusterBed) {
    let nodes: Vec<(String, String)> = bed
        .nodes
        .iter()
        .map(|n| (n.name.clone(), n.ns.name.clone()))
        .collect();
    let wrapper = testbed::deploy::daemonset_wrapper();
    let bin = testbed::guard_binary();
    bed.api.set_exec(Box::new(move |call: &ExecCall| {
        let ns = nodes
            .iter()
            .find(|(n, _)| *n == call.node)
            .map_or("none", |(_, ns)| ns.as_str());
        let mut c = Command::new("ip");
        c.args(["netns", "exec", ns]).args(&wrapper).arg(&bin);
        c.args(call.command.iter().skip(1));
        c
    }));
}

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
    let before = laptop.run(&["status"]);
    assert_eq!(before.code, 0, "a quiet cluster: nothing found");
    assert!(
        row(&before.out, &LB.to_string()).contains("node-a"),
        "{}",
        before.out
    );
    t.take_over().unwrap();
    // node-a's census calls the client stale 3 s after the move.
    let stale = testbed::wait_for(Duration::from_secs(20), || {
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
    let table = laptop.run(&["status"]);
    assert_eq!(table.code, 1, "a stale client is a finding");
    let line = row(&table.out, &LB.to_string());
    for want in ["default/web", "node-b", "1 on node-a", "ago, announced in"] {
        assert!(line.contains(want), "{want:?} in {line:?}");
    }
    assert!(
        table.out.contains("guards: 2 of 2 answered"),
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
    // `clients`: the client, labelled with the node it still reaches.
    let clients = laptop.run(&["clients", &LB.to_string()]);
    assert_eq!(clients.code, 1);
    let line = row(&clients.out, "node-a");
    assert!(
        line.contains(&LB.to_string()) && line.contains("stale"),
        "{line}"
    );
    assert!(
        !clients.out.lines().any(|l| l.starts_with("node-b ")),
        "node-b has none:\n{}",
        clients.out
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

/// Every request the plugin made (the laptop's address on the management
/// network) is allowed by deploy/components/kubectl-plugin, and every rule
/// there was used (but `get` on pods/exec, which API servers before 1.35
/// authorize the WebSocket upgrade with).
fn the_rbac_component_is_what_the_plugin_asks(bed: &ClusterBed) {
    use testbed::deploy::{covers, grants};
    let granted = grants("components/kubectl-plugin/rbac.yaml");
    let laptop: std::net::IpAddr = "203.0.113.1".parse().unwrap();
    let asked: Vec<testbed::deploy::Request> = (bed.api.scopes().into_iter())
        .filter(|(peer, ..)| *peer == laptop)
        .map(|(_, verb, res, ns)| (verb, res, ns))
        .collect();
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

/// A guard that hangs costs the deadline, not the command: it is listed
/// as not answering, the other answered.
#[test]
fn a_hung_guard_is_listed_as_not_answering() {
    testbed::require_root();
    let (bed, guards) = quiet_bed("kp2");
    let laptop = Laptop::new(&bed);
    // SAFETY: kill(2) with a pid and a signal.
    unsafe { libc::kill(guards[1].pid() as i32, libc::SIGSTOP) };
    let _resume = Stopped(guards[1].pid());
    let r = laptop.run(&["status", "--node-timeout", "3s"]);
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
    let r = laptop.run(&["status", "--node", "node-b", "--node-timeout", "3s"]);
    assert_eq!(r.code, 2, "no guard answered: not a finding");
    assert!(
        r.err
            .contains("no guard answered (node-b: not answering (no answer within 3s))"),
        "{}",
        r.err
    );
}

/// No right to exec, or to read what the plugin reads: one error that
/// names the verb and the resource, exit 2; nothing else is tried.
#[test]
fn a_403_is_one_error_naming_what_to_grant() {
    testbed::require_root();
    let (bed, _guards) = quiet_bed("kp3");
    let laptop = Laptop::new(&bed);
    bed.api.deny("pods/exec");
    let r = laptop.run(&["status"]);
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
            .contains("node-b: answered, but its Pod is not Ready")
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
        std::os::unix::fs::symlink(testbed::guard_binary(), bin.path().join(name)).unwrap();
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
