//! The API's objects as the guard reads them: slim types with only the
//! fields the decisions need, decoded one object at a time.
//!
//! - Memory: nothing else of an object is ever built (managed fields,
//!   labels, ports, selectors are skipped by the parser), so a Service the
//!   guard does not guard costs it nothing to hold.
//! - One bad object never blinds a stream: a list page or a watch event is
//!   first split into raw objects, and each is decoded on its own; one that
//!   cannot be read becomes [`Obj::Bad`] (its key, resourceVersion and, for
//!   a Lease, its holder when those can still be read), and the rest of the
//!   stream goes on.
//! - Lenient where the guard can afford it: `renewTime` is kept as written
//!   (it is only ever compared), and `leaseDurationSeconds` is any JSON
//!   number (`objects` clamps absurd ones).

use std::borrow::Cow;

use serde::{
    de::{DeserializeOwned, IgnoredAny, MapAccess, Visitor},
    Deserialize, Deserializer,
};
use serde_json::value::RawValue;

/// kube-vip's per-Service Lease name (`name` or `ns/name`).
pub const KUBE_VIP_LEASE_ANNOTATION: &str = "kube-vip.io/leaseName";

/// Annotations and labels the guard reads (any other is skipped unread).
pub const PICKED: [&str; 5] = [
    KUBE_VIP_LEASE_ANNOTATION,
    "metallb.io/node",
    "metallb.io/service-name",
    "metallb.io/service-namespace",
    // A guard's presence record (read by presence, never by the feed).
    crate::model::presence::ANNOTATION,
];

/// The values of the [`PICKED`] keys of one map (annotations or labels),
/// by position. Other keys are compared without being copied.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Picked(pub [Option<String>; PICKED.len()]);

impl Picked {
    pub fn get(&self, key: &str) -> Option<&str> {
        let i = PICKED.iter().position(|k| *k == key)?;
        self.0[i].as_deref()
    }
}

impl<'de> Deserialize<'de> for Picked {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Picked;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a map of strings")
            }
            fn visit_unit<E>(self) -> Result<Picked, E> {
                Ok(Picked::default())
            }
            fn visit_none<E>(self) -> Result<Picked, E> {
                Ok(Picked::default())
            }
            fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Picked, D::Error> {
                d.deserialize_map(V)
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Picked, A::Error> {
                let mut out = Picked::default();
                while let Some(PickedKey(i)) = m.next_key()? {
                    match i {
                        Some(i) => out.0[i] = m.next_value()?,
                        None => {
                            m.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(out)
            }
        }
        d.deserialize_option(V)
    }
}

/// A map key as its position in [`PICKED`], read without copying it.
struct PickedKey(Option<usize>);

impl<'de> Deserialize<'de> for PickedKey {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = PickedKey;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a string key")
            }
            fn visit_str<E>(self, s: &str) -> Result<PickedKey, E> {
                Ok(PickedKey(PICKED.iter().position(|k| *k == s)))
            }
        }
        d.deserialize_str(V)
    }
}

/// `metadata`: identity, version, and the picked annotations and labels.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Meta {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub namespace: Option<String>,
    #[serde(default)]
    pub resource_version: Option<String>,
    #[serde(default)]
    pub annotations: Picked,
    #[serde(default)]
    pub labels: Picked,
}

