//! What the operator's ownership file states, once parsed, and the rule for
//! node names (shared by the file, the cluster and the daemon's own name).

use std::{collections::BTreeMap, net::IpAddr, path::PathBuf};

/// One LB IP as the file states it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub owner: Option<String>,
    pub service: Option<String>,
    /// 1-based line of the entry in the file, for errors and explanations.
    pub line: usize,
}

/// A parsed, validated ownership file.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct OwnershipFile {
    pub path: PathBuf,
    pub ips: BTreeMap<IpAddr, Entry>,
}

/// Kubernetes node names are RFC 1123 DNS subdomains.
pub fn check_node_name(name: &str) -> Result<(), &'static str> {
    if name.len() > 253 {
        return Err("longer than 253 characters");
    }
    for label in name.split('.') {
        if label.is_empty() || label.len() > 63 {
            return Err("each dot-separated part must have 1 to 63 characters");
        }
        if !label
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        {
            return Err("only lowercase letters, digits, '-' and '.' are allowed");
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err("parts must start and end with a letter or digit");
        }
    }
    Ok(())
}
