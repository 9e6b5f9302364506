//! The histogram the daemon keeps by hand and serves in its documents
//! (`guard_wire::histogram`: the plugin reads the same type back).

pub use guard_wire::histogram::{Histogram, FAILOVER_SECONDS};
