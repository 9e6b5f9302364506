//! What the shipped manifests (`deploy/`) say the daemon runs with, read from
//! the files themselves so that tests and manifests cannot drift apart.

use std::path::PathBuf;

/// The repository's `deploy/` directory.
pub fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

/// The image the tests' copies of `deploy/` name.
pub const TEST_IMAGE: &str = "registry.example.com/arp-guard:0.1.0";

/// A copy of `deploy/` as an operator makes it ready: `image.env` (the
/// required image) written beside the base's and the clean-up's
/// kustomization, or not (`image` None: as cloned).
pub fn ready_copy(image: Option<&str>) -> crate::bed::TempDir {
    fn copy(from: &std::path::Path, to: &std::path::Path) {
        std::fs::create_dir_all(to).unwrap();
        for e in std::fs::read_dir(from).unwrap() {
            let e = e.unwrap();
            let dest = to.join(e.file_name());
            if e.file_type().unwrap().is_dir() {
                copy(&e.path(), &dest);
            } else if e.file_name() != "image.env" {
                std::fs::copy(e.path(), dest).unwrap();
            }
        }
    }
    let tmp = crate::bed::TempDir::new("deploy").unwrap();
    copy(&dir(), tmp.path());
    if let Some(image) = image {
        for kustomization in ["base", "cleanup"] {
            std::fs::write(
                tmp.path().join(kustomization).join("image.env"),
                format!("IMAGE={image}\n"),
            )
            .unwrap();
        }
    }
    tmp
}

/// Every YAML document of `deploy/<rel>`.
pub fn documents(rel: &str) -> Vec<serde_json::Value> {
    let path = dir().join(rel);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    serde_saphyr::from_str_multiple::<serde_json::Value, Vec<_>>(&text)
        .unwrap_or_else(|e| panic!("{path:?}: {e}"))
}

/// (verb, resource, namespace) a rule grants: a ClusterRole's in every
/// namespace (None), a Role's in its own.
pub type Grant = (String, String, Option<String>);

/// What every rule of the Roles and ClusterRoles in `rel` (under
/// `deploy/`) grants.
pub fn grants(rel: &str) -> std::collections::BTreeSet<Grant> {
    grants_of(rel, None)
}

/// [`grants`] of the roles named `role` only (None: every role).
pub fn grants_of(rel: &str, role: Option<&str>) -> std::collections::BTreeSet<Grant> {
    let mut out = std::collections::BTreeSet::new();
    for d in documents(rel) {
        if role.is_some_and(|r| d["metadata"]["name"] != r) {
            continue;
        }
        let ns = match d["kind"].as_str() {
            Some("ClusterRole") => None,
            Some("Role") => Some(d["metadata"]["namespace"].as_str().unwrap().to_owned()),
            _ => continue,
        };
        for r in d["rules"].as_array().unwrap() {
            for res in r["resources"].as_array().unwrap() {
                for v in r["verbs"].as_array().unwrap() {
                    out.insert((
                        v.as_str().unwrap().to_owned(),
                        res.as_str().unwrap().to_owned(),
                        ns.clone(),
                    ));
                }
            }
        }
    }
    out
}