/// A Service: its type, class, ingress IPs and external IPs.
#[derive(Debug, Clone, Deserialize)]
pub struct Service {
    pub metadata: Meta,
    #[serde(default)]
    pub spec: Option<ServiceSpec>,
    #[serde(default)]
    pub status: Option<ServiceStatus>,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceSpec {
    #[serde(default, rename = "type")]
    pub type_: Option<String>,
    #[serde(default)]
    pub load_balancer_class: Option<String>,
    #[serde(default, rename = "externalIPs")]
    pub external_ips: Option<Vec<String>>,
    #[serde(default)]
    pub external_traffic_policy: Option<String>,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceStatus {
    #[serde(default)]
    pub load_balancer: Option<LoadBalancerStatus>,
}

#[derive(Debug, Default, Clone, Deserialize)]
pub struct LoadBalancerStatus {
    #[serde(default)]
    pub ingress: Option<Vec<Ingress>>,
}

#[derive(Debug, Default, Clone, Deserialize)]
pub struct Ingress {
    /// None for a hostname-only entry (a cloud LB).
    #[serde(default)]
    pub ip: Option<String>,
}

impl Service {
    /// Of type LoadBalancer: the only Services whose IPs are guarded.
    pub fn is_load_balancer(&self) -> bool {
        self.spec.as_ref().and_then(|s| s.type_.as_deref()) == Some("LoadBalancer")
    }
}

/// A Lease: holder, duration, renewTime.
#[derive(Debug, Clone, Deserialize)]
pub struct Lease {
    pub metadata: Meta,
    #[serde(default)]
    pub spec: Option<LeaseSpec>,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LeaseSpec {
    #[serde(default)]
    pub holder_identity: Option<String>,
    #[serde(default)]
    pub lease_duration_seconds: Option<Seconds>,
    /// As written by the holder: compared, never parsed.
    #[serde(default)]
    pub renew_time: Option<String>,
}

/// A number of seconds as any JSON number, saturating to i64 (the store
/// clamps what is absurd; a string is still an error).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seconds(pub i64);

impl<'de> Deserialize<'de> for Seconds {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Seconds;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a number of seconds")
            }
            fn visit_i64<E>(self, v: i64) -> Result<Seconds, E> {
                Ok(Seconds(v))
            }
            fn visit_u64<E>(self, v: u64) -> Result<Seconds, E> {
                Ok(Seconds(i64::try_from(v).unwrap_or(i64::MAX)))
            }
            fn visit_f64<E>(self, v: f64) -> Result<Seconds, E> {
                // `as` saturates (and NaN is 0, which `objects` clamps).
                Ok(Seconds(v as i64))
            }
        }
        d.deserialize_any(V)
    }
}

/// MetalLB's ServiceL2Status: `status` (node, serviceName, serviceNamespace)
/// and the labels as a fallback.
#[derive(Debug, Clone, Deserialize)]
pub struct ServiceL2Status {
    pub metadata: Meta,
    #[serde(default)]
    pub status: Option<ServiceL2StatusFields>,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceL2StatusFields {
    #[serde(default)]
    pub node: Option<String>,
    #[serde(default)]
    pub service_name: Option<String>,
    #[serde(default)]
    pub service_namespace: Option<String>,
}

/// The kinds a stream reads.
pub trait Object: DeserializeOwned + Send + 'static {
    fn meta(&self) -> &Meta;
    /// Whether the feed needs this object at all.
    fn wanted(&self) -> bool {
        true
    }
}

impl Object for Service {
    fn meta(&self) -> &Meta {
        &self.metadata
    }
    /// Only Services of type LoadBalancer carry IPs to guard: any other is
    /// dropped as soon as it is read (and one that changes to another type
    /// is removed).
    fn wanted(&self) -> bool {
        self.is_load_balancer()
    }
}

impl Object for Lease {
    fn meta(&self) -> &Meta {
        &self.metadata
    }
}

impl Object for ServiceL2Status {
    fn meta(&self) -> &Meta {
        &self.metadata
    }
}

/// An object that could not be decoded: what can still be read of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bad {
    pub name: Option<String>,
    pub namespace: Option<String>,
    pub resource_version: Option<String>,
    /// A Lease's `spec.holderIdentity`, when it is a string.
    pub holder: Option<String>,
    /// Where and why it failed (`spec.leaseDurationSeconds: invalid type ...`).
    pub error: String,
}

/// One object of a list or a watch event.
#[derive(Debug, Clone)]
pub enum Obj<T> {
    Good(T),
    Bad(Bad),
}

impl<T: Object> Obj<T> {
    pub fn resource_version(&self) -> Option<&str> {
        match self {
            Obj::Good(o) => o.meta().resource_version.as_deref(),
            Obj::Bad(b) => b.resource_version.as_deref(),
        }
    }

