//! The wire: one connection (plain, or TLS over it) counting the bytes
//! written to it, a JSON answer on it, and the percent-decoding of query
//! values.

use std::{
    io::{Read, Write},
    net::TcpStream,
    sync::Arc,
};

use anyhow::Result;
use serde_json::Value;

/// One connection: plain, or TLS over it; with the bytes written to it
/// (before TLS), for the tally.
pub(super) struct Conn {
    io: Io,
    pub(super) written: u64,
}

enum Io {
    Plain(TcpStream),
    Tls(Box<rustls::StreamOwned<rustls::ServerConnection, TcpStream>>),
}

impl Conn {
    /// `stream`, over TLS with `tls` (None: plain).
    pub(super) fn open(stream: TcpStream, tls: Option<Arc<rustls::ServerConfig>>) -> Result<Self> {
        let io = match tls {
            Some(cfg) => Io::Tls(Box::new(rustls::StreamOwned::new(
                rustls::ServerConnection::new(cfg)?,
                stream,
            ))),
            None => Io::Plain(stream),
        };
        Ok(Conn { io, written: 0 })
    }

    pub(super) fn tcp(&self) -> &TcpStream {
        match &self.io {
            Io::Plain(s) => s,
            Io::Tls(s) => &s.sock,
        }
    }
}

impl Read for Conn {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match &mut self.io {
            Io::Plain(s) => s.read(buf),
            Io::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Conn {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = match &mut self.io {
            Io::Plain(s) => s.write(buf),
            Io::Tls(s) => s.write(buf),
        }?;
        self.written += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        match &mut self.io {
            Io::Plain(s) => s.flush(),
            Io::Tls(s) => s.flush(),
        }
    }
}

pub(super) fn respond(out: &mut impl Write, code: u16, body: &Value) -> Result<()> {
    let body = body.to_string();
    out.write_all(
        format!(
            "HTTP/1.1 {code} OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    )?;
    out.flush()?;
    Ok(())
}

/// Percent-decoding of a query value (selectors arrive encoded).
pub(super) fn decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 3 <= b.len() {
            if let Ok(v) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(if b[i] == b'+' { b' ' } else { b[i] });
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}
