//! The test-only surface (cargo feature `testing`), for the integration
//! tests and benches in `tests/`; the daemon never uses it.

/// The fixture programs (`guard-ebpf/src/fixtures.rs`): a VLAN-tag pusher
/// and a Cilium-like ARP responder, in an object of their own.
pub static FIXTURES: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/arp-guard-fixtures"));
