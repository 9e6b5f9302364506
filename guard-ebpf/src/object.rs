//! What each BPF object this crate builds declares (the guard's,
//! `main.rs`, and the test fixtures', `fixtures_main.rs`): the panic
//! handler `no_std` asks for, and the licence the kernel reads.

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

/// The licence declared to the kernel. The kernel lets only programs with a
/// GPL-compatible licence use some helpers and run in its GPL context;
/// "Dual MIT/GPL" is one it accepts, and MIT is how these sources are
/// licensed (MIT OR Apache-2.0, as the whole project), so the declaration
/// asks nothing more of a user than the project's own licence does.
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
