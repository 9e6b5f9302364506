//! The requests the feed makes, with the bodies read by `decode` rather
//! than by kube's typed API: a list page and one object by name over kube's
//! client, a watch as a bounded stream of lines over a connection of its
//! own (`dial`: kube's configuration, credentials and TLS).

use kube::{
    api::{GetParams, ListParams, WatchParams},
    core::Request,
    Client,
};

use tokio::io::{AsyncRead, AsyncReadExt as _};

use super::{
    decode::{self, Obj, Object, Page, WatchLine},
    dial::{Conn, Dialer, READ_BUF},
    http1::{Framing, Lines, Step},
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

/// One page of the collection at `path`; objects the feed does not want
/// ([`Object::wanted`]) are dropped as they are read.
pub async fn list<T: Object>(
    client: &Client,
    path: &str,
    lp: &ListParams,
) -> kube::Result<Page<T>> {
    let req = build(Request::new(path).list(lp))?;
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
    reuse: Option<Conn>,
    path: &str,
    wp: &WatchParams,
    rv: &str,
) -> kube::Result<Watch<Conn>> {
    let mut req = build(Request::new(path).watch(wp, rv))?;
    // One event per line, uncompressed (kube's own watch asks the same).
    req.headers_mut().insert(
        http::header::ACCEPT_ENCODING,
        http::HeaderValue::from_static("identity"),
    );
    let o = dialer.send(req, reuse).await?;
    Ok(Watch::new(
        o.conn,
        &o.rest,
        o.head.framing,
        o.head.keep_alive,
    ))
}

/// An open watch: its connection, read by the stream's own task.
pub struct Watch<R> {
    io: R,
    /// What was read from the connection, `buf[at..len]` not decoded yet.
    buf: Box<[u8]>,
    at: usize,
    len: usize,
    lines: Lines,
    keep_alive: bool,
    /// What the bytes already read hold after the line last returned:
    /// another whole line (`Ok(true)`, in `lines`), the body's end, an
    /// error. None: the next line needs a read.
    ready: Option<std::io::Result<bool>>,
}

/// How reading a watch went.
pub enum Read<T> {
    Line(WatchLine<T>),
    /// The server ended the watch (or the connection ended the way a
    /// long watch's does: closed inside the body, a read timeout).
    End,
    /// Reading failed (a connection reset, a line past [`MAX_LINE`], a
    /// body that is not HTTP/1.1).
    Failed(std::io::Error),
    /// A line that is not a watch event: nothing in it can be trusted.
    Garbled(String),
}

impl<R: AsyncRead + Unpin> Watch<R> {
    /// A watch whose body is framed by `framing`, `rest` of it read already.
    pub fn new(io: R, rest: &[u8], framing: Framing, keep_alive: bool) -> Self {
        let mut buf = vec![0; READ_BUF.max(rest.len())].into_boxed_slice();
        buf[..rest.len()].copy_from_slice(rest);
        Watch {
            io,
            buf,
            at: 0,
            len: rest.len(),
            lines: Lines::new(framing, MAX_LINE),
            keep_alive,
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
            Ok(true) => {
                let l = decode::watch_line(self.lines.line());
                self.peek();
                match l {
                    Ok(l) => Read::Line(l),
                    Err(e) => Read::Garbled(e),
                }
            }
            Ok(false) => Read::End,
            Err(e) if resumable(&e) => Read::End,
            Err(e) => Read::Failed(e),
        }
    }

    /// Another whole line is read already: the event just returned is not
    /// the last of this read (the feed publishes once per read, not per
    /// event: a burst is one view).
    pub fn more_ready(&self) -> bool {
        matches!(self.ready, Some(Ok(true)))
    }

    /// Decode what the bytes already read hold next, without reading.
    fn peek(&mut self) {
        match self.lines.step(&self.buf[self.at..self.len]) {
            Ok((n, Step::More)) => self.at += n,
            Ok((n, step)) => {
                self.at += n;
                self.ready = Some(Ok(step == Step::Line));
            }
            Err(e) => self.ready = Some(Err(e.into())),
        }
    }

    /// Decode up to the next line, reading when what was read is used up;
    /// false at the end of the body, or of the connection (a partial last
    /// line is dropped, as kube does).
    async fn read_line(&mut self) -> std::io::Result<bool> {
        loop {
            let (n, step) = self.lines.step(&self.buf[self.at..self.len])?;
            self.at += n;
            match step {
                Step::Line => return Ok(true),
                Step::End => return Ok(false),
                Step::More => {}
            }
            self.at = 0;
            self.len = 0;
            self.len = self.io.read(&mut self.buf).await?;
            if self.len == 0 {
                self.keep_alive = false;
                return Ok(false);
            }
        }
    }

    /// The connection, for the next request: the body ended where the
    /// server said it would, nothing followed, and the server keeps it.
    pub fn into_reusable(self) -> Option<R> {
        (self.keep_alive && self.lines.body.done() && self.at == self.len).then_some(self.io)
    }
}

/// A read error that ends a watch the way kube's own watch treats it: a
/// read timeout, or an unexpected EOF (a long watch cut by a proxy or the
/// server, a TLS session closed without its close_notify); it is resumed
/// from its resourceVersion.
fn resumable(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::TimedOut | std::io::ErrorKind::UnexpectedEof
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A watch whose body runs to the close.
    fn watch_of(bytes: &'static [u8]) -> Watch<&'static [u8]> {
        Watch::new(bytes, b"", Framing::Close, false)
    }

    #[tokio::test]
    async fn lines_are_read_one_event_at_a_time() {
        let mut w = watch_of(
            b"{\"type\":\"BOOKMARK\",\"object\":{\"metadata\":{\"resourceVersion\":\"3\"}}}\n\n\
              {\"type\":\"DELETED\",\"object\":{\"metadata\":{\"name\":\"a\"}}}\n{\"type\":\"ADD",
        );
        assert!(matches!(
            w.next::<decode::Lease>().await,
            Read::Line(WatchLine::Bookmark(Some(_)))
        ));
        assert!(matches!(
            w.next::<decode::Lease>().await,
            Read::Line(WatchLine::Deleted(Obj::Good(_)))
        ));
        assert!(
            matches!(w.next::<decode::Lease>().await, Read::End),
            "partial line dropped"
        );
    }

    #[tokio::test]
    async fn an_endless_line_is_an_error_not_unbounded_memory() {
        let big: &'static [u8] = Box::leak(vec![b'x'; MAX_LINE + 10].into_boxed_slice());
        let mut w = watch_of(big);
        assert!(
            matches!(w.next::<decode::Lease>().await, Read::Failed(e) if e.to_string().contains("longer than"))
        );
    }

    /// A connection that hands out its bytes in the given pieces, one per
    /// read, then EOF.
    struct Pieces(std::collections::VecDeque<&'static [u8]>);

    impl AsyncRead for Pieces {
        fn poll_read(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
            buf: &mut tokio::io::ReadBuf<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            if let Some(p) = self.0.pop_front() {
                buf.put_slice(p);
            }
            std::task::Poll::Ready(Ok(()))
        }
    }

    fn chunked(pieces: &[&'static [u8]]) -> Watch<Pieces> {
        Watch::new(
            Pieces(pieces.iter().copied().collect()),
            b"",
            Framing::Chunked,
            true,
        )
    }

    const BOOKMARK: &[u8] =
        b"{\"type\":\"BOOKMARK\",\"object\":{\"metadata\":{\"resourceVersion\":\"3\"}}}\n";

    fn chunk(line: &[u8]) -> &'static [u8] {
        let framed = [format!("{:x}\r\n", line.len()).as_bytes(), line, b"\r\n"].concat();
        Box::leak(framed.into_boxed_slice())
    }

    /// Events read together are told apart from the last of their read, so
    /// that the feed publishes a burst once; a watch that ended where its
    /// server said gives its connection back, one cut short or followed by
    /// stray bytes does not.
    #[tokio::test]
    async fn a_chunked_watch_tells_its_bursts_and_whether_its_connection_can_be_kept() {
        let two = [chunk(BOOKMARK), chunk(BOOKMARK)].concat().leak();
        let mut w = chunked(&[two, chunk(BOOKMARK), b"0\r\n\r\n"]);
        assert!(matches!(w.next::<decode::Lease>().await, Read::Line(_)));
        assert!(w.more_ready(), "a second event came in the same read");
        assert!(matches!(w.next::<decode::Lease>().await, Read::Line(_)));
        assert!(!w.more_ready(), "the last of its read");
        assert!(matches!(w.next::<decode::Lease>().await, Read::Line(_)));
        assert!(!w.more_ready());
        assert!(matches!(w.next::<decode::Lease>().await, Read::End));
        assert!(w.into_reusable().is_some(), "ended by its last chunk");

        let mut w = chunked(&[chunk(BOOKMARK), b"0\r\n\r\nHTTP/1.1 200"]);
        assert!(matches!(w.next::<decode::Lease>().await, Read::Line(_)));
        assert!(matches!(w.next::<decode::Lease>().await, Read::End));
        assert!(w.into_reusable().is_none(), "bytes after the body");

        let mut w = chunked(&[chunk(BOOKMARK), b"40\r\n{\"type\""]);
        assert!(matches!(w.next::<decode::Lease>().await, Read::Line(_)));
        assert!(
            matches!(w.next::<decode::Lease>().await, Read::End),
            "cut mid-chunk: resumed"
        );
        assert!(w.into_reusable().is_none(), "cut short");

        // A framing error right behind an event is told after it.
        let mut w = chunked(&[[chunk(BOOKMARK), b"zz\r\n"].concat().leak()]);
        assert!(matches!(w.next::<decode::Lease>().await, Read::Line(_)));
        assert!(!w.more_ready());
        assert!(matches!(w.next::<decode::Lease>().await, Read::Failed(_)));
    }
}
