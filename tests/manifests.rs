//! The shipped manifests as `kubectl kustomize` renders them (every overlay,
//! the whole directory, the example overlay and the clean-up): every object
//! parses into its k8s-openapi type with no field lost (a misspelled or
//! misplaced field is an error, not silently ignored), the DaemonSet's
//! arguments, after Kubernetes' `$(VAR)` expansion, are accepted by the real
//! CLI with the settings the overlay promises, the probes, the metrics port,
//! the capabilities and the monitoring objects agree with them, and the
//! alerting rules pass `promtool check rules`. Needs kubectl (with its
//! built-in kustomize) and promtool (`cargo xtask setup` provides it); no root.

use std::{collections::BTreeMap, path::Path, process::Command};

use clap::Parser as _;
use guard::cli::{AnnouncerArg, Cli, Command as GuardCommand, ModeArg, OnExit};
use serde_json::Value;

/// `kubectl kustomize` of `rel` in a copy of `deploy/` (with the image
/// set, or not).
fn kustomize(rel: &str, image: Option<&str>) -> std::process::Output {
    let copy = testbed::deploy::ready_copy(image);
    Command::new("kubectl")
        .arg("kustomize")
        .arg(copy.path().join(rel))
        .output()
        .expect("kubectl (with kustomize) is needed to render deploy/")
}

/// A kustomization under `deploy/`, rendered with the image set.
fn render(rel: &str) -> Vec<Value> {
    let dir = testbed::deploy::dir().join(rel);
    let out = kustomize(rel, Some(testbed::deploy::TEST_IMAGE));
    assert!(
        out.status.success(),
        "kubectl kustomize {dir:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    serde_saphyr::from_str_multiple::<Value, Vec<_>>(&text)
        .unwrap_or_else(|e| panic!("{dir:?} renders YAML that does not parse: {e}"))
}

/// The first place two JSON documents differ, as a path.
fn first_difference(a: &Value, b: &Value, path: &str) -> Option<String> {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            for k in x.keys().chain(y.keys()) {
                let p = format!("{path}.{k}");
                match (x.get(k), y.get(k)) {
                    (Some(u), Some(v)) => {
                        if let Some(d) = first_difference(u, v, &p) {
                            return Some(d);
                        }
                    }
                    (u, v) => return Some(format!("{p}: {u:?} vs {v:?}")),
                }
            }
            None
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => x
            .iter()
            .zip(y)
            .enumerate()
            .find_map(|(i, (u, v))| first_difference(u, v, &format!("{path}[{i}]"))),
        _ => (a != b).then(|| format!("{path}: {a} vs {b}")),
    }
}

fn same_after<T: serde::de::DeserializeOwned + serde::Serialize>(obj: &Value) -> Option<String> {
    let typed: T = match serde_json::from_value(obj.clone()) {
        Ok(t) => t,
        Err(e) => return Some(format!("does not parse: {e}")),
    };
    first_difference(obj, &serde_json::to_value(typed).unwrap(), "")
}

/// Every field of `obj` is one its Kubernetes type knows: parsing into the
/// k8s-openapi type and back loses nothing. The Prometheus Operator's kinds
/// have no k8s-openapi type: their fields are checked where they are used.
fn check_known_fields(obj: &Value) {
    use k8s_openapi::api::{apps::v1::DaemonSet, core::v1, rbac::v1 as rbac};
    let kind = obj["kind"].as_str().unwrap_or("?");
    let lost = match kind {
        "Namespace" => same_after::<v1::Namespace>(obj),
        "ServiceAccount" => same_after::<v1::ServiceAccount>(obj),
        "ConfigMap" => same_after::<v1::ConfigMap>(obj),
        "ClusterRole" => same_after::<rbac::ClusterRole>(obj),
        "ClusterRoleBinding" => same_after::<rbac::ClusterRoleBinding>(obj),
        "Role" => same_after::<rbac::Role>(obj),
        "RoleBinding" => same_after::<rbac::RoleBinding>(obj),
        "DaemonSet" => same_after::<DaemonSet>(obj),
        "CustomResourceDefinition" => same_after::<
            k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
        >(obj),
        "ValidatingAdmissionPolicy" => same_after::<
            k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicy,
        >(obj),
        "ValidatingAdmissionPolicyBinding" => same_after::<
            k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicyBinding,
        >(obj),
        "PodMonitor" | "PrometheusRule" => {
            assert_eq!(obj["apiVersion"], "monitoring.coreos.com/v1");
            None
        }
        other => panic!("unexpected kind {other} in deploy/: add it to this test"),
    };
    if let Some(d) = lost {
        panic!(
            "{kind}/{}: unknown or misplaced field: {d}",
            obj["metadata"]["name"]
        );
    }
}

