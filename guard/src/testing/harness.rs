//! What the integration tests and benches in `tests/` need of the daemon
//! (cargo feature `testing`).

/// The fixture programs (`guard-ebpf/src/fixtures.rs`): a VLAN-tag pusher
/// and a Cilium-like ARP responder, in an object of their own.
pub static FIXTURES: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/arp-guard-fixtures"));

pub use crate::{
    api::{client::get_blocking as get, HEADER_TIMEOUT, MAX_CONNECTIONS},
    datapath::{maps::ApplyReport, monotonic_ns, Datapath, DatapathConfig, Gate},
    model::{
        probing::{
            askers as probe_askers, asks as probe_asks, request_frame as probe_request_frame, Pace,
        },
        view::{LbIp, Provenance, View},
    },
    sources::{
        cluster::cost::{costs as feed_costs, feed_bytes, Costs as FeedCosts},
        file::parse as parse_ownership_file,
    },
    telemetry::counters::Snapshot,
};

/// Every metric family the daemon exports (its catalogue).
pub fn metric_names() -> Vec<String> {
    crate::telemetry::catalogue::families()
        .into_iter()
        .map(|f| f.name)
        .collect()
}

/// The active census's pace as `run` builds it from the `--probe-*` flags
/// `args` (none: the defaults); None when `--probe-interval 0` turns it off.
/// What the probing bench computes its tables with, so that they follow the
/// flags' defaults.
pub fn probe_pace(args: &[&str]) -> Result<Option<Pace>, String> {
    #[derive(clap::Parser)]
    struct Flags {
        #[command(flatten)]
        presence: crate::cli::PresenceArgs,
    }
    let flags = <Flags as clap::Parser>::try_parse_from(std::iter::once(&"arp-guard").chain(args))
        .map_err(|e| e.to_string())?;
    Ok(flags.presence.probing.pace())
}

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

/// [`load`] with another build of the egress program (an earlier
/// revision's object, for before/after benchmarks).
pub fn load_object(
    object: &[u8],
    mode: guard_common::Mode,
    leak_action: guard_common::LeakAction,
) -> Result<Datapath, crate::datapath::DatapathError> {
    Datapath::load_object(
        &DatapathConfig {
            mode,
            leak_action,
            ..DatapathConfig::default()
        },
        object,
    )
}

/// Mean kernel time of one run of the fixtures' empty TC program on `frame`:
/// the floor the programs' costs are measured against.
pub fn floor_timed(frame: &[u8], repeat: u32) -> anyhow::Result<std::time::Duration> {
    Floor::load()?.timed(frame, repeat)
}

/// The fixtures' empty TC program, loaded once: the floor of every datapath
/// benchmark, run through the same `BPF_PROG_TEST_RUN` path as the guard.
pub struct Floor(aya::Ebpf);

impl Floor {
    pub fn load() -> anyhow::Result<Self> {
        let mut obj = aya::Ebpf::load(FIXTURES)?;
        let prog: &mut aya::programs::SchedClassifier = obj
            .program_mut("fixture_empty")
            .ok_or_else(|| anyhow::anyhow!("fixture_empty missing"))?
            .try_into()?;
        prog.load()?;
        Ok(Floor(obj))
    }

    pub fn program(&self) -> anyhow::Result<&aya::programs::SchedClassifier> {
        Ok(self
            .0
            .program("fixture_empty")
            .ok_or_else(|| anyhow::anyhow!("fixture_empty missing"))?
            .try_into()?)
    }

    /// Mean kernel time of one run on `frame`, over `repeat` runs.
    pub fn timed(&self, frame: &[u8], repeat: u32) -> anyhow::Result<std::time::Duration> {
        Ok(crate::datapath::timed_on(self.program()?, frame, repeat)?)
    }
}

/// What the kernel made of a loaded program: instructions after the
/// verifier (its rewrites and inlined helpers included) and bytes of JIT code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProgramSize {
    pub id: u32,
    pub xlated_insns: u32,
    pub jited_bytes: u32,
}

pub fn program_size(prog: &aya::programs::SchedClassifier) -> anyhow::Result<ProgramSize> {
    let info = prog.info()?;
    Ok(ProgramSize {
        id: info.id(),
        xlated_insns: info.size_translated().unwrap_or(0) / 8,
        jited_bytes: info.size_jitted(),
    })
}
