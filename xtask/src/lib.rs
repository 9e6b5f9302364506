//! Project automation: tool-chain set-up (the incident lab lives in the test
//! bed, `testbed::lab`).

pub mod setup;
