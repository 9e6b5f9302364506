//! The API's objects (as `decode` reads them) -> the store's plain types.
//! Everything an object can get wrong (no IP, a hostname ingress, a missing
//! field, an absurd duration) is decided here.

use std::{net::IpAddr, time::Duration};

use super::{
    decode,
    store::{Key, L2Status, ServiceInfo},
};
use crate::model::text::clip;

/// Which Services count: type LoadBalancer, the asked-for class, and (when
/// asked) spec.externalIPs besides the ingress IPs.
#[derive(Debug, Clone, Default)]
pub struct ServiceFilter {
    /// Only Services with this spec.loadBalancerClass (None: any class).
    pub lb_class: Option<String>,
    pub external_ips: bool,
}

pub use super::decode::KUBE_VIP_LEASE_ANNOTATION;

/// namespace/name, clipped.
pub fn key(ns: &str, name: &str) -> Key {
    Key::new(field(ns), field(name))
}

/// The key of an object (None when even its name cannot be read).
pub fn key_of<T: decode::Object>(o: &decode::Obj<T>) -> Option<Key> {
    o.names().map(|(ns, name)| key(ns, name))
}

/// The Service's LB IPs, or None if it is not an LB Service we guard.
pub fn service(svc: &decode::Service, filter: &ServiceFilter) -> Option<ServiceInfo> {
    let spec = svc.spec.as_ref()?;
    if !svc.is_load_balancer() {
        return None;
    }
    if let Some(want) = &filter.lb_class {
        if spec.load_balancer_class.as_ref() != Some(want) {
            return None;
        }
    }
    let mut ips: Vec<IpAddr> = (svc.status.as_ref())
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .into_iter()
        .flatten()
        // Hostname-only ingress entries (cloud LBs) carry no IP to guard.
        .filter_map(|i| i.ip.as_deref()?.parse().ok())
        .collect();
    if filter.external_ips {
        ips.extend((spec.external_ips.iter().flatten()).filter_map(|s| s.parse::<IpAddr>().ok()));
    }
    ips.sort();
    ips.dedup();
    let kube_vip_lease = (svc.metadata.annotations)
        .get(KUBE_VIP_LEASE_ANNOTATION)
        .filter(|s| !s.is_empty())
        .map(|s| clip(s, 2 * MAX_FIELD + 1));
    Some(ServiceInfo {
        ips,
        kube_vip_lease,
        unreadable: false,
        local: spec.external_traffic_policy.as_deref() == Some("Local"),
    })
}

/// Longest text kept from a cluster object's field: a node name has at most
/// 253 characters, and whatever the API sends is logged and shown (a 1 MB
/// holderIdentity must not become a 1 MB log line). A clipped value carries
/// a marker, so it can never equal a valid node name.
pub const MAX_FIELD: usize = 253;

fn field(s: &str) -> String {
    clip(s, MAX_FIELD)
}

/// A holder as the store keeps it: None when empty, clipped.
pub fn holder(h: Option<&str>) -> Option<String> {
    h.filter(|h| !h.is_empty()).map(field)
}

/// A Lease as the store reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseFields {
    pub holder: Option<String>,
    pub duration: Duration,
    pub renew: Option<String>,
    /// leaseDurationSeconds when it was absurd (not set, at most 0, or
    /// above an hour) and replaced: the value found.
    pub clamped: Option<i64>,
}

pub use super::store::{DEFAULT_LEASE, MAX_LEASE};

/// The fields of a Lease, strings clipped, duration made sane.
pub fn lease(l: &decode::Lease) -> LeaseFields {
    let spec = l.spec.as_ref();
    let raw = spec.and_then(|s| s.lease_duration_seconds).map(|s| s.0);
    let (duration, clamped) = match raw {
        None => (DEFAULT_LEASE, None),
        Some(d) if d <= 0 => (DEFAULT_LEASE, Some(d)),
        Some(d) if d.unsigned_abs() > MAX_LEASE.as_secs() => (MAX_LEASE, Some(d)),
        Some(d) => (Duration::from_secs(d.unsigned_abs()), None),
    };
    LeaseFields {
        holder: holder(spec.and_then(|s| s.holder_identity.as_deref())),
        duration,
        // Compared, never shown in full: clipped like any field.
        renew: (spec.and_then(|s| s.renew_time.as_deref())).map(field),
        clamped,
    }
}