fn of_kind<'a>(objs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    objs.iter().filter(|o| o["kind"] == kind).collect()
}

fn named<'a>(objs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objs.iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

/// A container's arguments as the kubelet hands them over: `$(VAR)` replaced
/// from its `env` and `envFrom` ConfigMaps (downward API fields with the
/// given values), every reference resolved.
fn expanded_args(objs: &[Value], c: &Value, fields: &BTreeMap<&str, &str>) -> Vec<String> {
    let mut env: BTreeMap<String, String> = BTreeMap::new();
    for from in c["envFrom"].as_array().into_iter().flatten() {
        let name = from["configMapRef"]["name"].as_str().unwrap();
        let cm = named(objs, "ConfigMap", name);
        for (k, v) in cm["data"].as_object().unwrap() {
            env.insert(k.clone(), v.as_str().unwrap().to_owned());
        }
    }
    for e in c["env"].as_array().into_iter().flatten() {
        let value = match e["value"].as_str() {
            Some(v) => v.to_owned(),
            None => {
                let path = e["valueFrom"]["fieldRef"]["fieldPath"].as_str().unwrap();
                fields
                    .get(path)
                    .unwrap_or_else(|| panic!("no test value for {path}"))
                    .to_string()
            }
        };
        env.insert(e["name"].as_str().unwrap().to_owned(), value);
    }
    c["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            let mut a = a.as_str().unwrap().to_owned();
            for (k, v) in &env {
                a = a.replace(&format!("$({k})"), v);
            }
            assert!(!a.contains("$("), "unresolved reference in {a}");
            a
        })
        .collect()
}

const FIELDS: [(&str, &str); 3] = [
    ("spec.nodeName", "worker-1"),
    ("status.podIP", "203.0.113.7"),
    ("metadata.namespace", "arp-guard"),
];

/// What an overlay promises.
struct Expect {
    mode: ModeArg,
    announcers: &'static [AnnouncerArg],
    interface: &'static str,
    monitoring: bool,
}

