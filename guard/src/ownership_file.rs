//! The cluster-wide ownership file: which node owns which LB IP.
//!
//! Every node reads the same file and derives its own view from its node name.
//! Schema (YAML; JSON with the same fields also works):
//!
//! ```yaml
//! version: 1                 # optional; only 1 exists
//! ips:
//!   - ip: 198.51.100.100     # the LB IP (IPv4; IPv6 is accepted and not enforced yet)
//!     owner: node-a          # node that answers ARP for it; omit or null: no owner known
//!     service: default/web   # optional, for humans and logs
//! ```
//!
//! A file that does not parse, has an unknown field, a bad IP, an invalid node
//! name, or lists an IP twice is rejected as a whole with the file, line and
//! field named; the caller keeps its last good state.

use std::{
    collections::BTreeMap,
    fmt,
    net::IpAddr,
    path::{Path, PathBuf},
};

use serde::Deserialize;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[serde(default)]
    version: Option<u32>,
    /// Required, even when empty (`ips: []`): an empty or cut-off document
    /// must not read as "no LB IPs".
    ips: Vec<RawEntry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEntry {
    ip: IpAddr,
    #[serde(default)]
    owner: Option<String>,
    #[serde(default)]
    service: Option<String>,
}

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

/// Why a file was rejected. `Display` names file, line and field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileError {
    pub path: PathBuf,
    pub line: Option<usize>,
    pub field: Option<String>,
    pub message: String,
}

impl fmt::Display for FileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.path.display())?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
        }
        if let Some(field) = &self.field {
            write!(f, ": field `{field}`")?;
        }
        write!(f, ": {}", self.message)
    }
}

impl std::error::Error for FileError {}

/// Read and parse `path`.
pub fn load(path: &Path) -> Result<OwnershipFile, FileError> {
    let text = std::fs::read_to_string(path).map_err(|e| FileError {
        path: path.to_owned(),
        line: None,
        field: None,
        message: format!("cannot read: {e}"),
    })?;
    parse(path, &text)
}

fn is_json(path: &Path, text: &str) -> bool {
    path.extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("json"))
        || text.trim_start().starts_with('{')
}

/// Parse the text of an ownership file; `path` is only used in errors.
pub fn parse(path: &Path, text: &str) -> Result<OwnershipFile, FileError> {
    let err = |line: Option<usize>, field: Option<String>, message: String| FileError {
        path: path.to_owned(),
        line,
        field,
        message,
    };
    let raw: RawFile = if is_json(path, text) {
        let de = &mut serde_json::Deserializer::from_str(text);
        serde_path_to_error::deserialize(de).map_err(|e| {
            let field = non_root(e.path().to_string());
            let inner = e.into_inner();
            let line = (inner.line() > 0).then_some(inner.line());
            err(
                line,
                field.clone(),
                clean_message(&inner.to_string(), field.as_deref()),
            )
        })?
    } else {
        let de = serde_yaml::Deserializer::from_str(text);
        serde_path_to_error::deserialize(de).map_err(|e| {
            let field = non_root(e.path().to_string());
            let inner = e.into_inner();
            let line = inner.location().map(|l| l.line());
            err(
                line,
                field.clone(),
                clean_message(&inner.to_string(), field.as_deref()),
            )
        })?
    };
    if let Some(v) = raw.version {
        if v != 1 {
            let line = text
                .lines()
                .position(|l| l.trim_start().starts_with("version") || l.contains("\"version\""))
                .map(|i| i + 1);
            return Err(err(
                line,
                Some("version".into()),
                format!("unsupported version {v} (this arp-guard reads version 1)"),
            ));
        }
    }
    let mut ips = BTreeMap::new();
    let mut search_from = 0;
    for (i, e) in raw.ips.into_iter().enumerate() {
        // serde gives no spans for values: find the entry's line by its IP,
        // searching forward from the previous entry (entries are in order).
        let line =
            line_of(text, &e.ip.to_string(), search_from).or(line_of(text, &e.ip.to_string(), 0));
        if let Some(l) = line {
            search_from = l;
        }
        let field = |name: &str| Some(format!("ips[{i}].{name}"));
        if !is_unicast(e.ip) {
            return Err(err(
                line,
                field("ip"),
                format!("{} is not a unicast address an LB IP can have", e.ip),
            ));
        }
        let owner = match e.owner {
            Some(o) if o.trim().is_empty() => None,
            Some(o) => {
                if let Err(why) = check_node_name(&o) {
                    return Err(err(
                        line,
                        field("owner"),
                        format!("`{o}` is not a valid node name: {why}"),
                    ));
                }
                Some(o)
            }
            None => None,
        };
        let entry = Entry {
            owner,
            service: e.service,
            line: line.unwrap_or(0),
        };
        if let Some(prev) = ips.get(&e.ip) {
            let Entry {
                line: prev_line, ..
            } = prev;
            return Err(err(
                line,
                field("ip"),
                format!("{} is listed twice (first at line {prev_line})", e.ip),
            ));
        }
        ips.insert(e.ip, entry);
    }
    Ok(OwnershipFile {
        path: path.to_owned(),
        ips,
    })
}