    /// (namespace, name), when they can be read.
    pub fn names(&self) -> Option<(&str, &str)> {
        let (ns, name) = match self {
            Obj::Good(o) => (&o.meta().namespace, &o.meta().name),
            Obj::Bad(b) => (&b.namespace, &b.name),
        };
        Some((ns.as_deref().unwrap_or_default(), name.as_deref()?))
    }
}

/// Decode one object; never fails.
pub fn decode<T: Object>(raw: &str) -> Obj<T> {
    match serde_json::from_str::<T>(raw) {
        Ok(o) => Obj::Good(o),
        Err(_) => Obj::Bad(salvage::<T>(raw)),
    }
}

/// What can be read of an object the slim type could not: decoded again,
/// generically, for its identity, and once more for where it failed.
fn salvage<T: Object>(raw: &str) -> Bad {
    let v: serde_json::Value = serde_json::from_str(raw).unwrap_or_default();
    let text = |p: &str| v.pointer(p).and_then(|s| s.as_str()).map(str::to_owned);
    let mut de = serde_json::Deserializer::from_str(raw);
    let error = match serde_path_to_error::deserialize::<_, T>(&mut de) {
        Ok(_) => "undecodable".to_owned(),
        Err(e) if e.path().iter().next().is_none() => e.into_inner().to_string(),
        Err(e) => format!("{}: {}", e.path(), e.inner()),
    };
    Bad {
        name: text("/metadata/name"),
        namespace: text("/metadata/namespace"),
        resource_version: text("/metadata/resourceVersion"),
        holder: text("/spec/holderIdentity").filter(|h| !h.is_empty()),
        // Errors quote what they met: kept short for the log.
        error: crate::model::text::clip(&error, 512),
    }
}

/// One page of a list: the objects, decoded one by one, the list's
/// resourceVersion and the continue token.
pub struct Page<T> {
    pub items: Vec<Obj<T>>,
    pub resource_version: Option<String>,
    pub continue_token: Option<String>,
}

#[derive(Deserialize)]
struct RawPage<'a> {
    #[serde(default)]
    metadata: ListMeta,
    #[serde(borrow, default)]
    items: Option<Vec<&'a RawValue>>,
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ListMeta {
    #[serde(default)]
    resource_version: Option<String>,
    #[serde(default, rename = "continue")]
    continue_token: Option<String>,
}

/// A list page; an error only when the page itself is not a list.
/// `keep`: whether an object is wanted at all (the rest are dropped here,
/// before anything of them is kept).
pub fn page<T: Object>(text: &str, keep: impl Fn(&T) -> bool) -> serde_json::Result<Page<T>> {
    let raw: RawPage<'_> = serde_json::from_str(text)?;
    let items = (raw.items.unwrap_or_default().into_iter())
        .map(|r| decode::<T>(r.get()))
        .filter(|o| !matches!(o, Obj::Good(g) if !keep(g)))
        .collect();
    Ok(Page {
        items,
        resource_version: raw.metadata.resource_version,
        continue_token: raw.metadata.continue_token.filter(|c| !c.is_empty()),
    })
}

/// One line of a watch.
#[derive(Debug)]
pub enum WatchLine<T> {
    Added(Obj<T>),
    Modified(Obj<T>),
    Deleted(Obj<T>),
    /// The resourceVersion the watch has reached.
    Bookmark(Option<String>),
    /// An ERROR event: the Status object's code and message.
    Error(u16, String),
}

#[derive(Deserialize)]
struct RawLine<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
    #[serde(borrow)]
    object: &'a RawValue,
}

/// The Kubernetes API's Status object (a watch ERROR line's, or a bare answer).
#[derive(Deserialize)]
struct ApiStatus {
    #[serde(default)]
    code: u16,
    #[serde(default)]
    message: String,
}

/// An ADDED, MODIFIED or DELETED line whose object decodes, read in one pass.
#[derive(Deserialize)]
#[serde(bound(deserialize = "T: DeserializeOwned"))]
struct TypedLine<'a, T> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
    object: T,
}