fn check_guard(rel: &str, expect: &Expect) {
    let objs = render(rel);
    objs.iter().for_each(check_known_fields);
    // The CRD of the findings everywhere; the policy that holds each guard
    // to its own node's in every overlay (the base leaves it to them: its
    // namespace transformer would give it a namespace).
    named(
        &objs,
        "CustomResourceDefinition",
        "arpguardnodes.arp-guard.io",
    );
    let policies = of_kind(&objs, "ValidatingAdmissionPolicy").len()
        + of_kind(&objs, "ValidatingAdmissionPolicyBinding").len();
    assert_eq!(policies, if rel == "base" { 0 } else { 2 }, "deploy/{rel}");
    let ds = named(&objs, "DaemonSet", "arp-guard");
    let ns = ds["metadata"]["namespace"].as_str().unwrap();
    let pod = &ds["spec"]["template"]["spec"];
    let c = &pod["containers"][0];
    let ctx = format!("deploy/{rel}");

    // Every namespaced object in the guard's namespace, but the doctor's
    // Role and its binding, which must be where kube-proxy's ConfigMap is.
    for o in &objs {
        let (kind, name) = (o["kind"].as_str().unwrap(), &o["metadata"]["name"]);
        let want = match kind {
            "Namespace"
            | "ClusterRole"
            | "ClusterRoleBinding"
            | "CustomResourceDefinition"
            | "ValidatingAdmissionPolicy"
            | "ValidatingAdmissionPolicyBinding" => None,
            "Role" | "RoleBinding" if name == "arp-guard-doctor" => Some("kube-system"),
            _ => Some(ns),
        };
        assert_eq!(
            o["metadata"]["namespace"].as_str(),
            want,
            "{ctx}: {kind}/{name}"
        );
    }
    let binding = named(&objs, "RoleBinding", "arp-guard-doctor");
    assert_eq!(binding["subjects"][0]["namespace"], ns, "{ctx}");

    // Arguments: the real CLI takes them, with the overlay's settings.
    let args = expanded_args(&objs, c, &FIELDS.into_iter().collect());
    let cli = Cli::try_parse_from(std::iter::once("arp-guard".to_owned()).chain(args.clone()))
        .unwrap_or_else(|e| panic!("{ctx}: {args:?}: {e}"));
    let GuardCommand::Run(run) = cli.command else {
        panic!("{ctx}: the DaemonSet must run `arp-guard run`")
    };
    let config = run.config().unwrap_or_else(|e| panic!("{ctx}: {e:#}"));
    assert_eq!(run.mode, expect.mode, "{ctx}");
    assert_eq!(run.announcers, expect.announcers, "{ctx}");
    assert_eq!(run.uplinks, [expect.interface], "{ctx}");
    assert_eq!(
        run.on_exit,
        OnExit::Keep,
        "{ctx}: rolling updates hand over"
    );
    assert!(run.pin_dir.is_some(), "{ctx}");

    // The state endpoints stay on loopback; the probes ask them there.
    let api = config.api.listen.expect("an API");
    assert!(api.ip().is_loopback(), "{ctx}: {api}");
    for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
        let get = &c[probe]["httpGet"];
        assert_eq!(get["path"], path, "{ctx}: {probe}");
        assert_eq!(get["port"], api.port(), "{ctx}: {probe}");
        assert_eq!(get["host"], api.ip().to_string(), "{ctx}: {probe}");
    }
    // /metrics on the node's address, on the port the PodMonitor scrapes.
    let metrics = config.api.metrics_listen.expect("a metrics listener");
    assert_eq!(
        metrics.ip().to_string(),
        FIELDS[1].1,
        "{ctx}: the pod's (node's) IP"
    );
    let port = c["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "metrics")
        .expect("a port named metrics");
    assert_eq!(port["containerPort"], metrics.port(), "{ctx}");

    // Every node, first in line, confined.
    assert_eq!(pod["hostNetwork"], true);
    assert_eq!(pod["priorityClassName"], "system-node-critical");
    assert!(
        pod["tolerations"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["operator"] == "Exists" && t.get("key").is_none()),
        "{ctx}: tolerates every taint"
    );
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    let sec = testbed::deploy::security();
    assert_eq!(
        sec.caps,
        ["BPF", "PERFMON", "NET_ADMIN", "NET_RAW"],
        "{ctx}"
    );
    assert!(sec.read_only_root, "{ctx}");
    assert_eq!(
        ds["spec"]["updateStrategy"]["rollingUpdate"]["maxSurge"], 0,
        "{ctx}: one daemon per pin directory"
    );
    // A 1 MiB ownership ConfigMap fits: BENCHMARKS.md measured 63 MiB for a
    // 2.7 MB file; a reload briefly holds old and new.
    let limit = c["resources"]["limits"]["memory"].as_str().unwrap();
    let mib: u64 = limit.strip_suffix("Mi").unwrap().parse().unwrap();
    assert!(mib >= 128, "{ctx}: memory limit {limit}");
    assert!(c["resources"]["requests"]["memory"].is_string(), "{ctx}");

    // The ownership file is mounted where the daemon reads it, and valid.
    let file = run.ownership_file.as_ref().unwrap();
    let mount = c["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| file.starts_with(m["mountPath"].as_str().unwrap()))
        .expect("a mount holding the ownership file");
    let volume = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == mount["name"])
        .unwrap();
    let cm = named(
        &objs,
        "ConfigMap",
        volume["configMap"]["name"].as_str().unwrap(),
    );
    let key = file.file_name().unwrap().to_str().unwrap();
    guard::testing::parse_ownership_file(file, cm["data"][key].as_str().unwrap())
        .unwrap_or_else(|e| panic!("{ctx}: the shipped ownership file: {e}"));

    // RBAC: the ServiceAccount the pods use is the one the role is bound to.
    let sa = pod["serviceAccountName"].as_str().unwrap();
    assert_eq!(
        named(&objs, "ServiceAccount", sa)["metadata"]["namespace"],
        ns
    );
    let binding = &of_kind(&objs, "ClusterRoleBinding")[0];
    assert_eq!(binding["subjects"][0]["name"], sa);
    assert_eq!(binding["subjects"][0]["namespace"], ns);
    // Events on Services: create and patch on events.k8s.io events, in
    // any namespace (a ClusterRole), nothing more.
    let role = &of_kind(&objs, "ClusterRole")[0];
    let on_events: Vec<&Value> = (role["rules"].as_array().unwrap().iter())
        .filter(|r| (r["resources"].as_array().unwrap().iter()).any(|x| x == "events"))
        .collect();
    assert_eq!(on_events.len(), 1, "{ctx}: one rule on events: {role:#}");
    assert_eq!(
        on_events[0]["apiGroups"],
        serde_json::json!(["events.k8s.io"]),
        "{ctx}"
    );
    assert_eq!(
        on_events[0]["verbs"],
        serde_json::json!(["create", "patch"]),
        "{ctx}"
    );

    check_presence_rbac(&objs, ns, sa, &ctx);
    let pod_ns = c["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "POD_NAMESPACE");
    assert_eq!(
        pod_ns.map(|e| &e["valueFrom"]["fieldRef"]["fieldPath"]),
        Some(&Value::from("metadata.namespace")),
        "{ctx}: presence finds its namespace"
    );
    // On wherever the guard reads the API.
    assert_eq!(
        config.presence.is_some_and(|p| !p.period.is_zero()),
        !expect.announcers.is_empty(),
        "{ctx}: presence"
    );

    let monitors = of_kind(&objs, "PodMonitor");
    assert_eq!(!monitors.is_empty(), expect.monitoring, "{ctx}");
    for m in monitors {
        let labels = &ds["spec"]["template"]["metadata"]["labels"];
        for (k, v) in m["spec"]["selector"]["matchLabels"].as_object().unwrap() {
            assert_eq!(
                &labels[k], v,
                "{ctx}: the PodMonitor selects the guard's pods"
            );
        }
        assert_eq!(m["spec"]["podMetricsEndpoints"][0]["port"], "metrics");
        assert_eq!(m["spec"]["podMetricsEndpoints"][0]["path"], "/metrics");
    }
    for rule in of_kind(&objs, "PrometheusRule") {
        promtool_check(&rule["spec"]);
    }
}

/// Presence's RBAC: Lease writes and Pod reads in the guard's namespace
/// only (a Role bound to its ServiceAccount), Nodes read-only
/// cluster-wide, and no write verb in any ClusterRole.
fn check_presence_rbac(objs: &[Value], ns: &str, sa: &str, ctx: &str) {
    let role = named(objs, "Role", "arp-guard-presence");
    assert_eq!(role["metadata"]["namespace"], ns, "{ctx}");
    assert_eq!(
        role["rules"],
        serde_json::json!([{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
            "verbs": ["get", "list", "watch", "create", "update", "delete"]},
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]}]),
        "{ctx}"
    );
    let binding = named(objs, "RoleBinding", "arp-guard-presence");
    assert_eq!(binding["metadata"]["namespace"], ns, "{ctx}");
    assert_eq!(binding["roleRef"]["name"], "arp-guard-presence", "{ctx}");
    assert_eq!(binding["subjects"][0]["name"], sa, "{ctx}");
    assert_eq!(binding["subjects"][0]["namespace"], ns, "{ctx}");
    let cr = named(objs, "ClusterRole", "arp-guard");
    let rules = cr["rules"].as_array().unwrap();
    assert!(
        rules
            .iter()
            .any(|r| r["resources"] == serde_json::json!(["nodes"])
                && r["apiGroups"] == serde_json::json!([""])
                && r["verbs"] == serde_json::json!(["get", "list"])),
        "{ctx}: nodes readable for coverage and each guard's own Node"
    );
    // The ClusterRole writes nothing but Events (on the Services of LB IPs)
    // and the ArpGuardNodes (each guard its own: the admission policy).
    for r in rules {
        let events = r["apiGroups"] == serde_json::json!(["events.k8s.io"])
            && r["resources"] == serde_json::json!(["events"]);
        let findings = r["apiGroups"] == serde_json::json!(["arp-guard.io"])
            && r["resources"] == serde_json::json!(["arpguardnodes"]);
        for v in r["verbs"].as_array().unwrap() {
            let ok = match v.as_str() {
                Some("get" | "list" | "watch") => true,
                Some("create" | "patch") => events || findings,
                _ => false,
            };
            assert!(
                ok,
                "{ctx}: the ClusterRole writes only Events and ArpGuardNodes: {r}"
            );
        }
    }
}

