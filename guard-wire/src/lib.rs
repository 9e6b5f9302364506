//! What a guard says of itself, as it crosses a process boundary: served
//! by its local API, written into the Kubernetes API, read by `kubectl
//! arp-guard` on any laptop. Serde types only, and the pure helpers that go
//! with them; nothing Linux-only, so that the plugin builds everywhere.
//! Beside them, what the two command lines share (`cli`: durations, exit
//! codes; `connect`: how kubectl reaches the API server; `plugin_cli`: the
//! plugin's flags, which the daemon's reference lists).
// Read by the daemon, which must never take a node's traffic down, and by
// the plugin: unwrap/expect only where a comment says why.
#![deny(clippy::unwrap_used, clippy::expect_used)]
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

pub mod api;
pub mod census;
pub mod cli;
pub mod clients;
pub mod connect;
pub mod events;
pub mod histogram;
pub mod kubeconfig;
pub mod memory;
pub mod node;
pub mod plugin_cli;
pub mod presence;
pub mod route;
pub mod status;
pub mod takeover;
pub mod text;
