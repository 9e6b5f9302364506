//! The parsers of flag values clap does not have: durations and listen
//! addresses.

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

/// The duration syntax both command lines take (`kubectl arp-guard` too).
pub use guard_wire::cli::parse_duration;