/// Decode one line of a watch; an error only when the line is not an event
/// at all (then nothing in it can be trusted, not even which object).
pub fn watch_line<T: Object>(line: &[u8]) -> Result<WatchLine<T>, String> {
    let text = std::str::from_utf8(line).map_err(|e| format!("watch line: {e}"))?;
    // Nearly every line is a change whose object decodes (a Lease renewed
    // every 2 s is most of them): read it in one pass. Splitting it first
    // into a raw object and decoding that would scan every event twice, a
    // cost paid on every node for every renewal. Anything else (a bookmark,
    // an error, an object that does not decode) is read again the careful
    // way below, which gives the same answer it always did.
    if let Ok(l) = serde_json::from_str::<TypedLine<'_, T>>(text) {
        match l.kind.as_ref() {
            "ADDED" => return Ok(WatchLine::Added(Obj::Good(l.object))),
            "MODIFIED" => return Ok(WatchLine::Modified(Obj::Good(l.object))),
            "DELETED" => return Ok(WatchLine::Deleted(Obj::Good(l.object))),
            _ => {}
        }
    }
    let raw: RawLine<'_> = match serde_json::from_str(text) {
        Ok(r) => r,
        // A bare Status object instead of an event (a proxy's error).
        Err(e) => {
            return match serde_json::from_str::<ApiStatus>(text) {
                Ok(s) if s.code != 0 => Ok(WatchLine::Error(s.code, s.message)),
                _ => Err(format!("watch line: {e}")),
            }
        }
    };
    let o = raw.object.get();
    Ok(match raw.kind.as_ref() {
        "ADDED" => WatchLine::Added(decode(o)),
        "MODIFIED" => WatchLine::Modified(decode(o)),
        "DELETED" => WatchLine::Deleted(decode(o)),
        "BOOKMARK" => {
            #[derive(Deserialize)]
            struct B {
                #[serde(default)]
                metadata: Meta,
            }
            let b: Option<B> = serde_json::from_str(o).ok();
            WatchLine::Bookmark(b.and_then(|b| b.metadata.resource_version))
        }
        "ERROR" => {
            let s: ApiStatus = serde_json::from_str(o).map_err(|e| format!("watch ERROR: {e}"))?;
            WatchLine::Error(s.code, s.message)
        }
        other => return Err(format!("watch line of unknown type {other:?}")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn services_keep_only_what_the_guard_reads() {
        let raw = r#"{"metadata": {"name": "web", "namespace": "default", "resourceVersion": "7",
            "labels": {"app": "web"}, "managedFields": [{"manager": "helm", "fieldsV1": {"f:spec": {}}}],
            "annotations": {"kube-vip.io/leaseName": "infra/lock", "meta.helm.sh/release-name": "web"}},
            "spec": {"type": "LoadBalancer", "ports": [{"port": 80}], "externalIPs": ["203.0.113.9"]},
            "status": {"loadBalancer": {"ingress": [{"ip": "198.51.100.10", "ipMode": "VIP"}, {"hostname": "x"}]}}}"#;
        let Obj::Good(s) = decode::<Service>(raw) else {
            panic!("not decoded")
        };
        assert!(s.is_load_balancer());
        assert_eq!(s.metadata.annotations.get(PICKED[0]), Some("infra/lock"));
        assert_eq!(s.metadata.resource_version.as_deref(), Some("7"));
        let ingress = s.status.unwrap().load_balancer.unwrap().ingress.unwrap();
        assert_eq!(ingress[0].ip.as_deref(), Some("198.51.100.10"));
        assert_eq!(ingress[1].ip, None);
        // Nulls where objects belong are absent fields, not errors.
        let raw =
            r#"{"metadata": {"name": "x", "annotations": null}, "spec": null, "status": null}"#;
        assert!(matches!(decode::<Service>(raw), Obj::Good(_)));
    }

    #[test]
    fn lease_fields_the_guard_only_compares_are_read_leniently() {
        for raw in [
            r#"{"metadata": {"name": "l"}, "spec": {"holderIdentity": "n1", "leaseDurationSeconds": 99999999999}}"#,
            r#"{"metadata": {"name": "l"}, "spec": {"holderIdentity": "n1", "leaseDurationSeconds": 1.5e30}}"#,
            r#"{"metadata": {"name": "l"}, "spec": {"holderIdentity": "n1", "renewTime": "yesterday-ish"}}"#,
        ] {
            assert!(matches!(decode::<Lease>(raw), Obj::Good(_)), "{raw}");
        }
    }

    #[test]
    fn a_bad_object_keeps_what_can_be_read() {
        let raw = r#"{"metadata": {"name": "cilium-l2announce-default-web", "namespace": "kube-system",
            "resourceVersion": "42"}, "spec": {"holderIdentity": "node-a", "leaseDurationSeconds": "15"}}"#;
        let Obj::Bad(b) = decode::<Lease>(raw) else {
            panic!("a string where a number belongs must not decode")
        };
        assert_eq!(b.name.as_deref(), Some("cilium-l2announce-default-web"));
        assert_eq!(b.resource_version.as_deref(), Some("42"));
        assert_eq!(b.holder.as_deref(), Some("node-a"));
        assert!(
            b.error
                .starts_with("spec.leaseDurationSeconds: invalid type"),
            "{}",
            b.error
        );
        let Obj::Bad(b) = decode::<Service>(r#"{"metadata": {"name": 5}}"#) else {
            panic!()
        };
        assert_eq!((b.name, b.error.starts_with("metadata.name")), (None, true));
    }

    #[test]
    fn a_page_with_a_bad_object_keeps_the_rest() {
        let text = r#"{"metadata": {"resourceVersion": "10", "continue": "abc"}, "items": [
            {"metadata": {"name": "a"}, "spec": {"type": "LoadBalancer"}},
            {"metadata": {"name": "b"}, "spec": {"type": 7}},
            {"metadata": {"name": "c"}, "spec": {"type": "ClusterIP"}}]}"#;
        let p = page::<Service>(text, Service::is_load_balancer).unwrap();
        assert_eq!(p.resource_version.as_deref(), Some("10"));
        assert_eq!(p.continue_token.as_deref(), Some("abc"));
        let names: Vec<_> = p.items.iter().map(|o| o.names().unwrap().1).collect();
        assert_eq!(names, ["a", "b"], "c is not wanted; b is kept, bad");
        assert!(matches!(p.items[1], Obj::Bad(_)));
        assert!(page::<Service>("5", |_| true).is_err());
    }

    #[test]
    fn watch_lines() {
        let l = watch_line::<Lease>(
            br#"{"type":"MODIFIED","object":{"metadata":{"name":"x","resourceVersion":"5"}}}"#,
        )
        .unwrap();
        assert!(matches!(l, WatchLine::Modified(Obj::Good(_))));
        let b = watch_line::<Lease>(
            br#"{"type":"BOOKMARK","object":{"kind":"Lease","metadata":{"resourceVersion":"9"}}}"#,
        )
        .unwrap();
        assert!(matches!(b, WatchLine::Bookmark(Some(v)) if v == "9"));
        let e = watch_line::<Lease>(
            br#"{"type":"ERROR","object":{"kind":"Status","code":410,"message":"too old"}}"#,
        )
        .unwrap();
        assert!(matches!(e, WatchLine::Error(410, _)));
        // An event whose object is unreadable is still an event.
        let bad = watch_line::<Lease>(
            br#"{"type":"ADDED","object":{"metadata":{"name":"x"},"spec":{"holderIdentity":3}}}"#,
        )
        .unwrap();
        assert!(matches!(bad, WatchLine::Added(Obj::Bad(_))));
        assert!(watch_line::<Lease>(b"{not json").is_err());
        // Read in one pass or the careful way, the same answers: the object
        // before its type, and a type the guard does not know.
        let l = watch_line::<Lease>(br#"{"object":{"metadata":{"name":"x"}},"type":"DELETED"}"#)
            .unwrap();
        assert!(matches!(l, WatchLine::Deleted(Obj::Good(_))));
        let odd = br#"{"type":"OTHER","object":{"metadata":{"name":"x"}}}"#;
        assert!(watch_line::<Lease>(odd).is_err());
    }
}
