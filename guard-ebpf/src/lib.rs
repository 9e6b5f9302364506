// This file exists so that guard/build.rs can name this crate as a build
// dependency (cargo then rebuilds the guard when the program changes); the
// program itself is src/main.rs, built for bpfel-unknown-none.
#![no_std]
