//! Each guard's findings in its ArpGuardNode (issue 43): cluster-scoped,
//! named after the node, owned by the Node; written when they change, at
//! most once per `--node-report-interval`, never at rest, not again after a
//! restart that changed nothing; and each guard may write only its own
//! node's (the shipped ValidatingAdmissionPolicy, evaluated by the fake
//! API as kube-apiserver would, on the node-name claim of the writer's
//! token). The guards run with the DaemonSet's capabilities.

use std::{net::Ipv4Addr, time::Duration};

use serde_json::Value;
use testbed::{
    cluster_bed::ClusterBed,
    deploy::daemonset_wrapper,
    fake_api::{
        admission::{self, User},
        objects, FakeApi, Resource,
    },
    wait_until, Daemon,
};

const LB: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 100);
const GUARD_SA: &str = "system:serviceaccount:arp-guard:arp-guard";

fn report(api: &FakeApi, node: &str) -> Option<Value> {
    api.object(Resource::GuardNodes, "", node)
}

fn owned(api: &FakeApi, node: &str) -> Option<u64> {
    report(api, node)?["status"]["ownedCount"].as_u64()
}

/// Writes (create, patch) of ArpGuardNodes since the tally was reset, by
/// the guard at `from` (None: any).
fn writes_by(api: &FakeApi, from: Option<&str>) -> u64 {
    (api.tally().into_iter())
        .filter(|((ip, v, r), _)| {
            let by = from.is_none_or(|f| ip.to_string() == f);
            by && matches!(*v, "create" | "patch") && r.starts_with("arpguardnodes")
        })
        .map(|(_, c)| c.requests)
        .sum()
}

fn writes(api: &FakeApi) -> u64 {
    writes_by(api, None)
}

#[test]
fn findings_are_written_when_they_change_and_never_at_rest() {
    testbed::require_root();
    let bed = ClusterBed::new("nrep", &[LB]).unwrap();
    bed.cilium_service("web", &[&LB.to_string()], "node-a", 3600);
    let args = ["--announcer", "cilium", "--node-report-interval", "2s"];
    let mut guards = bed.start_wrapped(&daemonset_wrapper(), &args).unwrap();
    let api = &bed.api;
    let ok = wait_until(Duration::from_secs(40), || {
        owned(api, "node-a") == Some(1) && owned(api, "node-b") == Some(0)
    });
    assert!(ok, "{:#?}\n{}", report(api, "node-a"), guards[0].log_text());
    let a = report(api, "node-a").unwrap();
    let st = &a["status"];
    assert_eq!(st["mode"], "enforce");
    assert_eq!(st["health"], "enforcing");
    assert_eq!(st["uplinkNames"], "eth0");
    assert_eq!(st["owned"][0]["ip"], LB.to_string());
    assert_eq!(st["owned"][0]["service"], "default/web");
    assert!(st["updated"].is_string(), "{a:#}");
    // Owned by its Node: it goes with it.
    let node = api.object(Resource::Nodes, "", "node-a").unwrap();
    assert_eq!(a["metadata"]["ownerReferences"][0]["kind"], "Node");
    assert_eq!(
        a["metadata"]["ownerReferences"][0]["uid"],
        node["metadata"]["uid"]
    );

    // At rest: nothing written (and nothing read).
    api.reset_tally();
    std::thread::sleep(Duration::from_secs(12));
    assert_eq!(writes(api), 0, "{:#?}", api.tally());

    // A takeover: the Lease moves to node-b.
    let renew = objects::renew_now();
    api.apply(
        Resource::Leases,
        objects::cilium_lease("web", "node-b", 3600, &renew),
    );
    let moved = wait_until(Duration::from_secs(30), || {
        owned(api, "node-b") == Some(1) && owned(api, "node-a") == Some(0)
    });
    assert!(moved, "{:#?}", report(api, "node-b"));
    let b = report(api, "node-b").unwrap();
    assert!(
        b["status"]["owned"][0]["takeover"]["at"].is_string(),
        "the takeover's time: {b:#}"
    );
    assert!(b["status"]["lastTakeover"].is_string());
    let during = writes(api);
    assert!(
        (2..=6).contains(&during),
        "each node's change, coalesced: {during} writes"
    );

    // A restart with nothing changed writes nothing (node-a's guard: its
    // address on the management network is 203.0.113.11; node-b's takeover
    // may still turn silent meanwhile, a change of its own).
    guards[0]
        .stop(libc::SIGTERM, Duration::from_secs(10))
        .unwrap();
    api.reset_tally();
    let again = bed
        .start_on_wrapped(0, &daemonset_wrapper(), &args, Duration::from_secs(20))
        .unwrap();
    std::thread::sleep(Duration::from_secs(10));
    let restarted = writes_by(api, Some("203.0.113.11"));
    assert_eq!(restarted, 0, "{:#?}\n{}", api.tally(), again.log_text());
}

