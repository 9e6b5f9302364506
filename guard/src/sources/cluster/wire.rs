//! The requests the feed makes, with the bodies read by `decode` rather
//! than by kube's typed API: a list page and one object by name over kube's
//! client, a watch as a bounded stream of lines over a connection of its
//! own (`dial`: kube's configuration, credentials and TLS).

use kube::{
    api::{GetParams, WatchParams},
    core::Request,
    Client,
};

use bytes::{Bytes, BytesMut};
use futures::FutureExt as _;
use http_body_util::BodyExt as _;
use hyper::body::Incoming;
use tokio_util::codec::{AnyDelimiterCodec, Decoder as _};
use tracing::Instrument as _;

use super::{
    decode::{self, Obj, Object, Page, WatchLine},
    dial::{Dialer, Link},
};

/// Longest watch line read (one event: the API server refuses objects over
/// about 1.5 MiB, a watch event wraps one): a server that sends more
/// without a newline is not followed into unbounded memory.
pub const MAX_LINE: usize = 8 << 20;

fn build(
    r: Result<http::Request<Vec<u8>>, kube::core::request::Error>,
) -> kube::Result<http::Request<Vec<u8>>> {
    r.map_err(kube::Error::BuildRequest)
}

/// One page of a list (`req`, built by `listwatch`); objects the feed does
/// not want ([`Object::wanted`]) are dropped as they are read.
pub async fn list<T: Object>(
    client: &Client,
    req: http::Request<Vec<u8>>,
) -> kube::Result<Page<T>> {
    let text = client.request_text(req).await?;
    decode::page(&text, T::wanted).map_err(kube::Error::SerdeError)
}

/// One object of the collection at `path` by name (None: 404); `cached`:
/// as the API server's cache has it (`resourceVersion=0`), else current.
pub async fn get<T: Object>(
    client: &Client,
    path: &str,
    name: &str,
    cached: bool,
) -> kube::Result<Option<Obj<T>>> {
    let gp = if cached {
        GetParams::any()
    } else {
        GetParams::default()
    };
    let req = build(Request::new(path).get(name, &gp))?;
    match client.request_text(req).await {
        Ok(text) => Ok(Some(decode::decode(&text))),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(None),
        Err(e) => Err(e),
    }
}

/// A watch of the collection at `path` from `rv`, open on `reuse` (the
/// connection of the last watch) or a new connection: read it with
/// [`Watch::next`].
pub async fn watch(
    dialer: &Dialer,
    reuse: Option<Link>,
    path: &str,
    wp: &WatchParams,
    rv: &str,
) -> kube::Result<Watch> {
    let mut req = build(Request::new(path).watch(wp, rv))?;
    // One event per line, uncompressed (kube's own watch asks the same).
    req.headers_mut().insert(
        http::header::ACCEPT_ENCODING,
        http::HeaderValue::from_static("identity"),
    );
    let span = tracing::debug_span!("watch", path, rv);
    let (resp, link) = dialer.send(req, reuse).instrument(span).await?;
    Ok(Watch::new(link, resp.into_body()))
}

/// An open watch: its body, read by the stream's own task, which drives
/// the connection while it waits for the next frame.
pub struct Watch {
    link: Link,
    body: Incoming,
    /// What was read and not returned yet.
    lines: Lines,
    /// The body ended where the server said it would.
    done: bool,
    /// What the bytes already read hold after the line last returned:
    /// another whole line, the body's end, an error. None: the next line
    /// needs a read.
    ready: Option<std::io::Result<Option<Bytes>>>,
}

