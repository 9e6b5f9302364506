//! arp-guard's TC egress program, and the observe-only TC ingress census
//! beside it (`census.rs`).
//!
//! Frames that are neither ARP, VLAN-tagged nor possibly NDP cost one bounds
//! check and a two-byte read (IPv6: one more byte). ARP and NDP frames are
//! parsed and judged by `guard_common` (the same code the host tests run), the
//! decision is counted per LB IP, interface, kind, origin, state and verdict,
//! and the frame is passed, dropped or has its SPA rewritten.
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]

#[cfg(target_arch = "bpf")]
mod act;
#[cfg(target_arch = "bpf")]
mod arp;
#[cfg(target_arch = "bpf")]
mod census;
#[cfg(target_arch = "bpf")]
mod claim;
#[cfg(target_arch = "bpf")]
mod maps;
#[cfg(target_arch = "bpf")]
mod ndp;
#[cfg(target_arch = "bpf")]
mod object;
#[cfg(target_arch = "bpf")]
mod program;
#[cfg(target_arch = "bpf")]
mod report;
#[cfg(target_arch = "bpf")]
mod skb;

// On the host this crate is an empty binary, so that workspace-wide commands
// (clippy, test) do not need the BPF toolchain.
#[cfg(not(target_arch = "bpf"))]
fn main() {}
