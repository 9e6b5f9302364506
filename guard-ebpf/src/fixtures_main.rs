//! Test-only TC programs (see `fixtures.rs`), built as their own object so
//! that the production object holds only the guard.
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]

#[cfg(target_arch = "bpf")]
mod fixtures;
#[cfg(target_arch = "bpf")]
mod object;

#[cfg(not(target_arch = "bpf"))]
fn main() {}
