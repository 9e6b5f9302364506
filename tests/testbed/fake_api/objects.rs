//! Object builders with the fields the real objects have.

use serde_json::{json, Value};

pub fn service(ns: &str, name: &str, ips: &[&str]) -> Value {
    let ingress: Vec<Value> = ips
        .iter()
        .map(|ip| json!({"ip": ip, "ipMode": "VIP"}))
        .collect();
    json!({
        "metadata": {"name": name, "namespace": ns},
        "spec": {"type": "LoadBalancer", "ports": [{"port": 443, "protocol": "TCP"}], "externalTrafficPolicy": "Local"},
        "status": {"loadBalancer": {"ingress": ingress}}
    })
}

/// A ClusterIP Service as a Helm chart leaves it on a real server:
/// labels, a selector, two ports, the Helm annotations and the
/// managed fields the server adds (about 2.5 kB of JSON). `i` makes its
/// cluster IP.
pub fn cluster_ip_service(ns: &str, name: &str, i: usize) -> Value {
    let ip = format!("10.96.{}.{}", (i / 256) % 256, i % 256);
    let labels = json!({
        "app.kubernetes.io/name": name, "app.kubernetes.io/instance": name,
        "app.kubernetes.io/managed-by": "Helm", "app.kubernetes.io/component": "server",
        "helm.sh/chart": format!("{name}-1.4.2")
    });
    json!({
        "metadata": {
            "name": name, "namespace": ns, "labels": labels,
            "annotations": {"meta.helm.sh/release-name": name, "meta.helm.sh/release-namespace": ns},
            "creationTimestamp": "2026-11-30T10:00:00Z",
            "managedFields": [managed_field("helm", "Update", json!({
                "f:metadata": {"f:annotations": {".": {}, "f:meta.helm.sh/release-name": {}, "f:meta.helm.sh/release-namespace": {}},
                    "f:labels": {".": {}, "f:app.kubernetes.io/component": {}, "f:app.kubernetes.io/instance": {},
                        "f:app.kubernetes.io/managed-by": {}, "f:app.kubernetes.io/name": {}, "f:helm.sh/chart": {}}},
                "f:spec": {"f:internalTrafficPolicy": {}, "f:ports": {".": {},
                    "k:{\"port\":80,\"protocol\":\"TCP\"}": {".": {}, "f:name": {}, "f:port": {}, "f:protocol": {}, "f:targetPort": {}},
                    "k:{\"port\":9090,\"protocol\":\"TCP\"}": {".": {}, "f:name": {}, "f:port": {}, "f:protocol": {}, "f:targetPort": {}}},
                    "f:selector": {}, "f:sessionAffinity": {}, "f:type": {}}
            }))]
        },
        "spec": {
            "type": "ClusterIP", "clusterIP": ip, "clusterIPs": [ip],
            "ipFamilies": ["IPv4"], "ipFamilyPolicy": "SingleStack",
            "internalTrafficPolicy": "Cluster", "sessionAffinity": "None",
            "selector": {"app.kubernetes.io/name": name, "app.kubernetes.io/instance": name},
            "ports": [
                {"name": "http", "port": 80, "protocol": "TCP", "targetPort": "http"},
                {"name": "metrics", "port": 9090, "protocol": "TCP", "targetPort": 9090}
            ]
        },
        "status": {"loadBalancer": {}}
    })
}

/// One `metadata.managedFields` entry.
pub fn managed_field(manager: &str, operation: &str, fields: Value) -> Value {
    json!({"apiVersion": "v1", "fieldsType": "FieldsV1", "fieldsV1": fields,
        "manager": manager, "operation": operation, "time": "2026-11-30T10:00:00Z"})
}

