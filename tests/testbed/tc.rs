//! Attaching the test fixtures' TC programs on any kernel: a TCX link where
//! the kernel has TCX (6.6+), else a netlink cls_bpf filter on a clsact
//! qdisc, as the guard itself falls back (the VM lane's 5.10 and 6.1).

use anyhow::{Context as _, Result};
use aya::programs::{
    tc::{self, NlOptions, TcAttachOptions},
    LinkOrder, SchedClassifier, TcAttachType,
};

/// Where a fixture goes relative to the programs already there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Position {
    First,
    Last,
}

/// The fixtures' own netlink filter handle (the guard's is 0xa6d0).
const FIXTURE_HANDLE: u16 = 0xf1;

/// Attach a loaded fixture program; it is detached when its `Ebpf` drops.
///
/// Netlink has no "before everything": filters run by priority, and the
/// guard takes priority 1. `First` therefore joins priority 1 with a handle
/// of its own: cls_bpf puts a new filter at the head of its priority's list,
/// so a fixture attached after the guard runs before it (the order these
/// tests need: a VLAN push before the guard, a responder before the census).
pub fn attach_fixture(
    prog: &mut SchedClassifier,
    iface: &str,
    dir: TcAttachType,
    pos: Position,
) -> Result<()> {
    let order = match pos {
        Position::First => LinkOrder::first(),
        Position::Last => LinkOrder::last(),
    };
    let tcx_err = match prog.attach_with_options(iface, dir, TcAttachOptions::TcxOrder(order)) {
        Ok(_) => return Ok(()),
        Err(e) => e,
    };
    // Fails with EEXIST when the guard added it already; any other failure
    // shows in the attach below.
    let _ = tc::qdisc_add_clsact(iface);
    let priority = match pos {
        Position::First => 1,
        Position::Last => 0xfff0,
    };
    let options = NlOptions {
        priority,
        handle: tc::TcHandle::new(0, FIXTURE_HANDLE),
        ..Default::default()
    };
    prog.attach_with_options(iface, dir, TcAttachOptions::Netlink(options))
        .with_context(|| format!("attaching a fixture to {iface} (TCX: {tcx_err}; netlink)"))?;
    Ok(())
}
