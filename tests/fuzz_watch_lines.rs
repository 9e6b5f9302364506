//! Differential fuzzing of what stays hand-written on the watch path once
//! hyper frames the HTTP/1.1 body (issue 44): cutting a watch body into
//! lines, with a bound on a line's length.
//!
//! The same random bytes (JSON-ish events, blank and whitespace lines, CR
//! and LF mixes, random bytes, lines at, just over and far over the bound,
//! a partial last line) go
//!
//! - through [`reference`], the simplest splitter there is: the whole body
//!   in memory, cut at every LF;
//! - over the wire: served by hyper's HTTP/1.1 server as a chunked body,
//!   one chunk per frame of random size (empty ones too), through an
//!   in-memory pipe of random capacity (1 byte to 8 KiB: reads end
//!   anywhere), and read back frame by frame by hyper's client connection;
//!   each frame is fed as it arrives, cut again at random points, to the
//!   splitter under test ([`Candidate`]).
//!
//! Asserted per case: hyper hands over the bytes unchanged; the reference
//! cuts what arrived as it cuts the original; and the splitter under test,
//! fed what hyper gave, finds the reference's lines and ends the same way
//! (the body's end, its partial last line dropped; or a line over the
//! bound, after the same lines). A failing case prints its seed and bytes.
//! `ARP_GUARD_FUZZ_SEED` and `ARP_GUARD_FUZZ_CASES` change the run.
//!
//! The contract (the one the hand-written HTTP/1.1 decoder kept before
//! hyper): a line is the bytes between two LFs (a CR before the LF is kept:
//! JSON reads it as whitespace), lines of ASCII whitespace only are
//! skipped, a line (without its LF) longer than the bound is an error, a
//! partial last line is dropped. [`Candidate`] is the daemon's own splitter
//! (`sources/cluster/wire.rs`, `Lines`, through `guard::testing`).

use std::{
    collections::VecDeque,
    convert::Infallible,
    future::poll_fn,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Instant,
};

use guard::testing::Rng;
use hyper::{
    body::{Body, Bytes, Frame, Incoming},
    Request, Response,
};
use hyper_util::rt::TokioIo;

/// How a body's cutting ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    /// The body ended (a partial last line is dropped).
    Body,
    /// A line longer than the bound.
    TooLong,
}

/// A splitter fed a body piece by piece, as the watch path feeds it.
trait Splitter {
    fn new(max: usize) -> Self;
    /// Take `bytes`; each whole line found goes to `out`. Err: a line
    /// longer than the bound (nothing is fed after it).
    fn feed(&mut self, bytes: &[u8], out: &mut Vec<Vec<u8>>) -> Result<(), End>;
}

/// The splitter under test: the daemon's own.
type Candidate = guard::testing::WatchLines;

impl Splitter for guard::testing::WatchLines {
    fn new(max: usize) -> Self {
        guard::testing::WatchLines::new(max)
    }

    fn feed(&mut self, bytes: &[u8], out: &mut Vec<Vec<u8>>) -> Result<(), End> {
        self.push(bytes);
        loop {
            match self.take() {
                Ok(Some(l)) => out.push(l.to_vec()),
                Ok(None) => return Ok(()),
                Err(_) => return Err(End::TooLong),
            }
        }
    }
}

/// The simplest cutting of a whole body: at every LF; what follows the
/// last LF is a partial line.
fn reference(body: &[u8], max: usize) -> (Vec<Vec<u8>>, End) {
    let mut parts: Vec<&[u8]> = body.split(|b| *b == b'\n').collect();
    let partial = parts.pop().unwrap_or_default();
    let mut lines = Vec::new();
    for p in parts {
        if p.len() > max {
            return (lines, End::TooLong);
        }
        if !p.iter().all(u8::is_ascii_whitespace) {
            lines.push(p.to_vec());
        }
    }
    let end = if partial.len() > max {
        End::TooLong
    } else {
        End::Body
    };
    (lines, end)
}

/// One generated case: a body, the bound, how the server frames it and
/// the pipe's capacity.
#[derive(Debug, Clone)]
struct Case {
    body: Vec<u8>,
    max: usize,
    frames: Vec<usize>,
    pipe: usize,
    /// Where the client's frames are cut again before the splitter.
    recut: u64,
}

