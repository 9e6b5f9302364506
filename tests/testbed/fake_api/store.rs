//! The objects the server holds and their history: create, replace and
//! delete (each a watch event in the log), a bulk load without history,
//! compaction, and the single-object GET.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use super::{auth::Auth, faults::Fault, status, FakeApi, Inner, Resource};

pub(super) type ObjKey = (Resource, String, String);

pub(super) struct Event {
    pub(super) rv: u64,
    pub(super) res: Resource,
    pub(super) ns: String,
    pub(super) kind: &'static str,
    pub(super) object: Value,
    /// The object as it was before a MODIFIED (a watch with a selector
    /// turns a change across the selector into ADDED or DELETED).
    pub(super) prev: Option<Value>,
}

#[derive(Default)]
pub(super) struct State {
    pub(super) rv: u64,
    pub(super) objects: BTreeMap<ObjKey, Value>,
    pub(super) log: Vec<Event>,
    /// Watches from a resourceVersion below this get 410 Gone.
    pub(super) compacted: u64,
    /// Bumped to cut every open watch.
    pub(super) generation: u64,
    /// Open watches send nothing (no event, no bookmark) until cut.
    pub(super) held: bool,
    pub(super) down: bool,
    /// Connections from any other address are closed at once: the API
    /// reachable only through a proxy there.
    pub(super) only_from: Option<std::net::IpAddr>,
    /// Connections closed for coming from elsewhere.
    pub(super) refused: u64,
    /// Connections are accepted and never answered (a silently dead API).
    pub(super) blackhole: bool,
    pub(super) requests: u64,
    pub(super) lists: u64,
    pub(super) faults: BTreeMap<Resource, Fault>,
    /// Single-object GETs served.
    pub(super) gets: u64,
    /// Bearer tokens required (None: no authentication).
    pub(super) auth: Option<Auth>,
    /// Requests per bearer token presented.
    pub(super) tokens_seen: BTreeMap<String, u64>,
    /// Who each bearer token is (the admission policy reads it).
    pub(super) identities: BTreeMap<String, super::admission::User>,
    /// Services may be selected by `spec.type` and `spec.clusterIP`
    /// (Kubernetes 1.31 and later); false: an older server, which answers
    /// such a field selector with 400 Bad Request.
    pub(super) old_service_fields: bool,
}

/// See [`FakeApi::handle`].
#[derive(Clone)]
pub struct ApiHandle {
    inner: std::sync::Arc<Inner>,
}

impl ApiHandle {
    pub fn apply(&self, res: Resource, object: Value) {
        apply(&self.inner, res, object)
    }
    pub fn delete(&self, res: Resource, ns: &str, name: &str) {
        delete(&self.inner, res, ns, name)
    }
}

impl FakeApi {
    /// Create or replace an object (the object's apiVersion/kind are filled in).
    pub fn apply(&self, res: Resource, object: Value) {
        apply(&self.inner, res, object)
    }

    /// A handle that can change objects from another thread (it does not
    /// stop the server when dropped).
    pub fn handle(&self) -> ApiHandle {
        ApiHandle {
            inner: self.inner.clone(),
        }
    }

    pub fn delete(&self, res: Resource, ns: &str, name: &str) {
        delete(&self.inner, res, ns, name)
    }

    /// Create many objects at once, without a watch history for them (a
    /// server whose history was compacted since): for benches that load
    /// tens of thousands of objects before the guard starts.
    pub fn preload(&self, res: Resource, objects: impl IntoIterator<Item = Value>) {
        let mut st = self.inner.state.lock().unwrap();
        for mut object in objects {
            st.rv += 1;
            let rv = st.rv;
            let key = stamp(res, &mut object, rv);
            st.objects.insert(key, object);
        }
        st.compacted = st.rv;
        self.inner.changed.notify_all();
    }

    /// The stored object (namespace "" for a cluster-scoped one), if any.
    pub fn object(&self, res: Resource, ns: &str, name: &str) -> Option<Value> {
        let st = self.inner.state.lock().unwrap();
        st.objects
            .get(&(res, ns.to_owned(), name.to_owned()))
            .cloned()
    }

    /// Compact the history: watches that start from before the current
    /// resourceVersion get 410 Gone (a watch from the current one is fine),
    /// as on a real server. A watch already open still gets every event, as
    /// from the API server's watch cache: the log is kept for it (clearing
    /// it lost an event applied just before, when the watch had not sent it
    /// yet: a test waited for a relist that only the watch's timeout brought).
    pub fn compact(&self) {
        let mut st = self.inner.state.lock().unwrap();
        st.compacted = st.rv;
    }

    /// The current resourceVersion (a watch from it sees what comes next).
    pub fn resource_version(&self) -> u64 {
        self.inner.state.lock().unwrap().rv
    }

    /// Single-object GETs served so far.
    pub fn gets(&self) -> u64 {
        self.inner.state.lock().unwrap().gets
    }
}

/// Delete an object (see [`FakeApi::delete`]).
pub(super) fn delete(inner: &Inner, res: Resource, ns: &str, name: &str) {
    let mut st = inner.state.lock().unwrap();
    let Some(mut object) = st.objects.remove(&(res, ns.to_owned(), name.to_owned())) else {
        return;
    };
    st.rv += 1;
    let rv = st.rv;
    object["metadata"]["resourceVersion"] = json!(rv.to_string());
    st.log.push(Event {
        rv,
        res,
        ns: ns.to_owned(),
        kind: "DELETED",
        object,
        prev: None,
    });
    inner.changed.notify_all();
}

/// Create or replace an object (see [`FakeApi::apply`]).
pub(super) fn apply(inner: &Inner, res: Resource, mut object: Value) {
    let mut st = inner.state.lock().unwrap();
    st.rv += 1;
    let rv = st.rv;
    let key = stamp(res, &mut object, rv);
    let prev = st.objects.insert(key.clone(), object.clone());
    let kind = if prev.is_some() { "MODIFIED" } else { "ADDED" };
    st.log.push(Event {
        rv,
        res,
        ns: key.1,
        kind,
        object,
        prev,
    });
    inner.changed.notify_all();
}

/// Fill in what the server sets (apiVersion, kind, namespace,
/// resourceVersion, uid); the object's key.
fn stamp(res: Resource, object: &mut Value, rv: u64) -> ObjKey {
    let ns = match res {
        Resource::Nodes | Resource::L2Policies | Resource::GuardNodes => String::new(),
        _ => object["metadata"]["namespace"]
            .as_str()
            .unwrap_or("default")
            .to_owned(),
    };
    let name = object["metadata"]["name"]
        .as_str()
        .expect("metadata.name")
        .to_owned();
    object["apiVersion"] = json!(res.api_version());
    object["kind"] = json!(res.kind());
    if res != Resource::Nodes {
        object["metadata"]["namespace"] = json!(ns);
    }
    object["metadata"]["resourceVersion"] = json!(rv.to_string());
    if object["metadata"]["uid"].is_null() {
        object["metadata"]["uid"] = json!(format!("uid-{ns}-{name}-{rv}"));
    }
    (res, ns, name)
}

/// A single object: 200 with it, or 404 Not Found.
pub(super) fn get(inner: &Inner, res: Resource, ns: Option<&str>, name: &str) -> (u16, Value) {
    let mut st = inner.state.lock().unwrap();
    st.gets += 1;
    let key = (res, ns.unwrap_or_default().to_owned(), name.to_owned());
    match st.objects.get(&key) {
        Some(o) => (200, o.clone()),
        None => (
            404,
            status(404, "NotFound", &format!("{} {name} not found", res.kind())),
        ),
    }
}
