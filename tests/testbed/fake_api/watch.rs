//! The watch stream: events from a resourceVersion on, as chunks, with
//! bookmarks when asked for; a 410 Gone from a compacted resourceVersion;
//! the end at `timeoutSeconds`; and a stuck watch (half a chunk, then
//! silence).

use std::{
    io::{Read, Write},
    sync::atomic::Ordering,
    time::{Duration, Instant},
};

use anyhow::Result;
use serde_json::{json, Value};

use super::{
    conn::Conn,
    faults::Fault,
    select::Filter,
    status,
    store::State,
    tally::{Counts, Key as TallyKey},
    FakeApi, Inner, Resource,
};

impl FakeApi {
    /// Send bookmarks this often (1 s by default, for tests that want
    /// progress soon; a real server sends one about every minute).
    pub fn set_bookmark_every(&self, every: Duration) {
        (self.inner.bookmark_every_ms).store(every.as_millis() as u64, Ordering::Relaxed);
    }
}

/// True while `res` has a stuck-watch fault.
pub(super) fn stuck(inner: &Inner, res: Resource) -> bool {
    inner.state.lock().unwrap().faults.get(&res) == Some(&Fault::StuckWatch)
}

/// Half a chunk, then silence until the client goes away or the test ends.
fn hang(mut out: Conn, inner: &Inner) -> Result<()> {
    out.write_all(b"40\r\n{\"type\":\"MODIFIED\",\"obj")?;
    out.flush()?;
    out.tcp()
        .set_read_timeout(Some(Duration::from_millis(200)))?;
    let mut b = [0u8; 64];
    while !inner.stop.load(Ordering::SeqCst) {
        match out.read(&mut b) {
            Ok(0) => return Ok(()),
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return Ok(()),
        }
    }
    Ok(())
}

/// One chunk of a watch, written at once: one TCP segment per event, as a
/// real server's buffered writer sends it (not one for the size line and
/// another for the data).
fn chunk(out: &mut impl Write, line: &Value) -> std::io::Result<()> {
    let data = format!("{line}\n");
    out.write_all(format!("{:x}\r\n{data}\r\n", data.len()).as_bytes())?;
    out.flush()
}

/// What a watch sent, into the tally: the bytes written since the last
/// count, with the events and bookmarks among them.
struct Meter<'a> {
    inner: &'a Inner,
    key: &'a TallyKey,
    mark: u64,
}

impl Meter<'_> {
    fn count(&mut self, out: &Conn, events: u64, bookmarks: u64) {
        let bytes = out.written - self.mark;
        self.mark = out.written;
        let c = Counts {
            bytes,
            events,
            bookmarks,
            ..Counts::default()
        };
        self.inner.tally.lock().unwrap().add(self.key, c);
    }
}

/// The end of a stream the server ends properly: the terminating chunk.
fn end(mut out: Conn, meter: &mut Meter<'_>, events: u64) -> Result<Option<Conn>> {
    write!(out, "0\r\n\r\n")?;
    out.flush()?;
    meter.count(&out, events, 0);
    Ok(Some(out))
}

/// The events of the log after `sent_up_to` that the filter shows, as
/// watch lines.
fn pending(st: &State, f: &Filter<'_>, sent_up_to: u64) -> Vec<Value> {
    let first = st.log.partition_point(|e| e.rv <= sent_up_to);
    st.log[first..]
        .iter()
        .filter_map(|e| Some((e.rv, f.seen(e)?)))
        .map(|(rv, (kind, object))| {
            // A DELETED made of the previous content carries the
            // event's resourceVersion, as on a real server.
            let mut object = object.clone();
            object["metadata"]["resourceVersion"] = json!(rv.to_string());
            json!({"type": kind, "object": object})
        })
        .collect()
}

/// A watch, to its end: the connection back when the server ended the
/// stream properly (its timeout, a 410), None when it was cut or hung.
pub(super) fn watch_stream(
    (mut out, (inner, key)): (Conn, (&Inner, &TallyKey)),
    f: &Filter<'_>,
    from: u64,
    timeout: Duration,
    bookmarks: bool,
) -> Result<Option<Conn>> {
    let mark = out.written;
    let mut meter = Meter { inner, key, mark };
    write!(
        out,
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    )?;
    meter.count(&out, 0, 0);
    if stuck(inner, f.res) {
        return hang(out, inner).map(|()| None);
    }
    let deadline = Instant::now() + timeout;
    let mut sent_up_to = from;
    let mut last_bookmark = Instant::now();
    let mut st = inner.state.lock().unwrap();
    let generation = st.generation;
    if from < st.compacted {
        let gone = status(
            410,
            "Expired",
            &format!("too old resource version: {from} ({})", st.compacted),
        );
        drop(st);
        chunk(&mut out, &json!({"type": "ERROR", "object": gone}))?;
        return end(out, &mut meter, 1);
    }
    loop {
        if inner.stop.load(Ordering::SeqCst) || st.generation != generation || st.down {
            // A cut connection: no terminating chunk, just close.
            return Ok(None);
        }
        if st.faults.get(&f.res) == Some(&Fault::StuckWatch) {
            drop(st);
            return hang(out, inner).map(|()| None);
        }
        if st.held {
            st = next_change(inner, st);
            continue;
        }
        if Instant::now() >= deadline {
            // timeoutSeconds reached: the server ends the stream properly.
            drop(st);
            return end(out, &mut meter, 0);
        }
        let lines = pending(&st, f, sent_up_to);
        sent_up_to = st.rv;
        let res = f.res;
        let every = Duration::from_millis(inner.bookmark_every_ms.load(Ordering::Relaxed));
        let bookmark = (bookmarks && last_bookmark.elapsed() >= every).then(|| {
            json!({"type": "BOOKMARK", "object": {"kind": res.kind(), "apiVersion": res.api_version(), "metadata": {"resourceVersion": st.rv.to_string()}}})
        });
        drop(st);
        for l in &lines {
            chunk(&mut out, l)?;
        }
        let marked = bookmark.is_some();
        if let Some(b) = bookmark {
            chunk(&mut out, &b)?;
            last_bookmark = Instant::now();
        }
        if marked || !lines.is_empty() {
            meter.count(&out, lines.len() as u64, u64::from(marked));
        }
        st = inner.state.lock().unwrap();
        if st.rv == sent_up_to {
            st = next_change(inner, st);
        }
    }
}

/// Wait for the next change of the server's state (at most 200 ms: the
/// watch's deadline and its bookmarks are looked at in between).
fn next_change<'a>(
    inner: &'a Inner,
    st: std::sync::MutexGuard<'a, State>,
) -> std::sync::MutexGuard<'a, State> {
    (inner.changed)
        .wait_timeout(st, Duration::from_millis(200))
        .unwrap()
        .0
}
