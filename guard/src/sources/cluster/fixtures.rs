//! Objects the feed's unit tests apply: the Service `default/web` on
//! 198.51.100.10 and its Cilium Lease.

use super::decode::{Lease, Service};

/// `default/web`, type LoadBalancer, on 198.51.100.10.
pub fn svc() -> Service {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"type": "LoadBalancer"},
        "status": {"loadBalancer": {"ingress": [{"ip": "198.51.100.10"}]}}
    }))
    .unwrap()
}

/// web's Cilium Lease held by `holder`, renewed at `renew`, for
/// `duration_s`.
pub fn lease(holder: &str, renew: &str, duration_s: i32) -> Lease {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "cilium-l2announce-default-web", "namespace": "kube-system"},
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": duration_s, "renewTime": renew}
    }))
    .unwrap()
}
