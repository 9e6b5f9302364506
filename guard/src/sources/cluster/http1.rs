//! The HTTP/1.1 a watch needs, without I/O: a response's head, and its body
//! (chunked, of a length, or up to the close) as data, cut into lines by
//! [`Lines`]. The watch reads its socket in its own task and hands the
//! bytes here: no connection task and no channel between the socket and
//! the decoder, so a Lease renewal costs a read and a parse.
//!
//! Everything a server sends is bounded: the head, a chunk-size line, the
//! trailer and a line of the body; a number past 16 hex digits is refused.

use std::fmt;

/// Longest response head read.
pub const MAX_HEAD: usize = 64 << 10;
const MAX_HEADERS: usize = 64;
/// Longest chunk-size line (with extensions) and trailer section.
const MAX_SIZE_LINE: usize = 4 << 10;
const MAX_TRAILER: usize = 16 << 10;

/// What a server sent that is not the HTTP/1.1 a watch can read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// The head does not parse.
    Head(String),
    /// No complete head within [`MAX_HEAD`] bytes.
    HeadTooLarge,
    /// A chunk-size line that is not hex, too long, or over 16 digits.
    ChunkSize,
    /// No CRLF after a chunk's data.
    ChunkEnd,
    /// A trailer past [`MAX_TRAILER`].
    TrailerTooLarge,
    /// A body line past the limit [`Lines`] was given.
    LineTooLong(usize),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Head(e) => write!(f, "a response head that does not parse: {e}"),
            Error::HeadTooLarge => write!(f, "a response head longer than {MAX_HEAD} bytes"),
            Error::ChunkSize => write!(f, "a chunk size that is not 1 to 16 hex digits"),
            Error::ChunkEnd => write!(f, "a chunk not followed by CRLF"),
            Error::TrailerTooLarge => write!(f, "a trailer longer than {MAX_TRAILER} bytes"),
            Error::LineTooLong(max) => write!(f, "a watch line longer than {max} bytes"),
        }
    }
}

impl std::error::Error for Error {}

impl From<Error> for std::io::Error {
    fn from(e: Error) -> Self {
        std::io::Error::new(std::io::ErrorKind::InvalidData, e)
    }
}

/// How the body ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    Chunked,
    Length(u64),
    /// At the close of the connection.
    Close,
}

/// A response head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    pub status: u16,
    pub framing: Framing,
    /// The server keeps the connection open after the body (HTTP/1.1
    /// without `Connection: close`).
    pub keep_alive: bool,
}

/// Parse the response head at the start of `buf`: the head and its length,
/// or None while it is incomplete.
pub fn head(buf: &[u8]) -> Result<Option<(Head, usize)>, Error> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut r = httparse::Response::new(&mut headers);
    let n = match r.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) if buf.len() >= MAX_HEAD => return Err(Error::HeadTooLarge),
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => return Err(Error::Head(e.to_string())),
    };
    let status = r.code.unwrap_or(0);
    let mut chunked = false;
    let mut coded = false;
    let mut length = None;
    let mut close = r.version == Some(0);
    for h in r.headers.iter() {
        let v = String::from_utf8_lossy(h.value);
        if h.name.eq_ignore_ascii_case("transfer-encoding") {
            // The last coding decides (RFC 9112 6.3): chunked, else the
            // body runs to the close, whatever a Content-Length says.
            coded = true;
            chunked = v
                .rsplit(',')
                .next()
                .is_some_and(|c| c.trim().eq_ignore_ascii_case("chunked"));
        } else if h.name.eq_ignore_ascii_case("content-length") {
            let l = v.trim().parse::<u64>();
            length = Some(l.map_err(|_| Error::Head(format!("content-length {v:?}")))?);
        } else if h.name.eq_ignore_ascii_case("connection") {
            close |= v.split(',').any(|t| t.trim().eq_ignore_ascii_case("close"));
        }
    }
    let framing = match (chunked, coded, length) {
        (true, _, _) => Framing::Chunked,
        (false, false, Some(l)) => Framing::Length(l),
        (false, _, _) => Framing::Close,
    };
    let keep_alive = !close && framing != Framing::Close;
    Ok(Some((
        Head {
            status,
            framing,
            keep_alive,
        },
        n,
    )))
}

