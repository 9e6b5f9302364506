//! The arguments of the commands that read or remove what a guard left:
//! `uninstall`, `counters`, `validate`.

use std::{path::PathBuf, time::Duration};

use clap::Args;

use super::{parse_duration, Output, DEFAULT_API, DEFAULT_PIN_DIR};
use crate::sources::file::DEFAULT_MAX_BYTES;

#[derive(Debug, Args)]
pub struct UninstallArgs {
    /// The --pin-dir the guard ran with.
    #[arg(long, value_name = "PATH", default_value = DEFAULT_PIN_DIR)]
    pub pin_dir: PathBuf,
    /// Also remove arp-guard's netlink filter from these interfaces (default: every interface).
    #[arg(short = 'i', long = "interface", value_name = "IFACE")]
    pub uplinks: Vec<String>,
    /// Remove the pins even while a daemon holds the pin directory.
    #[arg(long)]
    pub force: bool,
    /// While a daemon holds the pin directory, wait this long for it to exit
    /// (a terminating pod) before giving up (or, with --force, going ahead).
    #[arg(long, value_name = "DURATION", default_value = "0s", value_parser = parse_duration)]
    pub wait: Duration,
    /// After uninstalling, keep running until SIGTERM/SIGINT: the clean-up
    /// DaemonSet's pod then shows Ready once its node is clean.
    #[arg(long)]
    pub stay: bool,
}

#[derive(Debug, Args)]
pub struct CountersArgs {
    /// Interface whose guard is read (in the current network namespace).
    #[arg(short = 'i', long = "interface", value_name = "IFACE", required = true)]
    pub uplinks: Vec<String>,
    /// Output format.
    #[arg(short, long, value_enum, default_value_t = Output::Table)]
    pub output: Output,
    /// The daemon's --listen address, asked first.
    #[arg(long, value_name = "ADDR", default_value = DEFAULT_API, env = "ARP_GUARD_API")]
    pub api: std::net::SocketAddr,
    /// The daemon's --pin-dir, read next when no daemon answers (needs only
    /// read permission on the pins).
    #[arg(long, value_name = "PATH", default_value = DEFAULT_PIN_DIR)]
    pub pin_dir: PathBuf,
}

#[derive(Debug, Args)]
pub struct ValidateArgs {
    /// The ownership file to check.
    pub file: PathBuf,
    /// Largest file accepted, in bytes (as `run --ownership-file-max-bytes`).
    #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_MAX_BYTES)]
    pub max_bytes: u64,
    /// Print the view of this node (default: $NODE_NAME, then the hostname).
    #[arg(long, env = "NODE_NAME")]
    pub node_name: Option<String>,
}