/// A request as RBAC authorizes it: (verb, resource, namespace; None
/// for a cluster-wide or cluster-scoped one).
pub type Request = (&'static str, String, Option<String>);

/// Whether `grant` covers `request`.
pub fn covers(grant: &Grant, (verb, res, ns): &Request) -> bool {
    grant.0 == *verb && grant.1 == *res && (grant.2.is_none() || grant.2 == *ns)
}

/// The guard's DaemonSet, as `deploy/base/daemonset.yaml` declares it.
pub fn daemonset() -> serde_json::Value {
    documents("base/daemonset.yaml")
        .into_iter()
        .find(|v| v["kind"] == "DaemonSet")
        .expect("a DaemonSet in deploy/base/daemonset.yaml")
}

/// The guard container's security context, as the DaemonSet declares it.
#[derive(Debug, Clone)]
pub struct Security {
    /// Capabilities added after dropping ALL, as Kubernetes spells them ("BPF").
    pub caps: Vec<String>,
    pub read_only_root: bool,
    /// `runAsUser` (None: the image's user).
    pub run_as_user: Option<u32>,
    /// `allowPrivilegeEscalation` (None: Kubernetes' default, true).
    pub allow_privilege_escalation: Option<bool>,
}

pub fn security() -> Security {
    let ds = daemonset();
    let sc = &ds["spec"]["template"]["spec"]["containers"][0]["securityContext"];
    let names = |v: &serde_json::Value| -> Vec<String> {
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|c| c.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default()
    };
    assert_eq!(
        names(&sc["capabilities"]["drop"]),
        ["ALL"],
        "the DaemonSet drops every capability first"
    );
    Security {
        caps: names(&sc["capabilities"]["add"]),
        read_only_root: sc["readOnlyRootFilesystem"].as_bool() == Some(true),
        run_as_user: sc["runAsUser"].as_u64().map(|u| u as u32),
        allow_privilege_escalation: sc["allowPrivilegeEscalation"].as_bool(),
    }
}

/// A command prefix that runs its arguments like the container runtime
/// would: root, bounding (and so permitted and effective) set reduced to
/// `caps`, and, if asked, `/` remounted read-only in a private mount namespace.
pub fn wrapper(caps: &[String], read_only: bool) -> Vec<String> {
    let bounding = std::iter::once("-all".to_owned())
        .chain(caps.iter().map(|c| format!("+{}", c.to_ascii_lowercase())))
        .collect::<Vec<_>>()
        .join(",");
    let mut w: Vec<String> = Vec::new();
    if read_only {
        w.extend(
            [
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "--",
                "sh",
                "-c",
                "mount -o remount,bind,ro / && exec \"$@\"",
                "sh",
            ]
            .map(str::to_owned),
        );
    }
    w.extend([
        "setpriv".to_owned(),
        format!("--bounding-set={bounding}"),
        "--inh-caps=-all".to_owned(),
        "--".to_owned(),
    ]);
    w
}

/// [`wrapper`] with the DaemonSet's own capabilities and read-only root, as
/// a container runtime runs it (before 5.11, with the unlimited
/// RLIMIT_MEMLOCK its `LimitMEMLOCK=infinity` gives: tests/privileges.rs
/// shows the refusal without it).
pub fn daemonset_wrapper() -> Vec<String> {
    let s = security();
    let mut w = Vec::new();
    if !crate::kernel::bpf_memcg_accounting() {
        w.extend(["prlimit", "--memlock=unlimited", "--"].map(str::to_owned));
    }
    w.extend(wrapper(&s.caps, s.read_only_root));
    w
}

/// The bits of `CapEff` for capability names like "BPF" (or "CAP_BPF").
pub fn cap_bits(caps: &[String]) -> u64 {
    caps.iter()
        .map(|c| match c.trim_start_matches("CAP_") {
            "NET_ADMIN" => 1u64 << 12,
            "NET_RAW" => 1 << 13,
            "SYS_ADMIN" => 1 << 21,
            "PERFMON" => 1 << 38,
            "BPF" => 1 << 39,
            other => panic!("add {other} to the test's capability table"),
        })
        .fold(0, |a, b| a | b)
}

/// A guard in `ns` (the test bed's node, API on its loopback) that has
/// dropped a foreign LB IP's kernel reply shows it in /metrics, read from
/// the kernel counters, and is ready.
pub fn assert_api_shows_the_foreign_drop(ns: &crate::Netns) {
    let get = |path: &'static str| {
        ns.enter(move || Ok(crate::http_get("127.0.0.1:9477", path)))
            .expect("entering the namespace")
    };
    let (code, metrics) = get("/metrics");
    assert_eq!(code, 200, "{metrics}");
    let foreign = crate::bed::FOREIGN;
    let series = format!(
        "arp_guard_arp_frames_total{{lb_ip=\"{foreign}\",family=\"ipv4\",interface=\"eth0\",kind=\"reply\",origin=\"kernel\",state=\"foreign\",verdict=\"dropped\"}}"
    );
    assert!(metrics.contains(&series), "{metrics}");
    assert_eq!(get("/readyz"), (200, "ready\n".to_owned()));
}