/// `promtool check rules` on a PrometheusRule's spec (a rules file).
fn promtool_check(spec: &Value) {
    // Tests run on threads of one process: a directory of each call's own.
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("arp-guard-rules-{}-{call}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("rules.json");
    std::fs::write(&file, serde_json::to_string(spec).unwrap()).unwrap();
    let out = Command::new("promtool")
        .args(["check", "rules"])
        .arg(&file)
        .output();
    let _ = std::fs::remove_dir_all(&dir);
    let out = out.expect("promtool (cargo xtask setup installs it)");
    assert!(
        out.status.success(),
        "promtool: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

const DEFAULTS: Expect = Expect {
    mode: ModeArg::Monitor,
    announcers: &[AnnouncerArg::Metallb],
    interface: "auto",
    monitoring: false,
};

#[test]
fn the_base_installs_in_monitor_mode() {
    check_guard("base", &DEFAULTS);
}

#[test]
fn the_whole_directory_adds_monitoring() {
    check_guard(
        ".",
        &Expect {
            monitoring: true,
            ..DEFAULTS
        },
    );
    let objs = render(".");
    let dash = named(&objs, "ConfigMap", "arp-guard-dashboard");
    assert_eq!(dash["metadata"]["labels"]["grafana_dashboard"], "1");
    let json = dash["data"]["grafana-dashboard.json"].as_str().unwrap();
    let dash: Value = serde_json::from_str(json).expect("the dashboard is JSON");
    check_dashboard_queries(&dash);
}

/// Every panel has its own id, and every query of the dashboard is PromQL
/// that Prometheus parses: promtool checks them as recording rules.
fn check_dashboard_queries(dash: &Value) {
    let panels = dash["panels"].as_array().unwrap();
    let mut ids: Vec<u64> = panels.iter().map(|p| p["id"].as_u64().unwrap()).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), panels.len(), "panel ids repeat");
    let rules: Vec<Value> = (panels.iter())
        .flat_map(|p| {
            let id = p["id"].as_u64().unwrap();
            (p["targets"].as_array().unwrap().iter()).map(move |t| {
                serde_json::json!({
                    "record": format!("dashboard:panel{id}:{}", t["refId"].as_str().unwrap()),
                    "expr": t["expr"],
                })
            })
        })
        .collect();
    assert!(rules.len() >= 10);
    promtool_check(&serde_json::json!({"groups": [{"name": "dashboard", "rules": rules}]}));
}

#[test]
fn every_overlay_renders_what_it_promises() {
    let expect = |name: &str| match name {
        "monitor" | "metallb" => DEFAULTS,
        "enforce" => Expect {
            mode: ModeArg::Enforce,
            ..DEFAULTS
        },
        "cilium" => Expect {
            announcers: &[AnnouncerArg::Cilium],
            ..DEFAULTS
        },
        "kube-vip" => Expect {
            announcers: &[AnnouncerArg::KubeVip],
            ..DEFAULTS
        },
        other => panic!("overlay {other} has no expectations here: add them"),
    };
    let mut seen = Vec::new();
    for entry in std::fs::read_dir(testbed::deploy::dir().join("overlays")).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        check_guard(&format!("overlays/{name}"), &expect(&name));
        seen.push(name);
    }
    seen.sort();
    assert_eq!(
        seen,
        ["cilium", "enforce", "kube-vip", "metallb", "monitor"]
    );
    check_guard(
        "examples/cilium-enforce",
        &Expect {
            mode: ModeArg::Enforce,
            announcers: &[AnnouncerArg::Cilium],
            interface: "bond0",
            monitoring: false,
        },
    );
    check_guard(
        "examples/flags",
        &Expect {
            announcers: &[AnnouncerArg::KubeVip],
            ..DEFAULTS
        },
    );
}