/// MetalLB's ServiceL2Status: status.node/serviceName/serviceNamespace, with
/// the labels as a fallback (older speakers filled only those).
pub fn l2status(o: &decode::ServiceL2Status) -> Option<L2Status> {
    let status = o.status.as_ref();
    let nonempty = |s: Option<&String>| s.filter(|s| !s.is_empty()).map(|s| field(s));
    let label = |l: &str| {
        o.metadata
            .labels
            .get(l)
            .filter(|s| !s.is_empty())
            .map(field)
    };
    let name = nonempty(status.and_then(|s| s.service_name.as_ref()))
        .or_else(|| label("metallb.io/service-name"))?;
    let ns = nonempty(status.and_then(|s| s.service_namespace.as_ref()))
        .or_else(|| label("metallb.io/service-namespace"))?;
    let node = nonempty(status.and_then(|s| s.node.as_ref())).or_else(|| label("metallb.io/node"));
    Some(L2Status {
        node: node.map(Into::into),
        service: Key::new(ns, name),
        unreadable: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn svc(v: serde_json::Value) -> decode::Service {
        serde_json::from_value(v).unwrap()
    }

    fn lease_of(v: serde_json::Value) -> decode::Lease {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn lb_services_give_their_ingress_ips() {
        let s = svc(json!({
            "metadata": {"name": "web", "namespace": "default", "annotations": {"kube-vip.io/leaseName": "infra/web-lock"}},
            "spec": {"type": "LoadBalancer", "externalIPs": ["203.0.113.9"]},
            "status": {"loadBalancer": {"ingress": [{"ip": "198.51.100.10"}, {"hostname": "lb.example.com"}, {"ip": "fd00::10"}, {"ip": "198.51.100.10"}]}}
        }));
        let info = service(&s, &ServiceFilter::default()).unwrap();
        assert_eq!(
            info.ips,
            vec![
                "198.51.100.10".parse::<IpAddr>().unwrap(),
                "fd00::10".parse().unwrap()
            ]
        );
        assert_eq!(info.kube_vip_lease.as_deref(), Some("infra/web-lock"));
        let with_ext = service(
            &s,
            &ServiceFilter {
                external_ips: true,
                ..Default::default()
            },
        )
        .unwrap();
        assert!(with_ext.ips.contains(&"203.0.113.9".parse().unwrap()));
        assert_eq!(
            key_of(&decode::Obj::Good(s)),
            Some(Key::new("default", "web"))
        );
    }

    #[test]
    fn other_types_and_classes_are_not_guarded() {
        let cluster_ip = svc(
            json!({"metadata": {"name": "a", "namespace": "d"}, "spec": {"type": "ClusterIP"}}),
        );
        assert!(service(&cluster_ip, &ServiceFilter::default()).is_none());
        let classed = svc(
            json!({"metadata": {"name": "b", "namespace": "d"}, "spec": {"type": "LoadBalancer", "loadBalancerClass": "other"}}),
        );
        let filter = ServiceFilter {
            lb_class: Some("kube-vip.io/kube-vip-class".into()),
            ..Default::default()
        };
        assert!(service(&classed, &filter).is_none());
        assert!(
            service(&classed, &ServiceFilter::default())
                .unwrap()
                .ips
                .is_empty(),
            "pending: no IP yet"
        );
    }

    #[test]
    fn leases() {
        let l = lease_of(json!({
            "metadata": {"name": "x", "namespace": "kube-system"},
            "spec": {"holderIdentity": "node-a", "leaseDurationSeconds": 20, "renewTime": "2026-11-30T10:00:01.123456Z"}
        }));
        let f = lease(&l);
        assert_eq!(
            (f.holder.as_deref(), f.duration, f.clamped),
            (Some("node-a"), Duration::from_secs(20), None)
        );
        assert!(f.renew.unwrap().starts_with("2026-11-30T10:00:01"));
        let empty = lease_of(json!({"metadata": {"name": "x"}, "spec": {"holderIdentity": ""}}));
        assert_eq!(
            lease(&empty),
            LeaseFields {
                holder: None,
                duration: DEFAULT_LEASE,
                renew: None,
                clamped: None
            }
        );
    }

    #[test]
    fn absurd_durations_and_huge_fields_are_tamed() {
        let with = |d: i64, holder: &str| {
            lease_of(json!({
                "metadata": {"name": "x", "namespace": "kube-system"},
                "spec": {"holderIdentity": holder, "leaseDurationSeconds": d}
            }))
        };
        let f = lease(&with(2147483647, "n1"));
        assert_eq!((f.duration, f.clamped), (MAX_LEASE, Some(2147483647)));
        // Past i32 (which a real server would refuse): clamped the same.
        let f = lease(&with(1 << 40, "n1"));
        assert_eq!((f.duration, f.clamped), (MAX_LEASE, Some(1 << 40)));
        let f = lease(&with(0, "n1"));
        assert_eq!((f.duration, f.clamped), (DEFAULT_LEASE, Some(0)));
        let f = lease(&with(-5, "n1"));
        assert_eq!((f.duration, f.clamped), (DEFAULT_LEASE, Some(-5)));
        // A 1 MB holder is kept short and can never match a node name.
        let f = lease(&with(15, &"a".repeat(1 << 20)));
        let h = f.holder.unwrap();
        assert!(h.len() < 300, "{}", h.len());
        assert!(crate::model::ownership::check_node_name(&h).is_err());
    }

    #[test]
    fn l2status_fields_and_label_fallback() {
        let o: decode::ServiceL2Status = serde_json::from_value(json!({
            "apiVersion": "metallb.io/v1beta1", "kind": "ServiceL2Status",
            "metadata": {"name": "l2-abc", "namespace": "metallb-system"},
            "status": {"node": "n1", "serviceName": "web", "serviceNamespace": "default"}
        }))
        .unwrap();
        assert_eq!(
            l2status(&o),
            Some(L2Status {
                node: Some("n1".into()),
                service: Key::new("default", "web"),
                unreadable: false,
            })
        );
        let o: decode::ServiceL2Status = serde_json::from_value(json!({
            "apiVersion": "metallb.io/v1beta1", "kind": "ServiceL2Status",
            "metadata": {"name": "l2-abc", "namespace": "metallb-system",
                "labels": {"metallb.io/node": "n2", "metallb.io/service-name": "web", "metallb.io/service-namespace": "default"}}
        }))
        .unwrap();
        assert_eq!(l2status(&o).unwrap().node.as_deref(), Some("n2"));
    }
}