/// The policy as kube-apiserver evaluates it, case by case.
#[test]
fn the_admission_policy_binds_a_write_to_the_writer_s_node() {
    let p = admission::shipped().unwrap();
    let guard_on = |node: Option<&str>| User {
        username: GUARD_SA.into(),
        node: node.map(str::to_owned),
    };
    let obj = |name: &str| serde_json::json!({"metadata": {"name": name}, "status": {}});
    let (a, b) = (obj("node-a"), obj("node-b"));
    let on_a = guard_on(Some("node-a"));
    assert_eq!(p.check("CREATE", &on_a, None, Some(&a)).unwrap(), None);
    assert_eq!(p.check("UPDATE", &on_a, Some(&a), Some(&a)).unwrap(), None);
    assert_eq!(p.check("DELETE", &on_a, Some(&a), None).unwrap(), None);
    let denied = p.check("UPDATE", &on_a, Some(&b), Some(&b)).unwrap();
    let said = denied.expect("a guard of node-a writing node-b's object");
    assert!(
        said.contains("runs on node-a") && said.contains("not on node-b"),
        "{said}"
    );
    assert!(p.check("DELETE", &on_a, Some(&b), None).unwrap().is_some());
    // A token without the node-name claim (before KEP-4193): refused.
    let unbound = p.check("CREATE", &guard_on(None), None, Some(&a)).unwrap();
    assert!(unbound.unwrap().contains("no node"));
    // In another namespace, the same ServiceAccount name: still a guard.
    let elsewhere = User {
        username: "system:serviceaccount:kube-system:arp-guard".into(),
        node: Some("node-a".into()),
    };
    assert!(p
        .check("CREATE", &elsewhere, None, Some(&b))
        .unwrap()
        .is_some());
    // People and controllers: RBAC's business, not this policy's.
    let alice = User {
        username: "alice".into(),
        node: None,
    };
    assert_eq!(p.check("DELETE", &alice, Some(&b), None).unwrap(), None);
}

/// End to end: node-a's guard presents a token bound to node-b; its
/// write is refused (said once in its log), and it keeps guarding; node-b's
/// guard writes its own.
#[test]
fn a_guard_s_write_of_another_node_is_refused_and_guarding_goes_on() {
    testbed::require_root();
    let bed = ClusterBed::new("nrpol", &[LB]).unwrap();
    bed.cilium_service("web", &[&LB.to_string()], "node-a", 3600);
    let mut guards = Vec::new();
    for (i, bound_to) in [(0, "node-b"), (1, "node-b")] {
        let n = &bed.nodes[i];
        let token = format!("tok-{}", n.name);
        bed.api.set_user(
            &token,
            User {
                username: GUARD_SA.into(),
                node: Some(bound_to.into()),
            },
        );
        let kc = bed.dir.path().join(format!("kubeconfig-{}", n.name));
        std::fs::write(&kc, bed.api.kubeconfig_with_token(&token)).unwrap();
        let kc = kc.to_string_lossy().into_owned();
        #[rustfmt::skip]
        let args = [
            "-i", "eth0", "--node-name", &n.name, "--kubeconfig", &kc,
            "--lb-ips-from", "kube-ipvs0", "--announcer", "cilium",
            "--node-report-interval", "1s",
        ];
        guards.push(Daemon::start_wrapped(&n.ns, &daemonset_wrapper(), &args).unwrap());
    }
    let api = &bed.api;
    assert!(wait_until(Duration::from_secs(30), || report(
        api, "node-b"
    )
    .is_some()));
    let refused = guards[0].wait_log(
        "cannot write this node's ArpGuardNode",
        Duration::from_secs(30),
    );
    let refused = refused.unwrap_or_else(|| panic!("{}", guards[0].log_text()));
    assert!(
        refused.contains("runs on node-b, not on node-a"),
        "{refused}"
    );
    assert!(report(api, "node-a").is_none());
    // Guarding is not affected: node-a's guard is ready and owns the IP.
    let (code, body) = bed.nodes[0]
        .ns
        .enter(|| Ok(testbed::http_get("127.0.0.1:9477", "/readyz")))
        .unwrap();
    assert_eq!(code, 200, "{body}");
    assert_eq!(
        guards[0].count_log("cannot write this node's ArpGuardNode"),
        1,
        "said once"
    );
}