/// Where a chunked body's decoder is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// In a chunk-size line: the size so far, its digits, whether past the
    /// digits (extensions, whitespace), a CR seen (only LF may follow), the
    /// line's length.
    Size {
        size: u64,
        digits: u8,
        past: bool,
        cr: bool,
        len: usize,
    },
    /// In a chunk's data, this much left.
    Data(u64),
    /// After a chunk's data: CR seen or not.
    DataEnd { cr: bool },
    /// After the last chunk: the trailer's length, the current line's.
    Trailer { len: usize, line: usize },
    /// In a body of a length, this much left.
    Length(u64),
    /// Up to the close.
    Close,
    /// The body is over.
    Done,
}

/// One step of a body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Piece {
    /// This many bytes of data start at the offset returned with it; take
    /// them (or fewer) with [`Body::take`].
    Data(usize),
    /// The input is used up.
    More,
    /// The body is over.
    End,
}

/// A body's framing, decoded as bytes arrive.
#[derive(Debug, Clone)]
pub struct Body {
    state: State,
}

const SIZE_START: State = State::Size {
    size: 0,
    digits: 0,
    past: false,
    cr: false,
    len: 0,
};

impl Body {
    pub fn new(framing: Framing) -> Self {
        let state = match framing {
            Framing::Chunked => SIZE_START,
            Framing::Length(0) => State::Done,
            Framing::Length(n) => State::Length(n),
            Framing::Close => State::Close,
        };
        Body { state }
    }

    /// Read framing from `input` up to the next data: (framing bytes
    /// consumed, what follows them).
    pub fn next(&mut self, input: &[u8]) -> Result<(usize, Piece), Error> {
        let mut i = 0;
        loop {
            let data = match self.state {
                State::Done => return Ok((i, Piece::End)),
                State::Data(left) | State::Length(left) => {
                    (input.len() - i).min(usize::try_from(left).unwrap_or(usize::MAX))
                }
                State::Close => input.len() - i,
                _ if i == input.len() => return Ok((i, Piece::More)),
                _ => {
                    self.framing_byte(input[i])?;
                    i += 1;
                    continue;
                }
            };
            let piece = if data == 0 {
                Piece::More
            } else {
                Piece::Data(data)
            };
            return Ok((i, piece));
        }
    }

    /// One byte of framing: a chunk-size line, the CRLF after a chunk's
    /// data, or the trailer.
    fn framing_byte(&mut self, b: u8) -> Result<(), Error> {
        match &mut self.state {
            State::Size {
                size,
                digits,
                past,
                cr,
                len,
            } => {
                *len += 1;
                if *len > MAX_SIZE_LINE {
                    return Err(Error::ChunkSize);
                }
                match b {
                    b'\n' if *digits == 0 => return Err(Error::ChunkSize),
                    b'\n' if *size == 0 => self.state = State::Trailer { len: 0, line: 0 },
                    b'\n' => self.state = State::Data(*size),
                    // A CR ends the line: only its LF may follow.
                    _ if *cr => return Err(Error::ChunkSize),
                    b'\r' => {
                        *cr = true;
                        *past = true;
                    }
                    _ if *past => {}
                    b';' | b' ' | b'\t' => *past = true,
                    _ => {
                        let d = (b as char).to_digit(16).ok_or(Error::ChunkSize)?;
                        if *digits == 16 {
                            return Err(Error::ChunkSize);
                        }
                        *size = (*size << 4) | u64::from(d);
                        *digits += 1;
                    }
                }
            }
            State::DataEnd { cr } => match b {
                b'\r' if !*cr => *cr = true,
                b'\n' => self.state = SIZE_START,
                _ => return Err(Error::ChunkEnd),
            },
            State::Trailer { len, line } => {
                *len += 1;
                if *len > MAX_TRAILER {
                    return Err(Error::TrailerTooLarge);
                }
                match b {
                    b'\n' if *line == 0 => self.state = State::Done,
                    b'\n' => *line = 0,
                    b'\r' => {}
                    _ => *line += 1,
                }
            }
            // Data, a length, the close, the end: no framing bytes.
            State::Data(_) | State::Length(_) | State::Close | State::Done => {}
        }
        Ok(())
    }