/// How reading a watch went.
#[derive(Debug)]
pub enum Read<T> {
    Line(WatchLine<T>),
    /// The server ended the watch: the body's last chunk.
    End,
    /// The connection ended inside the body, cleanly (a FIN, a TLS session
    /// closed without its close_notify: a long watch cut by a proxy or the
    /// server): resumed from its resourceVersion, as kube's own watch does,
    /// but no sign that the server is alive.
    Cut,
    /// Reading failed (a reset, a body that is not HTTP/1.1, a line past
    /// [`MAX_LINE`]).
    Failed(std::io::Error),
    /// The connection went silent and the kernel's keepalive gave up on
    /// it: nothing came for [`super::dial::KEEPALIVE_DEAD`].
    Silent(std::io::Error),
    /// A line that is not a watch event: nothing in it can be trusted.
    Garbled(String),
}

impl Watch {
    fn new(link: Link, body: Incoming) -> Self {
        Watch {
            link,
            body,
            lines: Lines::new(MAX_LINE),
            done: false,
            ready: None,
        }
    }

    /// The next event.
    pub async fn next<T: Object>(&mut self) -> Read<T> {
        let read = match self.ready.take() {
            Some(r) => r,
            None => self.read_line().await,
        };
        match read {
            Ok(Some(line)) => {
                let l = decode::watch_line(&line);
                self.peek();
                match l {
                    Ok(l) => Read::Line(l),
                    Err(e) => Read::Garbled(e),
                }
            }
            Ok(None) => Read::End,
            Err(e) => match e.kind() {
                std::io::ErrorKind::UnexpectedEof => Read::Cut,
                std::io::ErrorKind::TimedOut => Read::Silent(e),
                _ => Read::Failed(e),
            },
        }
    }

    /// Another whole line is read already: the event just returned is not
    /// the last of this read (the feed publishes once per read, not per
    /// event: a burst is one view).
    pub fn more_ready(&self) -> bool {
        matches!(self.ready, Some(Ok(Some(_))))
    }

    /// What the connection holds already after the line just returned:
    /// frames hyper has read are taken without waiting (a burst of events
    /// arrives as many chunks in one read), up to the next whole line.
    fn peek(&mut self) {
        loop {
            match self.lines.take() {
                Ok(Some(l)) => return self.ready = Some(Ok(Some(l))),
                Ok(None) if self.done => return self.ready = Some(Ok(None)),
                Ok(None) => {}
                Err(e) => return self.ready = Some(Err(e)),
            }
            let frame = self.link.drive(self.body.frame()).now_or_never();
            match frame {
                None => return,
                Some(f) => {
                    if let Err(e) = self.take(f) {
                        return self.ready = Some(Err(e));
                    }
                }
            }
        }
    }

    /// Up to the next line, reading when what was read is used up; None at
    /// the end of the body (a partial last line is dropped, as kube does).
    async fn read_line(&mut self) -> std::io::Result<Option<Bytes>> {
        loop {
            if let Some(l) = self.lines.take()? {
                return Ok(Some(l));
            }
            if self.done {
                return Ok(None);
            }
            let f = self.link.drive(self.body.frame()).await;
            self.take(f)?;
        }
    }

    /// A frame of the body: its data kept, its end noted, its error told.
    fn take(
        &mut self,
        f: Option<Result<hyper::body::Frame<Bytes>, hyper::Error>>,
    ) -> std::io::Result<()> {
        match f {
            None => self.done = true,
            Some(Ok(f)) => {
                if let Ok(data) = f.into_data() {
                    self.lines.push(&data);
                }
            }
            Some(Err(e)) => return Err(io_error(e)),
        }
        Ok(())
    }

    /// The connection, for the next request: the body ended where the
    /// server said it would, nothing was left unread, and the server keeps
    /// it.
    pub fn into_reusable(self) -> Option<Link> {
        (self.done && self.lines.is_empty() && self.link.reusable()).then_some(self.link)
    }
}

/// A watch body's lines, as the frames of its body bring them: cut at each
/// LF (a CR before it is the JSON's whitespace), blank lines skipped, a line
/// longer than the bound an error (the rest of it is not kept). The cutting
/// is tokio-util's; what is kept and what is refused is the guard's.
pub struct Lines {
    buf: BytesMut,
    codec: AnyDelimiterCodec,
}

