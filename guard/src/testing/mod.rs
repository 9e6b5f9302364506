//! The test-only surface: the deterministic random numbers every
//! property test draws from (the unit tests' and the integration tests'),
//! and, with the cargo feature `testing`, what the integration tests and
//! benches in `tests/` need of the daemon (`harness`). The daemon never
//! uses any of it.

mod rng;
pub use rng::Rng;

#[cfg(feature = "testing")]
mod harness;
#[cfg(feature = "testing")]
pub use harness::*;
