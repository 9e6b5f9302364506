//! Events (events.k8s.io/v1, namespaced) as the guard's recorder writes
//! them: POST creates one (409 if its name is taken), PATCH merges a patch
//! into one (a series update: `series.count`, `series.lastObservedTime`).
//! Stored apart from the watched resources; tests read them with
//! [`FakeApi::events`] and can make the server refuse them
//! ([`FakeApi::set_events_refused`]) while everything else works.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use super::{status, FakeApi, Inner};

const PREFIX: &str = "/apis/events.k8s.io/v1/namespaces/";

#[derive(Default)]
pub(super) struct Store {
    events: BTreeMap<(String, String), Value>,
    /// Every request to events answers this status (None: served).
    refused: Option<u16>,
    /// Requests to events: (POSTs, PATCHes), refused ones included.
    requests: (u64, u64),
    /// The cluster-wide list refuses `reportingController=` (older
    /// servers); its requests, refused ones included.
    old_fields: bool,
    lists: u64,
    /// Every request to events: method, path, status answered.
    log: Vec<(String, String, u16)>,
}

impl FakeApi {
    /// Every Event stored, in (namespace, name) order.
    pub fn events(&self) -> Vec<Value> {
        let store = self.inner.events.lock().unwrap();
        store.events.values().cloned().collect()
    }

    /// Requests to events so far: (POSTs, PATCHes), refused ones included.
    pub fn event_requests(&self) -> (u64, u64) {
        self.inner.events.lock().unwrap().requests
    }

    /// Every request to events so far: method, path, status answered.
    pub fn event_log(&self) -> Vec<(String, String, u16)> {
        self.inner.events.lock().unwrap().log.clone()
    }

    /// Refuse a `reportingController=` selector on the cluster-wide list
    /// with a 400, as servers that do not map it do (true).
    pub fn set_event_field_selectors_old(&self, old: bool) {
        self.inner.events.lock().unwrap().old_fields = old;
    }

    /// Store `event` as if POSTed (by arp-guard or anyone else).
    pub fn put_event(&self, event: Value) {
        let ns = event["metadata"]["namespace"].as_str().unwrap_or("default");
        let name = event["metadata"]["name"].as_str().unwrap_or("e");
        let key = (ns.to_owned(), name.to_owned());
        self.inner.events.lock().unwrap().events.insert(key, event);
    }

    /// Requests for the cluster-wide Event list so far (a page each, or a
    /// refused selector).
    pub fn event_lists(&self) -> u64 {
        self.inner.events.lock().unwrap().lists
    }

    /// Answer every request to events with `code` (403: the guard's role
    /// lacks the verbs), or serve them again (None).
    pub fn set_events_refused(&self, code: Option<u16>) {
        self.inner.events.lock().unwrap().refused = code;
    }
}

/// Every Event of every namespace (`kubectl arp-guard events`), selected
/// by `reportingController=` (unless an old server) or `type=` as the real
/// server selects them; another field selector is a 400. `(limit,
/// continue)`: one page, the continue token the index of the next item.
pub(super) fn list_all(
    inner: &Inner,
    fields: Option<&str>,
    (limit, cont): (Option<usize>, Option<&str>),
) -> (u16, Value) {
    let old = {
        let mut store = inner.events.lock().unwrap();
        store.lists += 1;
        store.old_fields
    };
    let mut want: Vec<(&str, &str)> = Vec::new();
    for term in fields
        .unwrap_or_default()
        .split(',')
        .filter(|t| !t.is_empty())
    {
        match term.split_once('=') {
            Some((k @ "reportingController", v)) if !old => want.push((k, v)),
            Some((k @ "type", v)) => want.push((k, v)),
            _ => {
                return (
                    400,
                    status(
                        400,
                        "BadRequest",
                        &format!("field label not supported: {term}"),
                    ),
                )
            }
        }
    }
    let store = inner.events.lock().unwrap();
    let from: usize = cont.and_then(|c| c.parse().ok()).unwrap_or(0);
    let all: Vec<&Value> = (store.events.values())
        .filter(|e| want.iter().all(|(k, v)| e[*k].as_str() == Some(v)))
        .collect();
    let to = limit.map_or(all.len(), |l| (from + l).min(all.len()));
    let items = &all[from.min(to)..to];
    let next = if to < all.len() {
        to.to_string()
    } else {
        String::new()
    };
    (
        200,
        json!({"kind": "EventList", "apiVersion": "events.k8s.io/v1", "metadata": {"resourceVersion": "1", "continue": next}, "items": items}),
    )
}

