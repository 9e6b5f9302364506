//! The failures tests make the server show: down (every connection closed
//! at once), a black hole (connections accepted and never answered), cut
//! watches, and faults per resource (an HTTP error for every request, or
//! watches stuck half-way through a chunk; see watch.rs).

use std::{sync::atomic::Ordering, time::Duration};

use serde_json::Value;

use super::{status, FakeApi, Inner, Resource};

/// A failure the server shows for one resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Every request (list, watch, GET) answers this HTTP status.
    Status(u16),
    /// Watches send half a chunk and then nothing, holding the connection
    /// open; lists and GETs work (a stuck stream while new connections work).
    StuckWatch,
    /// GETs of one object are never answered (held until the fault is
    /// healed or the client gives up); lists and watches work: an API
    /// check that hangs while the streams deliver.
    HungGet,
}

impl FakeApi {
    /// Cut every open watch connection mid-stream (and end a hold).
    pub fn drop_watches(&self) {
        let mut st = self.inner.state.lock().unwrap();
        st.generation += 1;
        st.held = false;
        self.inner.changed.notify_all();
    }

    /// Open watches, and those opened from now on, send nothing (no event,
    /// no bookmark) until [`FakeApi::drop_watches`] cuts them: what changes
    /// meanwhile no watch delivers, so that, with the history compacted, only
    /// a relist can show it. Cutting first and changing after would race
    /// with a watch the guard was opening at that moment.
    pub fn hold_watches(&self) {
        self.inner.state.lock().unwrap().held = true;
    }

    /// Down: every connection is closed at once, open watches are cut.
    pub fn set_down(&self, down: bool) {
        let mut st = self.inner.state.lock().unwrap();
        st.down = down;
        st.generation += 1;
        self.inner.changed.notify_all();
    }

    /// Reachable only from `ip` (a proxy's address): connections from
    /// anywhere else are closed at once, and counted ([`FakeApi::refused`]).
    /// None: from anywhere.
    pub fn only_from(&self, ip: Option<std::net::IpAddr>) {
        self.inner.state.lock().unwrap().only_from = ip;
    }

    /// Connections closed since for coming from elsewhere.
    pub fn refused(&self) -> u64 {
        self.inner.state.lock().unwrap().refused
    }

    /// Black hole: new connections are accepted and never answered, open
    /// watches are cut (a network partition that drops packets silently).
    pub fn set_blackhole(&self, on: bool) {
        let mut st = self.inner.state.lock().unwrap();
        st.blackhole = on;
        st.generation += 1;
        self.inner.changed.notify_all();
    }

    /// Make every request for `res` fail, or its watches stick (None: heal).
    /// Open watches of `res` are cut, so that the next ones meet the fault.
    pub fn set_fault(&self, res: Resource, fault: Option<Fault>) {
        let mut st = self.inner.state.lock().unwrap();
        match fault {
            Some(f) => st.faults.insert(res, f),
            None => st.faults.remove(&res),
        };
        st.generation += 1;
        self.inner.changed.notify_all();
    }
}

/// Wait while the server is a black hole (saying nothing).
pub(super) fn blackhole(inner: &Inner) {
    loop {
        let st = inner.state.lock().unwrap();
        if !st.blackhole || inner.stop.load(Ordering::SeqCst) {
            return;
        }
        drop(
            inner
                .changed
                .wait_timeout(st, Duration::from_millis(200))
                .unwrap(),
        );
    }
}

/// Hold a GET of one object of `res` while it has [`Fault::HungGet`]
/// (false: it has not, answer it).
pub(super) fn hold_get(inner: &Inner, res: Resource) -> bool {
    let hung = |inner: &Inner| {
        inner.state.lock().unwrap().faults.get(&res) == Some(&Fault::HungGet)
            && !inner.stop.load(Ordering::SeqCst)
    };
    if !hung(inner) {
        return false;
    }
    while hung(inner) {
        std::thread::sleep(Duration::from_millis(100));
    }
    true
}

/// The error every request for `res` answers while it has a status fault.
pub(super) fn answer(inner: &Inner, res: Resource, path: &str) -> Option<(u16, Value)> {
    let fault = inner.state.lock().unwrap().faults.get(&res).copied();
    let Some(Fault::Status(code)) = fault else {
        return None;
    };
    let reason = match code {
        401 => "Unauthorized",
        403 => "Forbidden",
        _ => "InternalError",
    };
    Some((
        code,
        status(code, reason, &format!("fake API: {reason} for {path}")),
    ))
}