fn non_root(p: String) -> Option<String> {
    (p != "." && !p.is_empty()).then_some(p)
}

/// serde_yaml prefixes the field path and both parsers append " at line X
/// column Y"; we print field and line ourselves.
fn clean_message(msg: &str, field: Option<&str>) -> String {
    let msg = match msg.rfind(" at line ") {
        Some(i) => &msg[..i],
        None => msg,
    };
    let msg = field
        .and_then(|f| msg.strip_prefix(f))
        .and_then(|m| m.strip_prefix(": "))
        .unwrap_or(msg);
    msg.to_owned()
}

/// The 1-based number of the first line at or after line `from` (1-based,
/// exclusive: lines after it) that contains `needle` as a whole token.
fn line_of(text: &str, needle: &str, from: usize) -> Option<usize> {
    text.lines().enumerate().skip(from).find_map(|(i, l)| {
        let content = l.split('#').next().unwrap_or("");
        let mut rest = content;
        while let Some(pos) = rest.find(needle) {
            let before = rest[..pos].chars().next_back();
            let after = rest[pos + needle.len()..].chars().next();
            let boundary = |c: Option<char>| {
                c.is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '.' || c == ':'))
            };
            if boundary(before) && boundary(after) {
                return Some(i + 1);
            }
            rest = &rest[pos + needle.len()..];
        }
        None
    })
}