/// A Node (only what a metadata list reads).
pub fn node(name: &str) -> Value {
    json!({"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}}})
}

/// A Node with its addresses, as the kubelet reports them.
pub fn node_with_ips(name: &str, internal: &[&str]) -> Value {
    let mut addresses: Vec<Value> = (internal.iter())
        .map(|ip| json!({"type": "InternalIP", "address": ip}))
        .collect();
    addresses.push(json!({"type": "Hostname", "address": name}));
    let mut n = node(name);
    n["status"] = json!({"addresses": addresses});
    n
}

/// A MetalLB L2Advertisement announcing on `interfaces` (empty: every one).
pub fn l2_advertisement(ns: &str, name: &str, interfaces: &[&str]) -> Value {
    json!({"metadata": {"name": name, "namespace": ns},
        "spec": {"ipAddressPools": ["default"], "interfaces": interfaces}})
}

/// A CiliumL2AnnouncementPolicy (cluster-scoped) with `interfaces` regexes.
pub fn l2_policy(name: &str, interfaces: &[&str]) -> Value {
    json!({"metadata": {"name": name},
        "spec": {"loadBalancerIPs": true, "interfaces": interfaces}})
}

/// The guard's Pod on `node`, as the DaemonSet's controller and the
/// kubelet leave it (labels, owner, a container, its status and Ready
/// condition; about 2 kB of JSON, a real one with its managed fields
/// is 5-8 kB).
pub fn guard_pod(ns: &str, node: &str, ready: bool) -> Value {
    let r = if ready { "True" } else { "False" };
    json!({
        "metadata": {"name": format!("arp-guard-{node}"), "namespace": ns,
            "labels": {"app.kubernetes.io/name": "arp-guard", "controller-revision-hash": "6d9f8b7c5d", "pod-template-generation": "1"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "arp-guard", "uid": "ds-uid", "controller": true, "blockOwnerDeletion": true}]},
        "spec": {"nodeName": node, "serviceAccountName": "arp-guard", "hostNetwork": true,
            "containers": [{"name": "arp-guard", "image": "arp-guard:0.1.0", "args": ["run", "--announcer", "cilium"],
                "readinessProbe": {"httpGet": {"host": "127.0.0.1", "port": 9477, "path": "/readyz"}, "periodSeconds": 5}}]},
        "status": {"phase": "Running", "hostIP": "203.0.113.11", "podIP": "203.0.113.11",
            "conditions": [
                {"type": "Initialized", "status": "True", "lastTransitionTime": "2026-11-30T10:00:00Z"},
                {"type": "Ready", "status": r, "lastTransitionTime": "2026-11-30T10:00:05Z"},
                {"type": "ContainersReady", "status": r, "lastTransitionTime": "2026-11-30T10:00:05Z"},
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-11-30T10:00:00Z"}],
            "containerStatuses": [{"name": "arp-guard", "ready": ready, "restartCount": 0, "image": "arp-guard:0.1.0",
                "state": {"running": {"startedAt": "2026-11-30T10:00:01Z"}}}]}
    })
}

/// `renewTime` now, as client-go writes it (microseconds, UTC).
pub fn renew_now() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%S%.6fZ")
        .to_string()
}

/// A Lease as client-go's leader election writes it.
pub fn lease(ns: &str, name: &str, holder: &str, duration_s: i32, renew: &str) -> Value {
    json!({
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "holderIdentity": holder,
            "leaseDurationSeconds": duration_s,
            "acquireTime": "2026-11-30T10:00:00.000000Z",
            "renewTime": renew,
            "leaseTransitions": 0
        }
    })
}

/// The Lease by which Cilium's L2 announcer holds Service
/// `default/<service>`: `cilium-l2announce-default-<service>` in
/// kube-system.
pub fn cilium_lease(service: &str, holder: &str, duration_s: i32, renew: &str) -> Value {
    lease(
        "kube-system",
        &format!("cilium-l2announce-default-{service}"),
        holder,
        duration_s,
        renew,
    )
}

/// MetalLB's ServiceL2Status (generateName l2-).
pub fn l2status(ns: &str, name: &str, node: &str, svc_ns: &str, svc_name: &str) -> Value {
    json!({
        "metadata": {
            "name": name,
            "namespace": ns,
            "labels": {"metallb.io/node": node, "metallb.io/service-name": svc_name, "metallb.io/service-namespace": svc_ns}
        },
        "status": {"node": node, "serviceName": svc_name, "serviceNamespace": svc_ns, "interfaces": [{"name": "eth0"}]}
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn renew_now_is_rfc3339_with_microseconds() {
        let t = super::renew_now();
        assert_eq!(t.len(), "2026-11-30T10:00:00.000000Z".len(), "{t}");
        assert!(t.parse::<jiff::Timestamp>().is_ok(), "{t}");
    }
}
