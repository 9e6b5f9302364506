//! The `kubectl-arp_guard` binary: kubectl runs it as `kubectl arp-guard`;
//! under the name `kubectl_complete-arp_guard` (a link or a copy beside it)
//! it completes the command line instead. One binary, so that one file is
//! installed (krew's manifest names one).
#![deny(clippy::unwrap_used, clippy::expect_used)]

use std::{process::ExitCode, time::Duration};

use clap::Parser as _;
use guard_wire::cli::{end_quietly_on_a_closed_pipe, exit};
use kubectl_arp_guard::{complete, run, PluginCli, COMPLETE_NAME};

/// The name this binary was run under, without `.exe`.
fn invoked_as() -> String {
    let arg0 = std::env::args_os().next().unwrap_or_default();
    let name = std::path::Path::new(&arg0).file_stem().unwrap_or_default();
    name.to_string_lossy().into_owned()
}

fn main() -> ExitCode {
    end_quietly_on_a_closed_pipe();
    if invoked_as() == COMPLETE_NAME {
        let words: Vec<String> = std::env::args().skip(1).collect();
        print!("{}", complete(&words));
        return ExitCode::SUCCESS;
    }
    let cli = PluginCli::parse();
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