/// The answer to a request for events (None: not a request for events).
pub(super) fn handle(inner: &Inner, method: &str, path: &str, body: &[u8]) -> Option<(u16, Value)> {
    let rest = path.strip_prefix(PREFIX)?;
    let answer = serve(inner, method, path, rest, body)?;
    let mut store = inner.events.lock().unwrap();
    store
        .log
        .push((method.to_owned(), path.to_owned(), answer.0));
    Some(answer)
}

fn serve(inner: &Inner, method: &str, path: &str, rest: &str, body: &[u8]) -> Option<(u16, Value)> {
    let (ns, name) = match rest.split('/').collect::<Vec<_>>().as_slice() {
        [ns, "events"] => (ns.to_string(), None),
        [ns, "events", name] => (ns.to_string(), Some(name.to_string())),
        _ => return None,
    };
    let mut store = inner.events.lock().unwrap();
    match method {
        "POST" => store.requests.0 += 1,
        "PATCH" => store.requests.1 += 1,
        _ => {}
    }
    if let Some(code) = store.refused {
        let reason = if code == 403 {
            "Forbidden"
        } else {
            "InternalError"
        };
        return Some((
            code,
            status(code, reason, &format!("fake API: {reason} for {path}")),
        ));
    }
    let Ok(body) = serde_json::from_slice::<Value>(body) else {
        return match method {
            "GET" => Some((
                200,
                json!({"kind": "EventList", "apiVersion": "events.k8s.io/v1", "metadata": {}, "items": store.events.values().collect::<Vec<_>>()}),
            )),
            _ => Some((400, status(400, "BadRequest", "the body is not JSON"))),
        };
    };
    let rv = {
        let mut st = inner.state.lock().unwrap();
        st.rv += 1;
        st.rv
    };
    match (method, name) {
        ("POST", None) => {
            let mut ev = body;
            let Some(name) = ev["metadata"]["name"].as_str().map(str::to_owned) else {
                return Some((422, status(422, "Invalid", "metadata.name: Required value")));
            };
            let key = (ns.clone(), name.clone());
            if store.events.contains_key(&key) {
                return Some((
                    409,
                    status(
                        409,
                        "AlreadyExists",
                        &format!("events \"{name}\" already exists"),
                    ),
                ));
            }
            ev["apiVersion"] = json!("events.k8s.io/v1");
            ev["kind"] = json!("Event");
            ev["metadata"]["namespace"] = json!(ns);
            ev["metadata"]["resourceVersion"] = json!(rv.to_string());
            ev["metadata"]["uid"] = json!(format!("uid-event-{rv}"));
            store.events.insert(key, ev.clone());
            Some((201, ev))
        }
        ("PATCH", Some(name)) => match store.events.get_mut(&(ns, name.clone())) {
            Some(ev) => {
                merge(ev, &body);
                ev["metadata"]["resourceVersion"] = json!(rv.to_string());
                Some((200, ev.clone()))
            }
            None => Some((
                404,
                status(404, "NotFound", &format!("events \"{name}\" not found")),
            )),
        },
        _ => Some((
            405,
            status(405, "MethodNotAllowed", &format!("{method} {path}")),
        )),
    }
}

/// A JSON merge patch (RFC 7386): objects merge key by key, null removes,
/// anything else replaces.
fn merge(target: &mut Value, patch: &Value) {
    let Some(p) = patch.as_object() else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    let t = target.as_object_mut().expect("an object");
    for (k, v) in p {
        if v.is_null() {
            t.remove(k);
        } else {
            merge(t.entry(k.clone()).or_insert(Value::Null), v);
        }
    }
}
