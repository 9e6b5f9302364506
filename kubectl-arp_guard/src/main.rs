//! The `kubectl-arp_guard` binary: kubectl runs it as `kubectl arp-guard`;
//! under the name `kubectl_complete-arp_guard` (a link or a copy beside it)
//! it completes the command line instead. One binary, so that one file is
//! installed (krew's manifest names one).
#![deny(clippy::unwrap_used, clippy::expect_used)]

use std::{process::ExitCode, time::Duration};

use clap::Parser as _;
use guard_wire::cli::{end_quietly_on_a_closed_pipe, exit};
use kubectl_arp_guard::{complete, kube_readable_no_proxy, run, PluginCli, COMPLETE_NAME};

/// The name this binary was run under, without `.exe`.
fn invoked_as() -> String {
    let arg0 = std::env::args_os().next().unwrap_or_default();
    let name = std::path::Path::new(&arg0).file_stem().unwrap_or_default();
    name.to_string_lossy().into_owned()
}

/// kube-rs fails on a `NO_PROXY` kubectl reads (an empty entry), while it
/// loads a kubeconfig under a proxy: the same list, in a form it reads.
/// Before any thread starts (the environment is the process's), and for
/// the credential plugins the client runs too, to whom it means the same.
fn no_proxy_kube_rs_reads() {
    for name in ["NO_PROXY", "no_proxy"] {
        let readable = std::env::var(name)
            .ok()
            .and_then(|v| kube_readable_no_proxy(&v));
        if let Some(v) = readable {
            std::env::set_var(name, v);
        }
    }
}

fn main() -> ExitCode {
    end_quietly_on_a_closed_pipe();
    if invoked_as() == COMPLETE_NAME {
        let words: Vec<String> = std::env::args().skip(1).collect();
        print!("{}", complete(&words));
        return ExitCode::SUCCESS;
    }
    let cli = PluginCli::parse();
    no_proxy_kube_rs_reads();
    // Warnings only (kube's own lines would mix with the tables).
    let filter = tracing_subscriber::EnvFilter::try_from_env("ARP_GUARD_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build();
    let result = match rt {
        Ok(rt) => {
            let r = rt.block_on(run(cli));
            rt.shutdown_timeout(Duration::from_millis(100));
            r
        }
        Err(e) => Err(e.into()),
    };
    exit(result, "kubectl arp-guard")
}
