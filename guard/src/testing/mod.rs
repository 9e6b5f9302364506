//! The test-only surface: the deterministic random numbers every
//! property test draws from (the unit tests' and the integration tests'),
//! and, with the cargo feature `testing`, what the integration tests and
//! benches in `tests/` need of the daemon (`harness`). The daemon never
//! uses any of it.

mod rng;
pub use rng::Rng;

/// The watch body's line splitter, for the differential fuzz test
/// (`tests/fuzz_watch_lines.rs`): the one part of the watch path that is
/// not a library's.
pub use crate::sources::cluster::wire::{Lines as WatchLines, MAX_LINE};

#[cfg(feature = "testing")]
mod harness;
#[cfg(feature = "testing")]
pub use harness::*;