/// The example of the flags that are not ConfigMap keys: each reaches the
/// daemon with the value the example promises.
#[test]
fn the_flags_example_sets_what_it_says() {
    let objs = render("examples/flags");
    let ds = named(&objs, "DaemonSet", "arp-guard");
    let c = &ds["spec"]["template"]["spec"]["containers"][0];
    let args = expanded_args(&objs, c, &FIELDS.into_iter().collect());
    let cli = Cli::try_parse_from(std::iter::once("arp-guard".to_owned()).chain(args)).unwrap();
    let GuardCommand::Run(run) = cli.command else {
        panic!("the DaemonSet runs `arp-guard run`")
    };
    assert_eq!(run.kube_vip_election, guard::cli::KubeVipElection::Global);
    let p = &run.presence;
    assert_eq!(p.probing.probe_interval, std::time::Duration::from_secs(60));
    assert_eq!(p.presence_period, std::time::Duration::from_secs(30));
    assert_eq!(
        run.kube_events.kube_events_interval,
        std::time::Duration::from_secs(300)
    );
    assert!(run.refresh_stale_clients);
}

/// The clean-up DaemonSet runs `arp-guard uninstall` on the guard's pin
/// directory, waits for a terminating guard, stays until deleted, with the
/// guard's privileges but NET_RAW, and in a namespace of its own.
#[test]
fn the_cleanup_uninstalls_what_the_guard_left() {
    let objs = render("cleanup");
    objs.iter().for_each(check_known_fields);
    let ds = named(&objs, "DaemonSet", "arp-guard-uninstall");
    let c = &ds["spec"]["template"]["spec"]["containers"][0];
    let args = expanded_args(&objs, c, &FIELDS.into_iter().collect());
    let cli = Cli::try_parse_from(std::iter::once("arp-guard".to_owned()).chain(args)).unwrap();
    let GuardCommand::Uninstall(u) = cli.command else {
        panic!("the clean-up must run `arp-guard uninstall`")
    };
    let guard = render("base");
    let gds = named(&guard, "DaemonSet", "arp-guard");
    let gargs = expanded_args(
        &guard,
        &gds["spec"]["template"]["spec"]["containers"][0],
        &FIELDS.into_iter().collect(),
    );
    let GuardCommand::Run(run) =
        Cli::try_parse_from(std::iter::once("arp-guard".to_owned()).chain(gargs))
            .unwrap()
            .command
    else {
        unreachable!()
    };
    assert_eq!(Some(&u.pin_dir), run.pin_dir.as_ref());
    assert!(u.stay && !u.force && !u.wait.is_zero());
    // The guard's privileges, less NET_RAW (the guard re-sends held
    // announcements; removing it sends nothing).
    let caps = |c: &serde_json::Value| -> Vec<String> {
        c["securityContext"]["capabilities"]["add"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_owned())
            .collect()
    };
    let mut want = caps(&gds["spec"]["template"]["spec"]["containers"][0]);
    want.retain(|c| c != "NET_RAW");
    assert_eq!(caps(c), want);
    assert_eq!(
        c["securityContext"]["capabilities"]["drop"],
        serde_json::json!(["ALL"])
    );
    assert_ne!(ds["metadata"]["namespace"], gds["metadata"]["namespace"]);
    assert!(Path::new(&testbed::deploy::dir().join("cleanup/namespace.yaml")).exists());
}

