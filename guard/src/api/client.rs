//! The CLI's side of the API: GET a path from the daemon (hyper's HTTP/1.1
//! client), whole or as a stream of lines.

use std::{net::SocketAddr, time::Duration};

use anyhow::{Context as _, Result};
use bytes::Bytes;
use http_body_util::{BodyExt as _, Empty};
use hyper::{header, Request};
use hyper_util::rt::TokioIo;

/// How long a whole answer may take (a stuck daemon must not hang the CLI).
const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);

async fn request(addr: SocketAddr, path: &str) -> Result<hyper::Response<hyper::body::Incoming>> {
    let no_daemon = || {
        format!(
            "no arp-guard daemon answers on {addr}: is it running, and with this --listen address (--api)?"
        )
    };
    let tcp = tokio::time::timeout(Duration::from_secs(2), tokio::net::TcpStream::connect(addr))
        .await
        .map_err(|_| anyhow::anyhow!("connect timed out"))
        .with_context(no_daemon)?
        .with_context(no_daemon)?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .context("HTTP handshake with the daemon")?;
    tokio::spawn(conn);
    let req = Request::get(path)
        .header(header::HOST, addr.to_string())
        .body(Empty::<Bytes>::new())
        .context("building the request")?;
    sender
        .send_request(req)
        .await
        .with_context(|| format!("GET {path} from {addr}"))
}

/// GET `path`: (status code, body).
pub async fn get(addr: SocketAddr, path: &str) -> Result<(u16, String)> {
    tokio::time::timeout(ANSWER_TIMEOUT, async {
        let resp = request(addr, path).await?;
        let code = resp.status().as_u16();
        let body = resp
            .into_body()
            .collect()
            .await
            .context("reading the daemon's answer")?
            .to_bytes();
        Ok((code, String::from_utf8_lossy(&body).into_owned()))
    })
    .await
    .map_err(|_| {
        anyhow::anyhow!("the daemon on {addr} did not answer GET {path} within {ANSWER_TIMEOUT:?}")
    })?
}

/// GET `path` from a thread with no runtime (tests, one-shot tools).
#[cfg(feature = "testing")]
pub fn get_blocking(addr: SocketAddr, path: &str) -> Result<(u16, String)> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting a runtime")?
        .block_on(get(addr, path))
}

/// GET `path` and hand each complete line to `each` as it arrives (for
/// `/events`, which lasts as long as the reader wants). Returns the status
/// code, with the body of an error answer.
pub async fn stream_lines(
    addr: SocketAddr,
    path: &str,
    mut each: impl FnMut(&str),
) -> Result<(u16, String)> {
    let resp = tokio::time::timeout(ANSWER_TIMEOUT, request(addr, path))
        .await
        .map_err(|_| anyhow::anyhow!("the daemon on {addr} did not answer GET {path}"))??;
    let code = resp.status().as_u16();
    let mut body = resp.into_body();
    let mut pending = Vec::new();
    let mut error_body = String::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.context("reading the stream")?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        if code != 200 {
            error_body.push_str(&String::from_utf8_lossy(&data));
            continue;
        }
        pending.extend_from_slice(&data);
        while let Some(nl) = pending.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = pending.drain(..=nl).collect();
            each(String::from_utf8_lossy(&line).trim_end());
        }
    }
    Ok((code, error_body))
}
