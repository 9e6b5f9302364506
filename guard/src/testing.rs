//! The test-only surface (cargo feature `testing`), for the integration
//! tests and benches in `tests/`; the daemon never uses it.

/// The fixture programs (`guard-ebpf/src/fixtures.rs`): a VLAN-tag pusher
/// and a Cilium-like ARP responder, in an object of their own.
pub static FIXTURES: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/arp-guard-fixtures"));

pub use crate::{
    api::{client::get_blocking as get, HEADER_TIMEOUT, MAX_CONNECTIONS},
    datapath::{maps::ApplyReport, monotonic_ns, Datapath, DatapathConfig, Gate},
    model::view::{LbIp, Provenance, View},
    sources::file::parse as parse_ownership_file,
    telemetry::{counters::Snapshot, metrics::NAMES as METRIC_NAMES},
};

/// Load the guard program (not attached) with the daemon's defaults in
/// `mode` and `leak_action`.
pub fn load(
    mode: guard_common::Mode,
    leak_action: guard_common::LeakAction,
) -> Result<Datapath, crate::datapath::DatapathError> {
    Datapath::load(&DatapathConfig {
        mode,
        leak_action,
        ..DatapathConfig::default()
    })
}

/// Mean kernel time of one run of the fixtures' empty TC program on `frame`:
/// the floor the programs' costs are measured against.
pub fn floor_timed(frame: &[u8], repeat: u32) -> anyhow::Result<std::time::Duration> {
    let mut obj = aya::Ebpf::load(FIXTURES)?;
    let prog: &mut aya::programs::SchedClassifier = obj
        .program_mut("fixture_empty")
        .ok_or_else(|| anyhow::anyhow!("fixture_empty missing"))?
        .try_into()?;
    prog.load()?;
    Ok(crate::datapath::timed_on(prog, frame, repeat)?)
}
