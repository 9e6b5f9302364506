//! Which objects a list or a watch covers (namespace, label selector,
//! field selector, as the real server parses them) and one page of a list.

use serde_json::{json, Value};

use super::{store::Event, FakeApi, Inner, Resource};

impl FakeApi {
    /// Serve Services' `spec.type` and `spec.clusterIP` field selectors
    /// (true, the default: Kubernetes 1.31 and later) or answer them with
    /// 400 Bad Request as older servers do (false).
    pub fn set_service_field_selectors(&self, supported: bool) {
        self.inner.state.lock().unwrap().old_service_fields = !supported;
    }

    /// List requests (first pages) of `res` served so far: a relist shows here.
    pub fn lists(&self) -> u64 {
        self.inner.state.lock().unwrap().lists
    }
}

/// Which objects a list or watch covers.
pub(super) struct Filter<'a> {
    pub(super) res: Resource,
    pub(super) ns: Option<&'a str>,
    pub(super) selector: Option<&'a str>,
    pub(super) fields: Vec<FieldTerm>,
}

impl Filter<'_> {
    fn covers(&self, res: Resource, ns: &str, obj: &Value) -> bool {
        res == self.res
            && self.ns.is_none_or(|n| n == ns)
            && matches_selector(obj, self.selector)
            && self.fields.iter().all(|t| t.matches(obj))
    }

    /// An event as a watch with this filter shows it, as the real server's
    /// watch cache does: a change that makes an object match is ADDED, one
    /// that makes it stop matching is DELETED (with its previous content).
    pub(super) fn seen<'e>(&self, e: &'e Event) -> Option<(&'static str, &'e Value)> {
        let now = self.covers(e.res, &e.ns, &e.object);
        let before = e.prev.as_ref().map(|p| self.covers(e.res, &e.ns, p));
        match (e.kind, before) {
            ("MODIFIED", Some(true)) if now => Some(("MODIFIED", &e.object)),
            ("MODIFIED", Some(true)) => e.prev.as_ref().map(|p| ("DELETED", p)),
            ("MODIFIED", _) if now => Some(("ADDED", &e.object)),
            ("MODIFIED", _) => None,
            (kind, _) => now.then_some((kind, &e.object)),
        }
    }
}

/// One term of a field selector: `path=value` or `path!=value`.
pub(super) struct FieldTerm {
    path: String,
    value: String,
    equal: bool,
}

impl FieldTerm {
    fn matches(&self, obj: &Value) -> bool {
        let mut v = obj;
        for part in self.path.split('.') {
            v = &v[part];
        }
        // An unset field reads as "" (spec.type of a Service created
        // without one is defaulted to ClusterIP by a real server).
        let got = v.as_str().unwrap_or(match self.path.as_str() {
            "spec.type" => "ClusterIP",
            _ => "",
        });
        (got == self.value) == self.equal
    }
}

/// A field selector as the real server parses it: only the fields each
/// resource registers are accepted, anything else is 400 Bad Request with
/// the server's message (`field label not supported: ...`).
pub(super) fn field_selector(
    res: Resource,
    sel: Option<&str>,
    old: bool,
) -> Result<Vec<FieldTerm>, String> {
    let Some(sel) = sel.filter(|s| !s.is_empty()) else {
        return Ok(Vec::new());
    };
    sel.split(',')
        .map(|term| {
            let (path, value, equal) = if let Some((k, v)) = term.split_once("!=") {
                (k, v, false)
            } else if let Some((k, v)) = term.split_once("==") {
                (k, v, true)
            } else if let Some((k, v)) = term.split_once('=') {
                (k, v, true)
            } else {
                return Err(format!(
                    "invalid selector: '{term}'; can't understand '{term}'"
                ));
            };
            let path = path.trim();
            let known = matches!(path, "metadata.name" | "metadata.namespace")
                || (res == Resource::Services
                    && !old
                    && matches!(path, "spec.type" | "spec.clusterIP"));
            if !known {
                return Err(format!("field label not supported: {path}"));
            }
            Ok(FieldTerm {
                path: path.to_owned(),
                value: value.trim().to_owned(),
                equal,
            })
        })
        .collect()
}

/// Equality-based label selectors (`k=v`, `k==v`, `k!=v`, `k`, `!k`); any
/// other form fails the test loudly rather than matching everything.
fn matches_selector(obj: &Value, selector: Option<&str>) -> bool {
    let Some(sel) = selector.filter(|s| !s.is_empty()) else {
        return true;
    };
    let labels = &obj["metadata"]["labels"];
    sel.split(',').all(|term| {
        let term = term.trim();
        if let Some((k, v)) = term.split_once("!=") {
            labels[k.trim()].as_str() != Some(v.trim())
        } else if let Some((k, v)) = term.split_once('=') {
            labels[k.trim()].as_str() == Some(v.trim_start_matches('=').trim())
        } else if let Some(k) = term.strip_prefix('!') {
            labels[k.trim()].is_null()
        } else {
            assert!(
                !term.contains(' ') && !term.contains('('),
                "fake API: unsupported selector {term:?}"
            );
            !labels[term].is_null()
        }
    })
}

/// One page of a list; `cont` is the offset the previous page handed out.
/// One page of a list; `cont` is the token the previous page handed out
/// (the key of its last object: a page costs its own size, not the
/// collection's, as on a real server).
pub(super) fn list(
    inner: &Inner,
    f: &Filter<'_>,
    limit: Option<usize>,
    cont: Option<&str>,
) -> Value {
    let mut st = inner.state.lock().unwrap();
    if cont.is_none() {
        st.lists += 1;
    }
    let start = match cont.and_then(|c| c.split_once('/')) {
        Some((ns, name)) => std::ops::Bound::Excluded((f.res, ns.to_owned(), name.to_owned())),
        None => std::ops::Bound::Included((f.res, String::new(), String::new())),
    };
    let mut matching = st
        .objects
        .range((start, std::ops::Bound::Unbounded))
        .take_while(|((r, _, _), _)| *r == f.res)
        .filter(|((r, n, _), o)| f.covers(*r, n, o));
    let limit = limit.unwrap_or(usize::MAX);
    let mut items = Vec::new();
    let mut last = None;
    for ((_, ns, name), o) in matching.by_ref() {
        items.push(o);
        last = Some(format!("{ns}/{name}"));
        if items.len() == limit {
            break;
        }
    }
    let mut metadata = json!({"resourceVersion": st.rv.to_string()});
    if items.len() == limit && matching.next().is_some() {
        metadata["continue"] = json!(last);
    }
    let res = f.res;
    json!({"apiVersion": res.api_version(), "kind": format!("{}List", res.kind()), "metadata": metadata, "items": items})
}
