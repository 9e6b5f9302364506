//! The requests the feed makes, over kube's client (its configuration,
//! credentials and TLS), with the bodies read by `decode` rather than by
//! kube's typed API: a list page, a watch as a bounded stream of lines, one
//! object by name.

use futures::{AsyncBufRead, AsyncBufReadExt as _};
use kube::{
    api::{GetParams, ListParams, WatchParams},
    core::Request,
    Client,
};

use super::decode::{self, Obj, Object, Page, WatchLine};

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

/// A watch of the collection at `path` from `rv`, open: read it with
/// [`Watch::next`].
pub async fn watch(
    client: &Client,
    path: &str,
    wp: &WatchParams,
    rv: &str,
) -> kube::Result<Watch<impl AsyncBufRead>> {
    let mut req = build(Request::new(path).watch(wp, rv))?;
    // One event per line, uncompressed (kube's own watch asks the same).
    req.headers_mut().insert(
        http::header::ACCEPT_ENCODING,
        http::HeaderValue::from_static("identity"),
    );
    let body = client.request_stream(req).await?;
    Ok(Watch {
        body: Box::pin(body),
        line: Vec::with_capacity(4096),
    })
}

/// An open watch.
pub struct Watch<R> {
    body: std::pin::Pin<Box<R>>,
    /// Reused for every line.
    line: Vec<u8>,
}

/// How reading a watch went.
pub enum Read<T> {
    Line(WatchLine<T>),
    /// The server ended the watch (or the connection ended the way a
    /// long watch's does: an EOF inside a chunk, a client read timeout).
    End,
    /// Reading failed (a connection reset, a line past [`MAX_LINE`]).
    Failed(std::io::Error),
    /// A line that is not a watch event: nothing in it can be trusted.
    Garbled(String),
}

impl<R: AsyncBufRead> Watch<R> {
    /// The next event.
    pub async fn next<T: Object>(&mut self) -> Read<T> {
        match self.read_line().await {
            Ok(true) => match decode::watch_line(&self.line) {
                Ok(l) => Read::Line(l),
                Err(e) => Read::Garbled(e),
            },
            Ok(false) => Read::End,
            Err(e) if resumable(&e) => Read::End,
            Err(e) => Read::Failed(e),
        }
    }

    /// Read one line (without its newline) into `self.line`; false at the
    /// end of the stream (a partial last line is dropped, as kube does).
    async fn read_line(&mut self) -> std::io::Result<bool> {
        self.line.clear();
        loop {
            let chunk = self.body.fill_buf().await?;
            if chunk.is_empty() {
                return Ok(false);
            }
            if let Some(i) = chunk.iter().position(|b| *b == b'\n') {
                self.line.extend_from_slice(&chunk[..i]);
                self.body.consume_unpin(i + 1);
                if self.line.iter().all(u8::is_ascii_whitespace) {
                    self.line.clear();
                    continue;
                }
                return Ok(true);
            }
            let n = chunk.len();
            self.line.extend_from_slice(chunk);
            self.body.consume_unpin(n);
            if self.line.len() > MAX_LINE {
                return Err(std::io::Error::other(format!(
                    "a watch line longer than {MAX_LINE} bytes"
                )));
            }
        }
    }
}

/// A read error that ends a watch the way kube's own watch treats it: a
/// client read timeout, or an unexpected EOF (a long watch cut by a proxy
/// or the server); it is resumed from its resourceVersion.
fn resumable(e: &std::io::Error) -> bool {
    if e.kind() == std::io::ErrorKind::TimedOut || e.to_string().contains("unexpected EOF") {
        return true;
    }
    let mut cur = e.get_ref().map(|e| e as &(dyn std::error::Error + 'static));
    for _ in 0..16 {
        let Some(err) = cur else { return false };
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            if io.kind() == std::io::ErrorKind::UnexpectedEof {
                return true;
            }
        }
        if err.to_string().contains("unexpected EOF during chunk") {
            return true;
        }
        cur = err.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn watch_of(bytes: &'static [u8]) -> Watch<futures::io::Cursor<&'static [u8]>> {
        Watch {
            body: Box::pin(futures::io::Cursor::new(bytes)),
            line: Vec::new(),
        }
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
}
