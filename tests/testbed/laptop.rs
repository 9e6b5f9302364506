//! An operator's laptop: `kubectl arp-guard` (the plugin crate's binary
//! on PATH under kubectl's name for it) run through Debian's kubectl from
//! the management network's namespace, with the bed's kubeconfig and no
//! proxy but the ones a test sets.

use std::{
    path::PathBuf,
    process::Command,
    time::{Duration, Instant},
};

use serde_json::Value;

use crate::{bed::TempDir, cluster_bed::ClusterBed};

/// The proxy settings a laptop may carry: unset but where a test sets them.
const PROXY_VARS: [&str; 6] = [
    "HTTPS_PROXY",
    "https_proxy",
    "HTTP_PROXY",
    "http_proxy",
    "NO_PROXY",
    "no_proxy",
];

/// The operator's side: the plugin on PATH under kubectl's name for it,
/// run from the management network (the switch namespace, which holds the
/// API server's address).
pub struct Laptop {
    bin: TempDir,
    pub kubeconfig: PathBuf,
    netns: String,
    kubectl: bool,
}

pub struct Ran {
    pub code: i32,
    pub out: String,
    pub err: String,
    pub took: Duration,
}

impl Laptop {
    pub fn new(bed: &ClusterBed) -> Laptop {
        let bin = TempDir::new("kubectl-plugin").unwrap();
        for name in ["kubectl-arp_guard", "kubectl_complete-arp_guard"] {
            std::os::unix::fs::symlink(crate::plugin_binary(), bin.path().join(name)).unwrap();
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
    pub fn run(&self, args: &[&str]) -> Ran {
        self.run_env(&[], args)
    }

    /// [`Laptop::run`] without printing what it said (a bench's large output).
    pub fn run_quiet(&self, args: &[&str]) -> Ran {
        self.ran(&[], args)
    }

    /// [`Laptop::run`] with `env` set too (no proxy but those it names).
    pub fn run_env(&self, env: &[(&str, &str)], args: &[&str]) -> Ran {
        let ran = self.ran(env, args);
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

    fn ran(&self, env: &[(&str, &str)], args: &[&str]) -> Ran {
        let path = format!(
            "{}:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
            self.bin.path().display()
        );
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.netns, "env"]);
        for v in PROXY_VARS {
            c.args(["-u", v]);
        }
        c.arg(format!("PATH={path}"))
            .arg(format!("KUBECONFIG={}", self.kubeconfig.display()));
        c.args(env.iter().map(|(k, v)| format!("{k}={v}")));
        if self.kubectl {
            c.args(["kubectl", "arp-guard"]);
        } else {
            c.arg(self.bin.path().join("kubectl-arp_guard"));
        }
        c.args(args);
        let t = Instant::now();
        let o = c.output().unwrap();
        Ran {
            code: o.status.code().unwrap_or(-1),
            out: String::from_utf8_lossy(&o.stdout).into_owned(),
            err: String::from_utf8_lossy(&o.stderr).into_owned(),
            took: t.elapsed(),
        }
    }

    pub fn json(&self, args: &[&str]) -> (i32, Value) {
        let mut a = args.to_vec();
        a.extend(["-o", "json"]);
        let r = self.run(&a);
        let v = serde_json::from_str(&r.out).unwrap_or_else(|e| panic!("{e}: {}", r.out));
        (r.code, v)
    }
}

/// Each exec runs the guard's command in its node's namespace, with the
/// DaemonSet's capabilities and read-only root, as in its container.
pub fn serve_execs(bed: &ClusterBed) {
    let nodes: Vec<(String, String)> = bed
        .nodes
        .iter()
        .map(|n| (n.name.clone(), n.ns.name.clone()))
        .collect();
    let wrapper = crate::deploy::daemonset_wrapper();
    let bin = crate::guard_binary();
    bed.api
        .set_exec(Box::new(move |call: &crate::fake_api::ExecCall| {
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