/// A JSON-ish watch event (escaped quotes and newlines, UTF-8 text) of
/// `len` bytes or a few more (at least about 100).
fn event(r: &mut Rng, len: usize) -> Vec<u8> {
    let kind = *r.pick(&["ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR"]);
    let mut e = format!(
        r#"{{"type":"{kind}","object":{{"metadata":{{"name":"l-{}","resourceVersion":"{}"}},"spec":{{"x":""#,
        r.below(1000),
        r.next_u64() % 1_000_000
    );
    while e.len() + 4 < len {
        let piece = *r.pick(&["a", "z", "0", " ", "é", "✓", "\\\"", "\\n", "\\\\"]);
        e.push_str(piece);
    }
    e.push_str("\"}}}");
    e.into_bytes()
}

/// One line's content (without its terminator), sized against `max`:
/// mostly events under the bound, some at it, over it or far over it.
fn line(r: &mut Rng, max: usize) -> Vec<u8> {
    match r.below(16) {
        0 => Vec::new(),
        1 => (0..1 + r.below(4)).map(|_| *r.pick(b" \t\r\x0c")).collect(),
        2 => {
            let n = r.below(max + 1);
            r.bytes(n)
        }
        3 => vec![b'x'; max],
        4 if r.below(3) == 0 => vec![b'y'; max + 1 + r.below(3)],
        5 if r.below(4) == 0 => vec![b'z'; max * (2 + r.below(4))],
        // A lone CR inside.
        6 => {
            let mut e = event(r, max / 2);
            let at = r.below(e.len());
            e.insert(at, b'\r');
            e
        }
        _ => {
            let n = r.below(max + 1);
            event(r, n)
        }
    }
}

/// How lines end (LF most often).
const ENDS: &[&[u8]] = &[b"\n", b"\n", b"\r\n", b"\r\r\n", b"\n\n"];

fn generate(r: &mut Rng) -> Case {
    let max = *r.pick(&[16, 64, 200, 200, 1024, 1024]);
    let mut body = Vec::new();
    for _ in 0..r.below(12) {
        body.extend(line(r, max));
        let end = *r.pick(ENDS);
        body.extend_from_slice(end);
    }
    if r.below(3) == 0 {
        // A partial last line.
        body.extend(line(r, max));
    }
    let mut frames = Vec::new();
    let mut left = body.len();
    while left > 0 {
        let n = match r.below(6) {
            0 => 0,
            1 => 1,
            2 => left,
            _ => 1 + r.below(left.min(300)),
        }
        .min(left);
        frames.push(n);
        left -= n;
    }
    Case {
        max,
        frames,
        // A byte or three a read only for small bodies: under debug
        // assertions hyper costs about 10 µs a byte read one at a time.
        pipe: if body.len() <= 400 {
            *r.pick(&[1, 3, 16, 61, 512, 8192])
        } else {
            *r.pick(&[16, 61, 512, 8192])
        },
        recut: r.next_u64(),
        body,
    }
}

/// A response body of the given frames, each one chunk on the wire.
struct Chunks(VecDeque<Bytes>);

impl Body for Chunks {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Ready(self.0.pop_front().map(|b| Ok(Frame::data(b))))
    }
}

/// Serve `case` with hyper's server and read it back with hyper's client
/// over an in-memory pipe; the data frames the client got.
async fn over_the_wire(case: Arc<Case>) -> Vec<Bytes> {
    let (client_io, server_io) = tokio::io::duplex(case.pipe);
    let served = case.clone();
    let service = hyper::service::service_fn(move |_req: Request<Incoming>| {
        let mut at = 0;
        let frames = (served.frames.iter())
            .map(|n| {
                let b = Bytes::copy_from_slice(&served.body[at..at + n]);
                at += n;
                b
            })
            .collect();
        async move { Ok::<_, Infallible>(Response::new(Chunks(frames))) }
    });
    let server = tokio::spawn(
        hyper::server::conn::http1::Builder::new()
            .serve_connection(TokioIo::new(server_io), service),
    );
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(client_io))
        .await
        .expect("handshake");
    let client = tokio::spawn(conn);
    let req = Request::get("/apis/coordination.k8s.io/v1/leases?watch=true")
        .header("host", "203.0.113.1")
        .body(http_body_util::Empty::<Bytes>::new())
        .expect("request");
    let res = sender.send_request(req).await.expect("response");
    assert_eq!(res.status(), 200);
    let chunked = res.headers().get("transfer-encoding");
    assert!(
        chunked.is_some_and(|v| v == "chunked") || case.body.is_empty(),
        "a chunked body: {:?}",
        res.headers()
    );
    let mut body = res.into_body();
    let mut got = Vec::new();
    while let Some(frame) = poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
        if let Ok(data) = frame.expect("a body frame").into_data() {
            got.push(data);
        }
    }
    drop(sender);
    let _ = client.await;
    let _ = server.await;
    got
}

