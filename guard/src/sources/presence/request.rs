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

/// A list request served from the API server's watch cache:
/// `resourceVersion=0` with `resourceVersionMatch=NotOlderThan`, and a page
/// size, which servers that page from their cache honour and older ones
/// ignore (the whole list in one answer). Built here because kube's
/// `ListParams` drops `resourceVersion=0` when a limit is set, and a list
/// without a resourceVersion is a quorum read of etcd. A continuation
/// carries no version (it reads the snapshot its first page started).
pub(super) fn cached_list(
    path: &str,
    labels: Option<&str>,
    limit: u32,
    cont: Option<&str>,
) -> Result<http::Request<Vec<u8>>> {
    let mut q = form_urlencoded::Serializer::new(format!("{path}?"));
    if let Some(l) = labels.filter(|l| !l.is_empty()) {
        q.append_pair("labelSelector", l);
    }
    q.append_pair("limit", &limit.to_string());
    match cont {
        Some(c) => {
            q.append_pair("continue", c);
        }
        None => {
            q.append_pair("resourceVersion", "0");
            q.append_pair("resourceVersionMatch", "NotOlderThan");
        }
    }
    http::Request::get(q.finish())
        .body(Vec::new())
        .map_err(|e| PresenceError::Build(kube::core::request::Error::BuildRequest(e)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cached_list_asks_for_the_cache_and_a_continuation_does_not() {
        let first = cached_list("/api/v1/nodes", Some("a!=b,c=d"), 500, None).unwrap();
        let q = first.uri().query().unwrap();
        assert!(
            q.contains("resourceVersion=0&resourceVersionMatch=NotOlderThan"),
            "{q}"
        );
        assert!(
            q.contains("limit=500") && q.contains("labelSelector=a%21%3Db%2Cc%3Dd"),
            "{q}"
        );
        let next = cached_list("/api/v1/nodes", None, 500, Some("eyJ+/=")).unwrap();
        let q = next.uri().query().unwrap();
        assert!(!q.contains("resourceVersion"), "{q}");
        assert!(q.contains("continue=eyJ%2B%2F%3D"), "{q}");
    }
}
