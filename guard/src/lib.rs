//! arp-guard: keeps bare-metal nodes from answering ARP for LoadBalancer IPs
//! they do not own. The `arp-guard` binary is a thin shell over `commands`.
//!
//! The layers, each importing only those below it:
//!
//! ```text
//! reference               docs/reference, generated from cli (and the
//!                         plugin's, `guard_wire::plugin_cli`), telemetry
//!                         and model (`cargo xtask docs`)
//! commands, cli           what the user runs
//! probe                   `arp-guard probe`: a tool beside the daemon (ARP
//!                         and TCP from any host on the segment); it reads
//!                         interfaces through sources and datapath, and
//!                         nothing imports it but commands and cli
//! daemon                  the loop: one handler per event
//! senders                 the frames the guard sends of its own: the active
//!                         census's requests, refreshes of stale clients
//! api                     the local HTTP API (axum) and its CLI client
//! telemetry               counters, events, metrics, status document
//! sources                 file, interface addresses, Kubernetes API -> facts
//! datapath                the program in the kernel: load, attach, maps, pins
//! model                   pure: facts -> view (what the maps should hold)
//! ops                     the operation counters and the memory-pressure
//!                         signal every part may write
//! guard-wire (crate)      the documents served, written and read back (shared
//!                         with `kubectl arp-guard`, a crate of its own)
//! guard-common (crate)    pure: frame parser and the verdict, shared with the program
//! ```
// A daemon that must never take a node's traffic down does not panic on a
// value it could handle: unwrap/expect only where a comment says why.
#![deny(clippy::unwrap_used, clippy::expect_used)]
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

pub mod cli;
pub mod commands;
pub mod reference;

mod api;
mod daemon;
mod datapath;
mod model;
mod ops;
mod probe;
mod senders;
mod sources;
mod telemetry;

#[cfg(any(test, feature = "testing"))]
pub mod testing;
