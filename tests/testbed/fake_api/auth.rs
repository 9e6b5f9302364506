//! Bearer-token authentication, as the real server does it before anything
//! else: an unknown or missing token gets 401, a known one without
//! permissions 403, each with a Kubernetes `Status` body.

use std::collections::BTreeSet;

use serde_json::Value;

use super::{status, FakeApi, Inner};

/// Which bearer tokens the server knows.
#[derive(Debug, Clone, Default)]
pub(super) struct Auth {
    /// Authenticated and allowed everything.
    accepted: BTreeSet<String>,
    /// Authenticated, allowed nothing (403).
    forbidden: BTreeSet<String>,
}

impl FakeApi {
    /// Require a bearer token from now on: `accepted` ones may do
    /// everything, `forbidden` ones are authenticated but may do nothing
    /// (403); any other, or none, is rejected (401). Takes effect at the
    /// next request (open watches go on, as on a real server).
    pub fn set_tokens(&self, accepted: &[&str], forbidden: &[&str]) {
        let set = |v: &[&str]| v.iter().map(|t| t.to_string()).collect();
        self.inner.state.lock().unwrap().auth = Some(Auth {
            accepted: set(accepted),
            forbidden: set(forbidden),
        });
    }

    /// Requests that presented `token` so far.
    pub fn token_uses(&self, token: &str) -> u64 {
        let st = self.inner.state.lock().unwrap();
        st.tokens_seen.get(token).copied().unwrap_or(0)
    }
}

/// Authentication and authorization, as the real server does them before
/// anything else: None if the request may go on, else the error to answer.
pub(super) fn check_token(inner: &Inner, token: Option<&str>, path: &str) -> Option<(u16, Value)> {
    let mut st = inner.state.lock().unwrap();
    if let Some(t) = token {
        *st.tokens_seen.entry(t.to_owned()).or_default() += 1;
    }
    let auth = st.auth.as_ref()?;
    match token {
        Some(t) if auth.accepted.contains(t) => None,
        Some(t) if auth.forbidden.contains(t) => Some((
            403,
            status(
                403,
                "Forbidden",
                &format!(
                    "{path} is forbidden: User \"system:serviceaccount:kube-system:arp-guard\" cannot get this resource"
                ),
            ),
        )),
        _ => Some((401, status(401, "Unauthorized", "Unauthorized"))),
    }
}