/// The frames, each cut again at random points, fed to a [`Candidate`].
fn split_as_fed<S: Splitter>(frames: &[Bytes], max: usize, recut: u64) -> (Vec<Vec<u8>>, End) {
    let mut r = Rng(recut | 1);
    let mut s = S::new(max);
    let mut out = Vec::new();
    for f in frames {
        let mut rest = &f[..];
        while !rest.is_empty() {
            let n = 1 + r.below(rest.len());
            if s.feed(&rest[..n], &mut out).is_err() {
                return (out, End::TooLong);
            }
            rest = &rest[n..];
        }
    }
    (out, End::Body)
}

fn check(seed: u64, i: usize, case: &Case, frames: &[Bytes]) {
    let got: Vec<u8> = frames.concat();
    let shown = || {
        format!(
            "seed {seed} case {i}: max {}, frames {:?}, pipe {}\nbody {:?}",
            case.max,
            case.frames,
            case.pipe,
            String::from_utf8_lossy(&case.body)
        )
    };
    assert!(got == case.body, "hyper changed the bytes: {}", shown());
    let want = reference(&case.body, case.max);
    assert_eq!(reference(&got, case.max), want, "{}", shown());
    let cut = split_as_fed::<Candidate>(frames, case.max, case.recut);
    if cut != want {
        panic!(
            "the splitter disagrees with the reference: {}\nits lines {:?} ({:?})\nthe reference's {:?} ({:?})",
            shown(),
            cut.0.iter().map(|l| String::from_utf8_lossy(l)).collect::<Vec<_>>(),
            cut.1,
            want.0.iter().map(|l| String::from_utf8_lossy(l)).collect::<Vec<_>>(),
            want.1
        );
    }
}

fn env_u64(name: &str, default: u64) -> u64 {
    (std::env::var(name).ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[test]
fn watch_lines_over_hyper_match_the_reference() {
    let seed = env_u64("ARP_GUARD_FUZZ_SEED", 0x5eed_4401);
    let cases = env_u64("ARP_GUARD_FUZZ_CASES", 2_000) as usize;
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let began = Instant::now();
    let mut r = Rng(seed | 1);
    let (mut too_long, mut lines) = (0, 0);
    for i in 0..cases {
        let case = Arc::new(generate(&mut r));
        let frames = rt.block_on(over_the_wire(case.clone()));
        check(seed, i, &case, &frames);
        let (l, end) = reference(&case.body, case.max);
        lines += l.len();
        too_long += usize::from(end == End::TooLong);
    }
    // The generator reaches both endings, and many lines.
    let ended = cases - too_long;
    assert!(
        too_long > cases / 20 && ended > cases / 4,
        "{too_long} of {cases} over the bound"
    );
    assert!(lines > cases, "{lines} lines in {cases} cases");
    eprintln!(
        "{cases} cases (seed {seed:#x}): {lines} lines, {too_long} over the bound, in {:?}",
        began.elapsed()
    );
}

/// The reference on cases written by hand: what the contract says.
#[test]
fn the_reference_says_the_contract() {
    let lines = |b: &[u8], max| {
        let (l, end) = reference(b, max);
        let l: Vec<String> = l
            .iter()
            .map(|x| String::from_utf8_lossy(x).into())
            .collect();
        (l, end)
    };
    assert_eq!(
        lines(b"{\"a\":1}\r\n\n \t\r\n{\"b\":2}\npartial", 64),
        (vec!["{\"a\":1}\r".into(), "{\"b\":2}".into()], End::Body)
    );
    assert_eq!(
        lines(b"12345678\n", 8),
        (vec!["12345678".into()], End::Body)
    );
    assert_eq!(
        lines(b"ok\n123456789\nnot seen\n", 8),
        (vec!["ok".into()], End::TooLong)
    );
    assert_eq!(
        lines(b"ok\n123456789", 8),
        (vec!["ok".into()], End::TooLong)
    );
    assert_eq!(lines(b"", 8), (vec![], End::Body));
    // And the stand-in agrees, byte by byte.
    for body in [&b"a\r\n\nb\n  \nc"[..], b"ok\n123456789\nx\n"] {
        let frames: Vec<Bytes> = body.chunks(1).map(Bytes::copy_from_slice).collect();
        assert_eq!(split_as_fed::<Candidate>(&frames, 8, 7), reference(body, 8));
    }
}
