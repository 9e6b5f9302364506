//! The pure part: the facts the sources produce, and the view derived from
//! them (what the BPF maps should hold). Nothing here does I/O, so every
//! rule is tested without a kernel, a file or an API server.

pub mod addrs;
pub mod census;
pub mod cluster;
pub mod ownership;
pub mod view;
