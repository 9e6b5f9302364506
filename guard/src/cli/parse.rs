//! The parsers of flag values clap does not have: durations and listen
//! addresses.

use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listen {
    Off,
    On(std::net::SocketAddr),
}

impl Listen {
    pub fn addr(self) -> Option<std::net::SocketAddr> {
        match self {
            Listen::On(a) => Some(a),
            Listen::Off => None,
        }
    }
}

pub(super) fn parse_listen(s: &str) -> Result<Listen, String> {
    if s == "none" || s == "off" {
        return Ok(Listen::Off);
    }
    s.parse()
        .map(Listen::On)
        .map_err(|e| format!("`{s}`: {e} (use ADDR:PORT or none)"))
}

/// `500ms`, `5s`, `2m`, `1h 30m` (jiff's friendly format), or a bare
/// number of seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    if let Ok(secs) = s.parse::<u64>() {
        return Ok(Duration::from_secs(secs));
    }
    let d: jiff::SignedDuration = s
        .parse()
        .map_err(|e| format!("`{s}` is not a duration like 500ms, 5s or 2m ({e})"))?;
    Duration::try_from(d).map_err(|e| format!("`{s}`: {e}"))
}
