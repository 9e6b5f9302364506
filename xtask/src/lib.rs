//! Project automation: tool-chain set-up and the incident lab.

pub mod lab;
pub mod setup;
