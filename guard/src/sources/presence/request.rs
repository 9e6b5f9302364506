//! Presence's requests to the API: bounded in time, their answers
//! decoded, their failures typed (the loop matches on the API's status).

use std::time::Duration;

use serde::Deserialize;

/// Each request gives up after this long.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// Why presence could not start, or a request of a period failed (the
/// loop matches on the API's status: a 409 or 404 is retried once).
#[derive(Debug, thiserror::Error)]
pub enum PresenceError {
    #[error("starting the presence thread: {0}")]
    Thread(std::io::Error),
    #[error("building a request: {0}")]
    Build(kube::core::request::Error),
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    #[error(transparent)]
    Api(#[from] kube::Error),
    /// An answer that is not what was asked for (`what`).
    #[error("{what}: {error}")]
    Decode {
        what: &'static str,
        error: serde_json::Error,
    },
    #[error("the Lease {0} kept changing under this guard")]
    KeptChanging(String),
    /// A list or watch of a followed collection failed (retried with back-off).
    #[error("{0}")]
    Stream(String),
}

impl PresenceError {
    /// The HTTP status of a failed request, if the API answered one.
    pub(super) fn code(&self) -> Option<u16> {
        match self {
            PresenceError::Api(kube::Error::Api(s)) => Some(s.code),
            _ => None,
        }
    }
}

pub(super) type Result<T, E = PresenceError> = std::result::Result<T, E>;

/// Bound a request in time.
pub(super) async fn timed<T>(f: impl std::future::Future<Output = kube::Result<T>>) -> Result<T> {
    match tokio::time::timeout(REQUEST_TIMEOUT, f).await {
        Ok(r) => Ok(r?),
        Err(_) => Err(PresenceError::Timeout(REQUEST_TIMEOUT)),
    }
}

pub(super) fn build(
    r: Result<http::Request<Vec<u8>>, kube::core::request::Error>,
) -> Result<http::Request<Vec<u8>>> {
    r.map_err(PresenceError::Build)
}

/// Decode an answer of the API (`what` it should be).
pub(super) fn decode<'a, T: Deserialize<'a>>(text: &'a str, what: &'static str) -> Result<T> {
    serde_json::from_str(text).map_err(|error| PresenceError::Decode { what, error })
}
