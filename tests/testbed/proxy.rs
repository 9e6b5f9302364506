//! A forward proxy for the tests, as a laptop's corporate one: HTTP CONNECT
//! and SOCKS5 (no authentication) on one port, in a network namespace,
//! recording the target of every tunnel it opens. It knows names the
//! client cannot resolve (as a corporate proxy knows the inside's): a
//! client that reaches such a server at all went through it. `kubectl
//! arp-guard` must go through it where kubectl would, and not where
//! kubectl would not.

use std::{
    io::{Read, Write},
    net::{Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream},
    sync::{Arc, Mutex},
};

use anyhow::{bail, Context as _, Result};

use crate::Netns;

/// The tunnels opened: (`connect` or `socks5`, the target as asked).
type Seen = Arc<Mutex<Vec<(&'static str, String)>>>;

/// The proxy; its threads end with the test process.
pub struct Proxy {
    pub addr: SocketAddr,
    seen: Seen,
}

/// Host names only the proxy resolves: (name, address).
type Names = Arc<Vec<(String, String)>>;

impl Proxy {
    /// Listen on `addr` (`127.0.0.1:0`: a free port) in `ns`, resolving
    /// `names` (name, address) itself; the tunnels are opened from there.
    pub fn start(ns: &Netns, addr: &str, names: &[(&str, &str)]) -> Result<Proxy> {
        let seen: Seen = Arc::default();
        let (tally, addr) = (seen.clone(), addr.to_owned());
        let names: Names = Arc::new(
            (names.iter())
                .map(|(n, a)| (n.to_string(), a.to_string()))
                .collect(),
        );
        let addr = ns.enter(move || {
            let listener = TcpListener::bind(&addr).with_context(|| format!("binding {addr}"))?;
            let bound = listener.local_addr()?;
            // Threads started here stay in the namespace (they inherit it).
            std::thread::spawn(move || {
                for c in listener.incoming().flatten() {
                    let (tally, names) = (tally.clone(), names.clone());
                    std::thread::spawn(move || {
                        if let Err(e) = serve(c, &tally, &names) {
                            eprintln!("test proxy: {e:#}");
                        }
                    });
                }
            });
            Ok(bound)
        })?;
        Ok(Proxy { addr, seen })
    }

    /// Every tunnel opened so far.
    pub fn tunnels(&self) -> Vec<(&'static str, String)> {
        self.seen.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

/// One client: its protocol told by its first byte (SOCKS5 starts with 5).
fn serve(mut c: TcpStream, seen: &Seen, names: &Names) -> Result<()> {
    let mut first = [0u8; 1];
    c.read_exact(&mut first)?;
    let (kind, target) = if first[0] == 5 {
        ("socks5", socks5(&mut c)?)
    } else {
        ("connect", connect(&mut c, first[0])?)
    };
    let to = match target.rsplit_once(':') {
        Some((host, port)) => match names.iter().find(|(n, _)| n == host) {
            Some((_, addr)) => format!("{addr}:{port}"),
            None => target.clone(),
        },
        None => target.clone(),
    };
    let upstream = TcpStream::connect(&to).with_context(|| format!("connecting {to}"))?;
    if kind == "socks5" {
        // Succeeded; the bound address is not used by clients.
        c.write_all(&[5, 0, 0, 1, 0, 0, 0, 0, 0, 0])?;
    } else {
        c.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")?;
    }
    if let Ok(mut s) = seen.lock() {
        s.push((kind, target));
    }
    pipe(c, upstream)
}

/// The rest of an HTTP CONNECT request head: its `host:port`.
fn connect(c: &mut TcpStream, first: u8) -> Result<String> {
    let mut head = vec![first];
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") && head.len() < 8192 {
        c.read_exact(&mut b)?;
        head.push(b[0]);
    }
    let text = String::from_utf8_lossy(&head);
    let line = text.lines().next().unwrap_or_default();
    match line.split_whitespace().collect::<Vec<_>>()[..] {
        ["CONNECT", target, _] => Ok(target.to_owned()),
        _ => {
            let _ = c.write_all(b"HTTP/1.1 405 Method Not Allowed\r\n\r\n");
            bail!("not a CONNECT: {line:?}")
        }
    }
}

/// A SOCKS5 greeting (no authentication chosen) and CONNECT request after
/// the version byte: its target.
fn socks5(c: &mut TcpStream) -> Result<String> {
    let mut n = [0u8; 1];
    c.read_exact(&mut n)?;
    let mut methods = vec![0u8; n[0] as usize];
    c.read_exact(&mut methods)?;
    c.write_all(&[5, 0])?;
    let mut req = [0u8; 4];
    c.read_exact(&mut req)?;
    if req[..3] != [5, 1, 0] {
        bail!("not a SOCKS5 CONNECT: {req:?}");
    }
    let host = match req[3] {
        1 => {
            let mut a = [0u8; 4];
            c.read_exact(&mut a)?;
            Ipv4Addr::from(a).to_string()
        }
        4 => {
            let mut a = [0u8; 16];
            c.read_exact(&mut a)?;
            format!("[{}]", Ipv6Addr::from(a))
        }
        3 => {
            c.read_exact(&mut n)?;
            let mut name = vec![0u8; n[0] as usize];
            c.read_exact(&mut name)?;
            String::from_utf8_lossy(&name).into_owned()
        }
        t => bail!("SOCKS5 address type {t}"),
    };
    let mut port = [0u8; 2];
    c.read_exact(&mut port)?;
    Ok(format!("{host}:{}", u16::from_be_bytes(port)))
}

/// Both ways until either side ends.
fn pipe(a: TcpStream, b: TcpStream) -> Result<()> {
    let (mut a2, mut b2) = (a.try_clone()?, b.try_clone()?);
    let up = std::thread::spawn(move || {
        let _ = std::io::copy(&mut a2, &mut b2);
        let _ = b2.shutdown(Shutdown::Write);
    });
    let (mut a, mut b) = (a, b);
    let _ = std::io::copy(&mut b, &mut a);
    let _ = a.shutdown(Shutdown::Write);
    let _ = up.join();
    Ok(())
}