impl Lines {
    /// Lines of at most `max` bytes.
    pub fn new(max: usize) -> Self {
        Lines {
            buf: BytesMut::new(),
            codec: AnyDelimiterCodec::new_with_max_length(b"\n".to_vec(), Vec::new(), max),
        }
    }

    /// Bytes of the body, as they came.
    pub fn push(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
    }

    /// The next whole line, if one was pushed.
    pub fn take(&mut self) -> std::io::Result<Option<Bytes>> {
        loop {
            match self.codec.decode(&mut self.buf) {
                Ok(Some(l)) if l.trim_ascii().is_empty() => continue,
                Ok(l) => return Ok(l),
                Err(_) => {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        format!(
                            "a watch event longer than {} bytes",
                            self.codec.max_length()
                        ),
                    ))
                }
            }
        }
    }

    /// Nothing pushed is left (not even part of a line).
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }
}

/// A body's error as an I/O error of the kind it comes down to: the
/// socket's own (a reset, a keepalive timeout, a TLS session closed
/// without its close_notify), an end inside the body (UnexpectedEof), or
/// bytes that are not HTTP/1.1 (InvalidData).
fn io_error(e: hyper::Error) -> std::io::Error {
    use std::io::ErrorKind;
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            return std::io::Error::new(io.kind(), e);
        }
        source = s.source();
    }
    let kind = if e.is_incomplete_message() {
        ErrorKind::UnexpectedEof
    } else if e.is_timeout() {
        ErrorKind::TimedOut
    } else if e.is_parse() {
        ErrorKind::InvalidData
    } else {
        ErrorKind::Other
    };
    std::io::Error::new(kind, e)
}

#[cfg(test)]
mod tests {
    use std::sync::{
        atomic::{AtomicUsize, Ordering::SeqCst},
        Arc,
    };
    use std::time::Duration;

    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    use super::*;

    /// A reply that holds the connection open, silent.
    const HOLD: &[u8] = b"HOLD";
    /// A reply that closes the connection a moment after the request, unanswered.
    const CLOSE: &[u8] = b"CLOSE";

