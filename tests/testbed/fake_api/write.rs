//! Writes of Leases (presence): create, replace, delete ([`write`]).

use serde_json::{json, Value};

use super::{
    status,
    store::{apply, delete},
    Inner, Resource,
};

/// A write, as the real server checks it: POST creates (409 if the name is
/// taken), PUT replaces only at the current resourceVersion (409 Conflict
/// otherwise; 404 if gone), DELETE removes (404 if gone). Leases only.
pub(super) fn write(
    inner: &Inner,
    method: &str,
    res: Resource,
    ns: Option<&str>,
    name: Option<String>,
    body: &[u8],
) -> (u16, Value) {
    let Some(ns) = ns.filter(|_| res == Resource::Leases) else {
        return (
            405,
            status(
                405,
                "MethodNotAllowed",
                "fake API: writes are for namespaced Leases only",
            ),
        );
    };
    let at = (inner, res, ns);
    match (method, name) {
        ("POST", None) => create(at, body),
        ("PUT", Some(name)) => replace(at, &name, body),
        ("DELETE", Some(name)) => remove(at, &name),
        _ => (
            405,
            status(
                405,
                "MethodNotAllowed",
                &format!("fake API: {method} not served here"),
            ),
        ),
    }
}

/// Where a write goes: the server, the resource and the namespace.
type At<'a> = (&'a Inner, Resource, &'a str);

/// The object stored under `name`, if any.
fn current((inner, res, ns): At<'_>, name: &str) -> Option<Value> {
    let st = inner.state.lock().unwrap();
    st.objects
        .get(&(res, ns.to_owned(), name.to_owned()))
        .cloned()
}

/// The request's body as an object of the namespace written to (400 if it
/// is not JSON).
fn object((_, _, ns): At<'_>, body: &[u8]) -> Result<Value, (u16, Value)> {
    let mut o: Value = serde_json::from_slice(body)
        .map_err(|e| (400, status(400, "BadRequest", &format!("body: {e}"))))?;
    o["metadata"]["namespace"] = json!(ns);
    Ok(o)
}

fn stored(at: At<'_>, name: &str) -> Value {
    current(at, name).unwrap_or(Value::Null)
}

fn create(at: At<'_>, body: &[u8]) -> (u16, Value) {
    let o = match object(at, body) {
        Ok(o) => o,
        Err(e) => return e,
    };
    let name = o["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    if current(at, &name).is_some() {
        return (
            409,
            status(
                409,
                "AlreadyExists",
                &format!("leases \"{name}\" already exists"),
            ),
        );
    }
    apply(at.0, at.1, o);
    (201, stored(at, &name))
}

fn replace(at: At<'_>, name: &str, body: &[u8]) -> (u16, Value) {
    let o = match object(at, body) {
        Ok(o) => o,
        Err(e) => return e,
    };
    let Some(cur) = current(at, name) else {
        return (
            404,
            status(404, "NotFound", &format!("leases \"{name}\" not found")),
        );
    };
    if o["metadata"]["resourceVersion"] != cur["metadata"]["resourceVersion"] {
        return (409, status(409, "Conflict", &format!("Operation cannot be fulfilled on leases \"{name}\": the object has been modified")));
    }
    apply(at.0, at.1, o);
    (200, stored(at, name))
}

fn remove(at: At<'_>, name: &str) -> (u16, Value) {
    let Some(gone) = current(at, name) else {
        return (
            404,
            status(404, "NotFound", &format!("leases \"{name}\" not found")),
        );
    };
    delete(at.0, at.1, at.2, name);
    (200, gone)
}