fn is_unicast(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            !(v4.is_unspecified() || v4.is_broadcast() || v4.is_multicast() || v4.is_loopback())
        }
        IpAddr::V6(v6) => !(v6.is_unspecified() || v6.is_multicast() || v6.is_loopback()),
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn p(text: &str) -> Result<OwnershipFile, FileError> {
        parse(Path::new("/etc/arp-guard/owners.yaml"), text)
    }

    #[test]
    fn parses_yaml_with_lines() {
        let f = p("version: 1\nips:\n  - ip: 198.51.100.10\n    owner: node-a\n  - ip: 198.51.100.11\n  - ip: 198.51.100.12\n    owner: null\n    service: default/web\n  - ip: fd00::10\n    owner: node-b\n").unwrap();
        assert_eq!(f.ips.len(), 4);
        let a = &f.ips[&"198.51.100.10".parse().unwrap()];
        assert_eq!(a.owner.as_deref(), Some("node-a"));
        assert_eq!(a.line, 3);
        let b = &f.ips[&"198.51.100.11".parse().unwrap()];
        assert_eq!((b.owner.as_deref(), b.line), (None, 5));
        let c = &f.ips[&"198.51.100.12".parse().unwrap()];
        assert_eq!((c.service.as_deref(), c.line), (Some("default/web"), 6));
        assert_eq!(f.ips[&"fd00::10".parse().unwrap()].line, 9);
    }

    #[test]
    fn parses_json() {
        let text = "{\n  \"ips\": [\n    {\"ip\": \"198.51.100.10\", \"owner\": \"node-a\"},\n    {\"ip\": \"198.51.100.11\"}\n  ]\n}\n";
        let f = parse(Path::new("owners.json"), text).unwrap();
        assert_eq!(f.ips.len(), 2);
        assert_eq!(f.ips[&"198.51.100.11".parse().unwrap()].line, 4);
    }

    #[test]
    fn empty_or_cut_off_documents_are_rejected() {
        // An explicit empty list is a deliberate "no LB IPs".
        assert!(p("ips: []\n").unwrap().ips.is_empty());
        // An empty file, or one cut before `ips`, is not.
        for text in ["", "\n", "version: 1\n", "# comment only\n"] {
            let e = p(text).unwrap_err();
            assert!(e.message.contains("ips"), "{text:?}: {e}");
        }
    }

    #[test]
    fn messages_name_the_field_once() {
        let e = p("ips:\n  - ip: 198.51.100.300\n").unwrap_err();
        assert_eq!(
            e.to_string(),
            "/etc/arp-guard/owners.yaml:2: field `ips[0].ip`: invalid IP address syntax"
        );
    }

    #[test]
    fn bad_ip_names_line_and_field() {
        let e = p("ips:\n  - ip: 198.51.100.10\n    owner: node-a\n  - ip: 198.51.100.300\n    owner: node-b\n").unwrap_err();
        assert_eq!(e.line, Some(4), "{e}");
        assert_eq!(e.field.as_deref(), Some("ips[1].ip"), "{e}");
        let s = e.to_string();
        assert!(
            s.starts_with("/etc/arp-guard/owners.yaml:4: field `ips[1].ip`: "),
            "{s}"
        );
    }

    #[test]
    fn unknown_field_is_named() {
        let e = p("ips:\n  - ip: 198.51.100.10\n    ownr: node-a\n").unwrap_err();
        assert_eq!(e.line, Some(3), "{e}");
        assert!(e.message.contains("ownr"), "{e}");
    }

    #[test]
    fn syntax_error_has_a_line() {
        let e = p("ips:\n  - ip: 198.51.100.10\n   owner: [\n").unwrap_err();
        assert!(e.line.is_some(), "{e}");
        let e = parse(
            Path::new("o.json"),
            "{\"ips\": [\n  {\"ip\": \"198.51.100.1\",}\n]}",
        )
        .unwrap_err();
        assert_eq!(e.line, Some(2), "{e}");
    }

    #[test]
    fn duplicates_and_bad_owners_and_non_unicast_are_rejected() {
        let e =
            p("ips:\n  - ip: 198.51.100.10\n    owner: a\n  - ip: 198.51.100.10\n    owner: b\n")
                .unwrap_err();
        assert_eq!(
            (e.line, e.field.as_deref()),
            (Some(4), Some("ips[1].ip")),
            "{e}"
        );
        assert!(e.message.contains("first at line 2"), "{e}");
        let e = p("ips:\n  - ip: 198.51.100.10\n    owner: Node_A\n").unwrap_err();
        assert_eq!(e.field.as_deref(), Some("ips[0].owner"), "{e}");
        let e = p("ips:\n  - ip: 224.0.0.1\n").unwrap_err();
        assert!(e.message.contains("unicast"), "{e}");
        let e = p("version: 2\nips: []\n").unwrap_err();
        assert_eq!(
            (e.line, e.field.as_deref()),
            (Some(1), Some("version")),
            "{e}"
        );
    }

    #[test]
    fn line_search_is_token_exact() {
        let text = "ips:\n  - ip: 198.51.100.100\n  - ip: 198.51.100.10\n";
        assert_eq!(line_of(text, "198.51.100.10", 0), Some(3));
    }

    #[test]
    fn node_names() {
        assert!(check_node_name("worker-1.example.com").is_ok());
        assert!(check_node_name("Worker").is_err());
        assert!(check_node_name("-a").is_err());
        assert!(check_node_name("a..b").is_err());
    }
}
