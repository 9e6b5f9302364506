//! `kubectl arp-guard`: the whole segment's story from a laptop, through
//! the API server only. A crate of its own, apart from the daemon's, so
//! that it builds for Linux, macOS and Windows: it shares the daemon's wire
//! types (`guard-wire`) and nothing Linux-only. kubectl finds its binary on
//! PATH as `kubectl-arp_guard`; run as `kubectl_complete-arp_guard` it
//! completes.
//!
//! ```text
//! main       the binary: which of the two names, logging, the runtime, the exit code
//! ask        one command: the reads, the asking, the merge, the output
//! complete   kubectl's completion of the plugin
//! node_view  one node's findings, from its ArpGuardNode or its guard's answer (pure)
//! status     the merge of `status` (pure); status_table its table
//! views      `clients`, `responders`, `explain`, `doctor`, `events` (pure)
//! fanout     every guard asked, each within its deadline, all within the command's
//! exec       the guard's own command in its Pod (pods/exec over WebSocket)
//! cluster    what the API alone holds, read once; raw: ArpGuardNodes and Tables; table: a Table
//! connect    the client, from the kubeconfig as kubectl uses it (proxies too)
//! output     columns, ages, JSON and YAML
//! ```
//!
//! Its command line is `guard_wire::plugin_cli` (the daemon's reference
//! documents it from there).
// A laptop's command: an error says what went wrong, it does not panic;
// unwrap/expect only where a comment says why.
#![deny(clippy::unwrap_used, clippy::expect_used)]
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

mod ask;
mod cluster;
pub mod complete;
mod connect;
mod exec;
mod fanout;
mod node_view;
mod output;
mod raw;
mod status;
mod status_table;
mod table;
mod views;

pub use ask::run;
pub use complete::complete;
pub use guard_wire::plugin_cli::PluginCli;

/// The name kubectl (1.26+) runs the completer under: this binary (named
/// `kubectl-arp_guard` in Cargo.toml) linked or copied beside itself.
pub const COMPLETE_NAME: &str = "kubectl_complete-arp_guard";
