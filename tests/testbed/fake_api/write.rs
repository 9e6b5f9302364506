//! Writes of Leases (presence): create, replace, delete ([`write`]).

use serde_json::{json, Value};

use super::{
    status,
    store::{apply, delete},
    Inner, Resource,
};

/// A write, as the real server checks it: POST creates (409 if the name is
/// taken), PUT replaces only at the current resourceVersion (409 Conflict
/// otherwise; 404 if gone), DELETE removes (404 if gone). Leases, and
/// ArpGuardNodes (`guard_node`: with PATCH, and the admission policy).
pub(super) fn write(
    inner: &Inner,
    method: &str,
    res: Resource,
    (ns, name): (Option<&str>, Option<String>),
    body: &[u8],
    token: Option<&str>,
) -> (u16, Value) {
    if res == Resource::GuardNodes {
        return guard_node(inner, method, name, body, token);
    }
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

/// A write of an ArpGuardNode (cluster-scoped): POST creates, PATCH with a
/// JSON Patch (`add` or `replace` of a top-level member, what the guard
/// sends), DELETE; each first admitted by the shipped policy
/// ([`super::admission`]) for the token's identity.
fn guard_node(
    inner: &Inner,
    method: &str,
    name: Option<String>,
    body: &[u8],
    token: Option<&str>,
) -> (u16, Value) {
    let at = (inner, Resource::GuardNodes, "");
    let parsed: Result<Value, _> = serde_json::from_slice(body);
    let (name, old, new) = match (method, name, parsed) {
        ("POST", None, Ok(o)) => {
            let n = o["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            (n, None, o)
        }
        ("PATCH", Some(n), Ok(ops)) => {
            let Some(cur) = current(at, &n) else {
                return (
                    404,
                    status(404, "NotFound", &format!("arpguardnodes \"{n}\" not found")),
                );
            };
            match json_patch(&cur, &ops) {
                Ok(new) => (n, Some(cur), new),
                Err(e) => return (422, status(422, "Invalid", &e)),
            }
        }
        ("DELETE", Some(n), _) => {
            let Some(cur) = current(at, &n) else {
                return (
                    404,
                    status(404, "NotFound", &format!("arpguardnodes \"{n}\" not found")),
                );
            };
            (n, Some(cur), Value::Null)
        }
        (_, _, Err(e)) => return (400, status(400, "BadRequest", &format!("body: {e}"))),
        _ => {
            return (
                405,
                status(
                    405,
                    "MethodNotAllowed",
                    &format!("fake API: {method} not served here"),
                ),
            )
        }
    };
    let operation = match method {
        "POST" => "CREATE",
        "DELETE" => "DELETE",
        _ => "UPDATE",
    };
    let who = super::admission::who(inner, token);
    let policy = super::admission::shipped().expect("the shipped admission policy");
    let newer = (!new.is_null()).then_some(&new);
    match policy.check(operation, &who, old.as_ref(), newer) {
        Ok(None) => {}
        Ok(Some(message)) => return super::admission::denied(&name, &message),
        Err(e) => {
            return (
                500,
                status(500, "InternalError", &format!("the policy failed: {e:#}")),
            )
        }
    }
    match method {
        "POST" if old.is_none() && current(at, &name).is_some() => (
            409,
            status(
                409,
                "AlreadyExists",
                &format!("arpguardnodes \"{name}\" already exists"),
            ),
        ),
        "DELETE" => {
            delete(inner, Resource::GuardNodes, "", &name);
            (200, old.unwrap_or_default())
        }
        code => {
            apply(inner, Resource::GuardNodes, new);
            (if code == "POST" { 201 } else { 200 }, stored(at, &name))
        }
    }
}

/// `ops` (a JSON Patch) applied to `cur`: `add` and `replace` of top-level
/// members only, which is all the guard sends.
fn json_patch(cur: &Value, ops: &Value) -> Result<Value, String> {
    let mut out = cur.clone();
    for op in ops.as_array().ok_or("a JSON Patch is an array")? {
        let path = op["path"].as_str().ok_or("an op without a path")?;
        let key = path.strip_prefix('/').filter(|k| !k.contains('/'));
        match (op["op"].as_str(), key) {
            (Some("add" | "replace"), Some(k)) => out[k] = op["value"].clone(),
            _ => return Err(format!("fake API: JSON Patch op {op} not served")),
        }
    }
    Ok(out)
}