/// Nothing in this project pushes an image: until the operator names one
/// (image.env), every kustomization that runs it fails, naming the file;
/// once named, every container runs it and the parameter's ConfigMap is
/// not applied.
#[test]
fn the_image_is_a_required_parameter() {
    for rel in [
        ".",
        "base",
        "overlays/cilium",
        "overlays/enforce",
        "examples/cilium-enforce",
        "examples/flags",
        "cleanup",
    ] {
        let out = kustomize(rel, None);
        assert!(!out.status.success(), "{rel} renders without an image");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("image.env"),
            "{rel}: the error names image.env: {err}"
        );
        let objs = render(rel);
        let images: Vec<&str> = (objs.iter())
            .filter(|o| o["kind"] == "DaemonSet")
            .flat_map(|d| {
                d["spec"]["template"]["spec"]["containers"]
                    .as_array()
                    .unwrap()
            })
            .map(|c| c["image"].as_str().unwrap())
            .collect();
        assert!(!images.is_empty(), "{rel}");
        assert!(
            images.iter().all(|i| *i == testbed::deploy::TEST_IMAGE),
            "{rel}: {images:?}"
        );
        assert!(
            !objs
                .iter()
                .any(|o| o["metadata"]["name"] == "arp-guard-image"),
            "{rel}: the parameter's ConfigMap is local to the build"
        );
    }
}
