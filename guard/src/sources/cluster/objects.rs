//! Kubernetes objects -> the plain model types. Everything an object can get
//! wrong (no IP, a hostname ingress, a missing field) is decided here.

use std::{net::IpAddr, time::Duration};

use k8s_openapi::api::{coordination::v1::Lease, core::v1::Service};
use kube::{api::DynamicObject, ResourceExt as _};

use super::model::{Key, L2Status, ServiceInfo};
use crate::sources::file::clip;

/// Which Services count: type LoadBalancer, the asked-for class, and (when
/// asked) spec.externalIPs besides the ingress IPs.
#[derive(Debug, Clone, Default)]
pub struct ServiceFilter {
    /// Only Services with this spec.loadBalancerClass (None: any class).
    pub lb_class: Option<String>,
    pub external_ips: bool,
}

pub const KUBE_VIP_LEASE_ANNOTATION: &str = "kube-vip.io/leaseName";

pub fn key_of<K: kube::Resource>(o: &K) -> Key {
    Key::new(
        field(&o.namespace().unwrap_or_default()),
        field(&o.name_any()),
    )
}

/// The Service's LB IPs, or None if it is not an LB Service we guard.
pub fn service(svc: &Service, filter: &ServiceFilter) -> Option<ServiceInfo> {
    let spec = svc.spec.as_ref()?;
    if spec.type_.as_deref() != Some("LoadBalancer") {
        return None;
    }
    if let Some(want) = &filter.lb_class {
        if spec.load_balancer_class.as_ref() != Some(want) {
            return None;
        }
    }
    let mut ips: Vec<IpAddr> = svc
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .into_iter()
        .flatten()
        // Hostname-only ingress entries (cloud LBs) carry no IP to guard.
        .filter_map(|i| i.ip.as_deref()?.parse().ok())
        .collect();
    if filter.external_ips {
        ips.extend(
            spec.external_ips
                .iter()
                .flatten()
                .filter_map(|s| s.parse::<IpAddr>().ok()),
        );
    }
    ips.sort();
    ips.dedup();
    let kube_vip_lease = svc
        .annotations()
        .get(KUBE_VIP_LEASE_ANNOTATION)
        .filter(|s| !s.is_empty())
        .map(|s| clip(s, 2 * MAX_FIELD + 1));
    Some(ServiceInfo {
        ips,
        kube_vip_lease,
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

/// A Lease as the model reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseFields {
    pub holder: Option<String>,
    pub duration: Duration,
    pub renew: Option<String>,
    /// leaseDurationSeconds when it was absurd (not set, at most 0, or
    /// above an hour) and replaced: the value found.
    pub clamped: Option<i32>,
}

/// Lease durations the guard believes: client-go's default when unset or
/// not positive; at most an hour (a holder that claims more cannot make a
/// guard wait that long to notice it is gone).
pub const DEFAULT_LEASE: Duration = Duration::from_secs(15);
pub const MAX_LEASE: Duration = Duration::from_secs(3600);

/// The fields of a Lease, strings clipped, duration made sane.
pub fn lease(l: &Lease) -> LeaseFields {
    let spec = l.spec.as_ref();
    let holder = spec
        .and_then(|s| s.holder_identity.as_deref())
        .filter(|h| !h.is_empty())
        .map(field);
    let raw = spec.and_then(|s| s.lease_duration_seconds);
    let (duration, clamped) = match raw {
        None => (DEFAULT_LEASE, None),
        Some(d) if d <= 0 => (DEFAULT_LEASE, Some(d)),
        Some(d) if u64::try_from(d).is_ok_and(|d| d > MAX_LEASE.as_secs()) => (MAX_LEASE, Some(d)),
        Some(d) => (Duration::from_secs(d as u64), None),
    };
    let renew = spec
        .and_then(|s| s.renew_time.as_ref())
        .map(|t| t.0.to_string());
    LeaseFields {
        holder,
        duration,
        renew,
        clamped,
    }
}

/// MetalLB's ServiceL2Status: status.node/serviceName/serviceNamespace, with
/// the labels as a fallback (older speakers filled only those).
pub fn l2status(o: &DynamicObject) -> Option<L2Status> {
    let status = o.data.get("status");
    let status_field = |f: &str| {
        status
            .and_then(|s| s.get(f))
            .and_then(|v| v.as_str())
            .filter(|s| !s.is_empty())
            .map(field)
    };
    let label = |l: &str| {
        o.labels()
            .get(l)
            .filter(|s| !s.is_empty())
            .map(|s| field(s))
    };
    let name = status_field("serviceName").or_else(|| label("metallb.io/service-name"))?;
    let ns = status_field("serviceNamespace").or_else(|| label("metallb.io/service-namespace"))?;
    let node = status_field("node").or_else(|| label("metallb.io/node"));
    Some(L2Status {
        node,
        service: Key::new(ns, name),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn svc(v: serde_json::Value) -> Service {
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
        assert_eq!(key_of(&s), Key::new("default", "web"));
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
        let l: Lease = serde_json::from_value(json!({
            "metadata": {"name": "x", "namespace": "kube-system"},
            "spec": {"holderIdentity": "node-a", "leaseDurationSeconds": 20, "renewTime": "2026-11-30T10:00:01.123456Z"}
        }))
        .unwrap();
        let f = lease(&l);
        assert_eq!(
            (f.holder.as_deref(), f.duration, f.clamped),
            (Some("node-a"), Duration::from_secs(20), None)
        );
        assert!(f.renew.unwrap().starts_with("2026-11-30T10:00:01"));
        let empty: Lease = serde_json::from_value(
            json!({"metadata": {"name": "x"}, "spec": {"holderIdentity": ""}}),
        )
        .unwrap();
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
        let with = |d: i32, holder: &str| -> Lease {
            serde_json::from_value(json!({
                "metadata": {"name": "x", "namespace": "kube-system"},
                "spec": {"holderIdentity": holder, "leaseDurationSeconds": d}
            }))
            .unwrap()
        };
        let f = lease(&with(2147483647, "n1"));
        assert_eq!((f.duration, f.clamped), (MAX_LEASE, Some(2147483647)));
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
        let o: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "metallb.io/v1beta1", "kind": "ServiceL2Status",
            "metadata": {"name": "l2-abc", "namespace": "metallb-system"},
            "status": {"node": "n1", "serviceName": "web", "serviceNamespace": "default"}
        }))
        .unwrap();
        assert_eq!(
            l2status(&o),
            Some(L2Status {
                node: Some("n1".into()),
                service: Key::new("default", "web")
            })
        );
        let o: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "metallb.io/v1beta1", "kind": "ServiceL2Status",
            "metadata": {"name": "l2-abc", "namespace": "metallb-system",
                "labels": {"metallb.io/node": "n2", "metallb.io/service-name": "web", "metallb.io/service-namespace": "default"}}
        }))
        .unwrap();
        assert_eq!(l2status(&o).unwrap().node.as_deref(), Some("n2"));
    }
}
