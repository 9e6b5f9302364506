//! arp-guard: keeps bare-metal nodes from answering ARP for LoadBalancer IPs
//! they do not own. The `arp-guard` binary is a thin shell over these modules.
// A daemon that must never take a node's traffic down does not panic on a
// value it could handle: unwrap/expect only where a comment says why.
#![deny(clippy::unwrap_used, clippy::expect_used)]
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

pub mod addrs;
pub mod api;
pub mod cli;
pub mod client;
pub mod cluster;
pub mod counters;
pub mod datapath;
pub mod events;
pub mod file_source;
pub mod interfaces;
pub mod metrics;
pub mod ownership_file;
pub mod pins;
pub mod preflight;
pub mod run;
pub mod status;
#[cfg(feature = "testing")]
pub mod testing;
pub mod view;

/// aa:bb:cc:dd:ee:ff
pub fn netns_fmt_mac(m: &[u8; 6]) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}