    /// A server on loopback: on each connection, each request (its head
    /// read to the blank line) is answered with the next of `replies`
    /// (then the connection is closed); counts the connections.
    async fn server(replies: Vec<&'static [u8]>) -> (Dialer, Arc<AtomicUsize>) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", l.local_addr().unwrap());
        let count = Arc::new(AtomicUsize::new(0));
        let c = count.clone();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                c.fetch_add(1, SeqCst);
                let replies = replies.clone();
                tokio::spawn(async move {
                    for reply in replies {
                        let mut head = Vec::new();
                        let mut b = [0u8; 1];
                        while !head.ends_with(b"\r\n\r\n") {
                            if s.read(&mut b).await.unwrap_or(0) == 0 {
                                return;
                            }
                            head.push(b[0]);
                        }
                        if reply == HOLD {
                            tokio::time::sleep(Duration::from_secs(3600)).await;
                        }
                        if reply == CLOSE {
                            tokio::time::sleep(Duration::from_millis(200)).await;
                            return;
                        }
                        if s.write_all(reply).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        let config = kube::Config::new(url.parse().unwrap());
        (Dialer::new(&config).unwrap(), count)
    }

    const BOOKMARK: &[u8] =
        b"{\"type\":\"BOOKMARK\",\"object\":{\"metadata\":{\"resourceVersion\":\"3\"}}}\n";
    const HEAD: &str =
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n";

    fn chunk(line: &[u8]) -> Vec<u8> {
        [format!("{:x}\r\n", line.len()).as_bytes(), line, b"\r\n"].concat()
    }

    /// A chunked watch response of these chunks, then `tail`.
    fn reply(chunks: &[&[u8]], tail: &[u8]) -> &'static [u8] {
        let mut out = HEAD.as_bytes().to_vec();
        for c in chunks {
            out.extend(chunk(c));
        }
        out.extend_from_slice(tail);
        out.leak()
    }

    async fn open(d: &Dialer, reuse: Option<Link>) -> kube::Result<Watch> {
        let wp = WatchParams::default().timeout(300);
        watch(d, reuse, "/api/v1/services", &wp, "1").await
    }

    type L = decode::Lease;

    #[tokio::test]
    async fn lines_are_read_one_event_at_a_time_whatever_the_chunks() {
        // Two events split across three chunks, a blank line, a partial
        // last line the end of the body drops.
        let deleted = b"{\"type\":\"DELETED\",\"object\":{\"metadata\":{\"name\":\"a\"}}}\n";
        let (first, second) = deleted.split_at(20);
        let body = [
            &BOOKMARK[..30],
            &[&BOOKMARK[30..], b"\n", first].concat()[..],
            second,
            b"{\"type\":\"ADD",
        ];
        let (d, _) = server(vec![reply(&body, b"0\r\n\r\n")]).await;
        let mut w = open(&d, None).await.unwrap();
        assert!(matches!(
            w.next::<L>().await,
            Read::Line(WatchLine::Bookmark(Some(_)))
        ));
        assert!(matches!(
            w.next::<L>().await,
            Read::Line(WatchLine::Deleted(Obj::Good(_)))
        ));
        assert!(
            matches!(w.next::<L>().await, Read::End),
            "partial line dropped"
        );
    }

    #[tokio::test]
    async fn an_endless_line_is_an_error_not_unbounded_memory() {
        let big: Vec<u8> = vec![b'x'; MAX_LINE + 10];
        let (d, _) = server(vec![reply(&[&big], b"0\r\n\r\n")]).await;
        let mut w = open(&d, None).await.unwrap();
        assert!(
            matches!(w.next::<L>().await, Read::Failed(e) if e.to_string().contains("longer than"))
        );
    }

    /// Events written together are told apart from the last of their
    /// read, so that the feed publishes a burst once; a watch that ended
    /// where its server said gives its connection to the next watch.
    #[tokio::test]
    async fn a_burst_is_told_and_the_connection_kept_for_the_next_watch() {
        let (d, count) = server(vec![
            reply(&[BOOKMARK, BOOKMARK], b"0\r\n\r\n"),
            reply(&[BOOKMARK], b"0\r\n\r\n"),
        ])
        .await;
        let mut w = open(&d, None).await.unwrap();
        assert!(matches!(w.next::<L>().await, Read::Line(_)));
        assert!(w.more_ready(), "a second event came with the first");
        assert!(matches!(w.next::<L>().await, Read::Line(_)));
        assert!(!w.more_ready(), "the last of its read");
        assert!(matches!(w.next::<L>().await, Read::End));
        let kept = w.into_reusable().expect("ended by its last chunk");
        let mut w = open(&d, Some(kept)).await.unwrap();
        assert!(matches!(w.next::<L>().await, Read::Line(_)));
        assert!(matches!(w.next::<L>().await, Read::End));
        assert_eq!(count.load(SeqCst), 1, "one connection for both watches");
    }

    /// A watch cut inside its body is resumed, not failed; its connection
    /// is not kept. A body that is not HTTP/1.1 chunking is a failure, told
    /// after the event before it.
    #[tokio::test]
    async fn a_cut_watch_is_resumable_and_a_bad_body_a_failure() {
        let (d, _) = server(vec![reply(&[BOOKMARK], b"40\r\n{\"type\"")]).await;
        let mut w = open(&d, None).await.unwrap();
        assert!(matches!(w.next::<L>().await, Read::Line(_)));
        assert!(matches!(w.next::<L>().await, Read::Cut), "cut mid-chunk");
        assert!(w.into_reusable().is_none());

        let (d, _) = server(vec![reply(&[BOOKMARK], b"zz\r\n")]).await;
        let mut w = open(&d, None).await.unwrap();
        assert!(matches!(w.next::<L>().await, Read::Line(_)));
        assert!(matches!(w.next::<L>().await, Read::Failed(_)));
        // A size line ended by a bare LF: hyper refuses what the hand
        // decoder took.
        let (d, _) = server(vec![reply(&[BOOKMARK], b"5\nab")]).await;
        let mut w = open(&d, None).await.unwrap();
        assert!(matches!(w.next::<L>().await, Read::Line(_)));
        assert!(matches!(w.next::<L>().await, Read::Failed(_)));
    }

    /// A 1xx before the answer is skipped (hyper), not taken as the answer.
    #[tokio::test]
    async fn an_informational_answer_is_skipped() {
        let mut r = b"HTTP/1.1 102 Processing\r\n\r\n".to_vec();
        r.extend_from_slice(reply(&[BOOKMARK], b"0\r\n\r\n"));
        let (d, _) = server(vec![r.leak()]).await;
        let mut w = open(&d, None).await.unwrap();
        assert!(matches!(
            w.next::<L>().await,
            Read::Line(WatchLine::Bookmark(_))
        ));
    }

    /// An error status is the API's error, as kube's client reports it; a
    /// 429's Retry-After is kept for the back-off.
    #[tokio::test]
    async fn an_error_status_is_the_api_s_error() {
        let gone = b"HTTP/1.1 410 Gone\r\nTransfer-Encoding: chunked\r\n\r\n\
            2c\r\n{\"kind\":\"Status\",\"code\":410,\"message\":\"old\"}\r\n0\r\n\r\n";
        let html = b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 11\r\n\r\n<html>x</h>";
        let busy =
            b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 7\r\nContent-Length: 4\r\n\r\nbusy";
        for (reply, code, message, after) in [
            (&gone[..], 410, "old", 0),
            (&html[..], 502, "<html>x</h>", 0),
            (&busy[..], 429, "busy", 7),
        ] {
            let (d, _) = server(vec![reply]).await;
            match open(&d, None).await {
                Err(kube::Error::Api(s)) => {
                    assert_eq!((s.code, s.message.as_str()), (code, message));
                    let got = s.details.as_ref().map_or(0, |d| d.retry_after_seconds);
                    assert_eq!(got, after);
                }
                Err(e) => panic!("{code}: {e}"),
                Ok(_) => panic!("{code}: not an error"),
            }
        }
    }

    /// A kept connection the server closed, or one that went silent, costs
    /// one fresh connection, not a failed watch nor the stream's idle
    /// deadline; a fresh connection's error is the error.
    #[tokio::test]
    async fn a_dead_kept_connection_is_replaced_by_a_fresh_one() {
        // Each connection answers one watch, then closes when asked again:
        // the kept connection fails the next request, which is sent anew.
        let (d, count) = server(vec![reply(&[BOOKMARK], b"0\r\n\r\n"), CLOSE]).await;
        let mut w = open(&d, None).await.unwrap();
        while !matches!(w.next::<L>().await, Read::End) {}
        let kept = w.into_reusable().expect("ended cleanly");
        tokio::time::sleep(Duration::from_millis(400)).await;
        let mut w = open(&d, Some(kept)).await.unwrap();
        assert!(matches!(w.next::<L>().await, Read::Line(_)));
        assert_eq!(count.load(SeqCst), 2, "the closed one replaced");
        // Silent: the kept connection never answers the next request.
        let (silent, _) = server(vec![reply(&[BOOKMARK], b"0\r\n\r\n"), HOLD]).await;
        let mut w = open(&silent, None).await.unwrap();
        while !matches!(w.next::<L>().await, Read::End) {}
        let kept = w.into_reusable().unwrap();
        let t = std::time::Instant::now();
        let w = open(&d, Some(kept)).await;
        assert!(w.is_ok());
        assert!(t.elapsed() < Duration::from_secs(7), "{:?}", t.elapsed());
        // A server that closes a fresh connection at once: an error.
        let (d, _) = server(vec![b""]).await;
        assert!(open(&d, None).await.is_err());
    }
}