    /// `n` bytes of the data [`Body::next`] announced were used.
    pub fn take(&mut self, n: usize) {
        let n = n as u64;
        match &mut self.state {
            State::Data(left) => {
                *left -= n.min(*left);
                if *left == 0 {
                    self.state = State::DataEnd { cr: false };
                }
            }
            State::Length(left) => {
                *left -= n.min(*left);
                if *left == 0 {
                    self.state = State::Done;
                }
            }
            _ => {}
        }
    }

    pub fn done(&self) -> bool {
        self.state == State::Done
    }
}

/// A body cut into lines (without their newline; blank lines skipped).
#[derive(Debug)]
pub struct Lines {
    pub body: Body,
    line: Vec<u8>,
    /// The last step returned a line (cleared before the next).
    full: bool,
    max: usize,
}

/// What a step of [`Lines`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// A line: [`Lines::line`].
    Line,
    /// The input is used up.
    More,
    /// The body is over.
    End,
}

impl Lines {
    pub fn new(framing: Framing, max: usize) -> Self {
        Lines {
            body: Body::new(framing),
            line: Vec::with_capacity(4096),
            full: false,
            max,
        }
    }

    pub fn line(&self) -> &[u8] {
        &self.line
    }

    /// Decode from `input`: (bytes consumed, what was found). Call again
    /// with the rest of the input after a line.
    pub fn step(&mut self, input: &[u8]) -> Result<(usize, Step), Error> {
        if std::mem::take(&mut self.full) {
            self.line.clear();
        }
        let mut i = 0;
        loop {
            let (framing, piece) = self.body.next(&input[i..])?;
            i += framing;
            let avail = match piece {
                Piece::Data(n) => n,
                Piece::More => return Ok((i, Step::More)),
                Piece::End => return Ok((i, Step::End)),
            };
            let data = &input[i..i + avail];
            let (used, newline) = match data.iter().position(|b| *b == b'\n') {
                Some(p) => (p + 1, true),
                None => (avail, false),
            };
            let piece = &data[..used - usize::from(newline)];
            if self.line.len() + piece.len() > self.max {
                return Err(Error::LineTooLong(self.max));
            }
            self.line.extend_from_slice(piece);
            self.body.take(used);
            i += used;
            if newline {
                if self.line.iter().all(u8::is_ascii_whitespace) {
                    self.line.clear();
                    continue;
                }
                self.full = true;
                return Ok((i, Step::Line));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every line of `body`, fed `split` bytes at a time.
    fn lines(framing: Framing, body: &[u8], split: usize) -> Result<(Vec<String>, bool), Error> {
        let mut l = Lines::new(framing, 64);
        let mut out = Vec::new();
        for part in body.chunks(split.max(1)) {
            let mut at = 0;
            loop {
                let (n, step) = l.step(&part[at..])?;
                at += n;
                match step {
                    Step::Line => out.push(String::from_utf8_lossy(l.line()).into_owned()),
                    Step::More => break,
                    Step::End => return Ok((out, true)),
                }
            }
        }
        Ok((out, false))
    }

    const CHUNKED: &[u8] = b"7\r\n{\"a\":1}\r\n9;ext=1\r\n\n{\"b\":2}\n\r\n3\r\n{\"c\r\n4\r\n\":3}\r\n1\r\n\n\r\n0\r\nX-T: 1\r\n\r\n";

    #[test]
    fn a_chunked_body_is_lines_whatever_the_reads() {
        for split in 1..CHUNKED.len() + 1 {
            let (got, ended) = lines(Framing::Chunked, CHUNKED, split).unwrap();
            assert_eq!(
                got,
                vec!["{\"a\":1}", "{\"b\":2}", "{\"c\":3}"],
                "split {split}"
            );
            assert!(ended, "split {split}");
        }
    }

    #[test]
    fn bodies_of_a_length_and_up_to_the_close() {
        let (got, ended) = lines(Framing::Length(8), b"a\nbb\nccXXXX", 3).unwrap();
        assert_eq!((got, ended), (vec!["a".to_owned(), "bb".to_owned()], true));
        let (got, ended) = lines(Framing::Close, b"a\n\n  \nb\nrest", 2).unwrap();
        assert_eq!((got, ended), (vec!["a".to_owned(), "b".to_owned()], false));
    }

    #[test]
    fn hostile_framing_is_an_error_not_memory_or_a_hang() {
        let e = |b: &[u8]| lines(Framing::Chunked, b, 7).unwrap_err();
        // 17 hex digits: no overflow into a small size.
        assert_eq!(e(b"10000000000000005\r\nabcde\r\n"), Error::ChunkSize);
        assert_eq!(e(b"zz\r\n"), Error::ChunkSize);
        assert_eq!(e(b"\r\n"), Error::ChunkSize);
        // A CR inside the size line is its end: "5\rhello" is not a chunk.
        assert_eq!(e(b"5\rhello\r\n"), Error::ChunkSize);
        assert_eq!(e(b"5 \r;x\r\nhello\r\n"), Error::ChunkSize);
        // An endless extension.
        assert_eq!(
            e(&[b"1;".as_slice(), &[b'x'; 5000]].concat()),
            Error::ChunkSize
        );
        assert_eq!(e(b"3\r\nabcXY"), Error::ChunkEnd);
        assert_eq!(
            e(&[b"0\r\n".as_slice(), &[b'x'; 20000]].concat()),
            Error::TrailerTooLarge
        );
        // A line longer than the limit (64 here), across chunks.
        let long = [
            b"28\r\n".as_slice(),
            &[b'x'; 40],
            b"\r\n28\r\n",
            &[b'x'; 40],
            b"\r\n",
        ]
        .concat();
        assert_eq!(e(&long), Error::LineTooLong(64));
        // A huge chunk is streamed, not allocated: its lines come as they arrive.
        let (got, _) = lines(Framing::Chunked, b"ffffffffffff\r\nok\nok\n", 4).unwrap();
        assert_eq!(got, vec!["ok", "ok"]);
    }

    #[test]
    fn heads_parse_with_their_framing() {
        let h = |s: &str| head(s.as_bytes()).unwrap().map(|(h, n)| (h, n == s.len()));
        let chunked = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n";
        assert_eq!(
            h(chunked),
            Some((
                Head {
                    status: 200,
                    framing: Framing::Chunked,
                    keep_alive: true
                },
                true
            ))
        );
        let gone = "HTTP/1.1 410 Gone\r\nContent-Length: 12\r\nConnection: close\r\n\r\n";
        assert_eq!(
            h(gone),
            Some((
                Head {
                    status: 410,
                    framing: Framing::Length(12),
                    keep_alive: false
                },
                true
            ))
        );
        // A coding other than chunked last: up to the close, whatever the
        // length says (RFC 9112 6.3).
        let gzip = "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\nContent-Length: 5\r\n\r\n";
        assert_eq!(h(gzip).unwrap().0.framing, Framing::Close);
        assert!(!h(gzip).unwrap().0.keep_alive);
        let old = "HTTP/1.0 200 OK\r\n\r\n";
        assert_eq!(h(old).unwrap().0.framing, Framing::Close);
        assert_eq!(h("HTTP/1.1 200 OK\r\nContent-"), None, "incomplete");
        assert!(matches!(
            head(b"SSH-2.0-OpenSSH\r\n\r\n"),
            Err(Error::Head(_))
        ));
        let huge = format!("HTTP/1.1 200 OK\r\nX: {}", "y".repeat(MAX_HEAD));
        assert_eq!(head(huge.as_bytes()), Err(Error::HeadTooLarge));
        let bad_len = "HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n";
        assert!(matches!(head(bad_len.as_bytes()), Err(Error::Head(_))));
    }
}
