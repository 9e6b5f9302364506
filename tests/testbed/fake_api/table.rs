//! Lists as a server-side Table (`Accept: application/json;as=Table;
//! v=v1;g=meta.k8s.io`, what kubectl asks for), with `includeObject=None`'s
//! shape: the columns kube-apiserver prints for Pods and Nodes, a row of
//! cells per object, no object. What a client reads of 5,000 guard Pods
//! then is a few hundred kB, not the Pods.

use serde_json::{json, Value};

use super::Resource;

fn columns(names: &[(&str, u8)]) -> Value {
    let defs: Vec<Value> = (names.iter())
        .map(|(n, prio)| json!({"name": n, "type": "string", "format": "", "description": "", "priority": prio}))
        .collect();
    Value::Array(defs)
}

/// A Pod's cells: Name, Ready, Status, Restarts, Age, IP, Node, Nominated
/// Node, Readiness Gates.
fn pod(o: &Value) -> Value {
    let cs = o["status"]["containerStatuses"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let ready = cs.iter().filter(|c| c["ready"] == true).count();
    json!([
        o["metadata"]["name"],
        format!("{ready}/{}", cs.len()),
        o["status"]["phase"].as_str().unwrap_or("Pending"),
        "0",
        "5d",
        o["status"]["podIP"].as_str().unwrap_or("<none>"),
        o["spec"]["nodeName"].as_str().unwrap_or("<none>"),
        "<none>",
        "<none>"
    ])
}

/// A Node's cells: Name, Status, Roles, Age, Version.
fn node(o: &Value) -> Value {
    json!([o["metadata"]["name"], "Ready", "<none>", "5d", "v1.32.0"])
}

/// `list` (a List of `res`) as a Table.
pub(super) fn of(res: Resource, list: &Value) -> Value {
    let (defs, cells): (Value, fn(&Value) -> Value) = match res {
        Resource::Pods => (
            columns(&[
                ("Name", 0),
                ("Ready", 0),
                ("Status", 0),
                ("Restarts", 0),
                ("Age", 0),
                ("IP", 1),
                ("Node", 1),
                ("Nominated Node", 1),
                ("Readiness Gates", 1),
            ]),
            pod,
        ),
        Resource::Nodes => (
            columns(&[
                ("Name", 0),
                ("Status", 0),
                ("Roles", 0),
                ("Age", 0),
                ("Version", 0),
            ]),
            node,
        ),
        _ => return list.clone(),
    };
    let rows: Vec<Value> = (list["items"].as_array().into_iter().flatten())
        .map(|o| json!({"cells": cells(o)}))
        .collect();
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": list["metadata"],
        "columnDefinitions": defs,
        "rows": rows,
    })
}
