//! The cluster-wide ownership file: which node owns which LB IP.
//!
//! Every node reads the same file and derives its own view from its node name.
//! Schema (YAML; JSON, a subset of YAML, works too):
//!
//! ```yaml
//! version: 1                 # optional; only 1 exists
//! ips:
//!   - ip: 198.51.100.100     # the LB IP (IPv4: ARP; IPv6: Neighbor Discovery)
//!     owner: node-a          # node that answers for it; omit or null: no owner known
//!     service: default/web   # optional, for humans and logs
//! ```
//!
//! A file that does not parse, has an unknown field, a bad IP, an invalid node
//! name, or lists an IP twice is rejected as a whole with the file, line and
//! field named; the caller keeps its last good state.
//!
//! Reading is bounded: only a regular file (after symlinks) up to a size
//! limit is read, opened non-blocking so that a FIFO or device put in its
//! place cannot hang the reader, and parsed in linear time with the YAML
//! parser's own spans (serde-saphyr) and budgets (no alias bombs).

use std::{
    collections::BTreeMap,
    io::Read as _,
    net::IpAddr,
    path::{Path, PathBuf},
};

use serde::Deserialize;
use serde_saphyr::Spanned;

pub use crate::model::ownership::{check_node_name, Entry, OwnershipFile};
use crate::model::text::clip;

/// Default `--ownership-file-max-bytes`: room for about 65,536 typical
/// entries. (A Kubernetes ConfigMap holds at most 1 MiB.)
pub const DEFAULT_MAX_BYTES: u64 = 4 * 1024 * 1024;

/// Longest `service` text kept (it is only shown to humans).
const MAX_SERVICE_LEN: usize = 253;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[serde(default)]
    version: Option<Spanned<u32>>,
    /// Required, even when empty (`ips: []`): an empty or cut-off document
    /// must not read as "no LB IPs".
    ips: Vec<RawEntry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEntry {
    ip: Spanned<IpAddr>,
    #[serde(default)]
    owner: Option<String>,
    #[serde(default)]
    service: Option<String>,
}

/// Why a file was rejected. `Display` names file, line and field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}{}{}: {message}", .path.display(), FileError::at_line(*.line), FileError::in_field(.field.as_deref()))]
pub struct FileError {
    pub path: PathBuf,
    pub line: Option<usize>,
    pub field: Option<String>,
    pub message: String,
}

impl FileError {
    /// `:LINE`, when the line is known.
    fn at_line(line: Option<usize>) -> String {
        line.map(|l| format!(":{l}")).unwrap_or_default()
    }

    /// `: field `NAME``, when the field is known.
    fn in_field(field: Option<&str>) -> String {
        field.map(|f| format!(": field `{f}`")).unwrap_or_default()
    }

    fn whole(path: &Path, message: String) -> Self {
        FileError {
            path: path.to_owned(),
            line: None,
            field: None,
            message,
        }
    }
}

/// Read `path` if it is a regular file of at most `max_bytes` (symlinks are
/// followed: Kubernetes mounts ConfigMaps through them). The file is opened
/// non-blocking, so a FIFO or device in its place is refused, never waited on.
pub fn read_bounded(path: &Path, max_bytes: u64) -> Result<String, FileError> {
    use std::os::unix::fs::{FileTypeExt as _, OpenOptionsExt as _};
    let err = |m: String| FileError::whole(path, m);
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(|e| err(format!("cannot read: {e}")))?;
    let meta = file
        .metadata()
        .map_err(|e| err(format!("cannot read: {e}")))?;
    let t = meta.file_type();
    if !t.is_file() {
        let what = if t.is_fifo() {
            "a FIFO"
        } else if t.is_char_device() {
            "a character device"
        } else if t.is_block_device() {
            "a block device"
        } else if t.is_socket() {
            "a socket"
        } else if t.is_dir() {
            "a directory"
        } else {
            "not a regular file"
        };
        return Err(err(format!(
            "is {what}, not a regular file; refusing to read it"
        )));
    }
    let too_big = |n: u64| {
        err(format!(
            "is {n} bytes, more than the limit of {max_bytes} (--ownership-file-max-bytes)"
        ))
    };
    if meta.len() > max_bytes {
        return Err(too_big(meta.len()));
    }
    // The file may grow between fstat and read: never read past the limit.
    let mut buf = Vec::with_capacity(meta.len() as usize);
    file.take(max_bytes + 1)
        .read_to_end(&mut buf)
        .map_err(|e| err(format!("cannot read: {e}")))?;
    if buf.len() as u64 > max_bytes {
        return Err(too_big(buf.len() as u64));
    }
    String::from_utf8(buf).map_err(|e| err(format!("is not UTF-8 text ({e})")))
}

/// Read (bounded) and parse `path`.
pub fn load(path: &Path, max_bytes: u64) -> Result<OwnershipFile, FileError> {
    parse(path, &read_bounded(path, max_bytes)?)
}

/// The parser's limits: generous for the largest file the size limit lets
/// through, and no room for alias expansion games.
fn options(text: &str) -> serde_saphyr::Options {
    let mut budget = serde_saphyr::Budget::default();
    // Every node takes at least two bytes of text; an alias cannot multiply them.
    let nodes = (text.len() / 2).max(budget.max_nodes);
    budget.max_nodes = nodes;
    budget.max_events = nodes.max(budget.max_events);
    let mut o = serde_saphyr::Options::default();
    o.budget = Some(budget);
    o.with_snippet = false;
    o
}

/// Parse the text of an ownership file; `path` is only used in errors.
pub fn parse(path: &Path, text: &str) -> Result<OwnershipFile, FileError> {
    let err = |line: Option<usize>, field: Option<String>, message: String| FileError {
        path: path.to_owned(),
        line,
        field,
        message,
    };
    let raw: RawFile = serde_saphyr::from_str_with_options(text, options(text)).map_err(|e| {
        let (line, field, message) = syntax_error(text, &e);
        err(line, field, message)
    })?;
    if let Some(v) = raw.version {
        if v.value != 1 {
            return Err(err(
                Some(v.referenced.line() as usize),
                Some("version".into()),
                format!(
                    "unsupported version {} (this arp-guard reads version 1)",
                    v.value
                ),
            ));
        }
    }
    let mut ips = BTreeMap::new();
    for (i, e) in raw.ips.into_iter().enumerate() {
        let line = e.ip.referenced.line() as usize;
        let ip = e.ip.value;
        let (entry, problem) = entry(ip, e.owner, e.service, line);
        if let Some((name, message)) = problem {
            return Err(err(Some(line), Some(format!("ips[{i}].{name}")), message));
        }
        if let Some(prev) = ips.get(&ip) {
            let Entry {
                line: prev_line, ..
            } = prev;
            let message = format!("{ip} is listed twice (first at line {prev_line})");
            return Err(err(Some(line), Some(format!("ips[{i}].ip")), message));
        }
        ips.insert(ip, entry);
    }
    Ok(OwnershipFile {
        path: path.to_owned(),
        ips,
    })
}

/// One entry, and the field it is wrong in with why, if it is.
fn entry(
    ip: IpAddr,
    owner: Option<String>,
    service: Option<String>,
    line: usize,
) -> (Entry, Option<(&'static str, String)>) {
    let mut problem = None;
    if !is_unicast(ip) {
        problem = Some((
            "ip",
            format!("{ip} is not a unicast address an LB IP can have"),
        ));
    }
    let owner = owner.filter(|o| !o.trim().is_empty());
    if let Some(o) = &owner {
        if let Err(why) = check_node_name(o) {
            let message = format!("`{}` is not a valid node name: {why}", clip(o, 80));
            problem = problem.or(Some(("owner", message)));
        }
    }
    let entry = Entry {
        owner,
        service: service.map(|s| clip(&s, MAX_SERVICE_LEN)),
        line,
    };
    (entry, problem)
}

/// Line, field and message of a file serde could not read. Rare: the text
/// is parsed once more, tracking the path, to name the field.
fn syntax_error(text: &str, e: &serde_saphyr::Error) -> (Option<usize>, Option<String>, String) {
    let mut field = None;
    let _ = serde_saphyr::with_deserializer_from_str_with_options(text, options(text), |de| {
        serde_path_to_error::deserialize::<_, RawFile>(de)
            .map(drop)
            .map_err(|e| {
                // `Spanned` adds a `.value` level the file does not have.
                let path = e.path().to_string();
                field = non_root(path.trim_end_matches(".value").to_owned());
                e.into_inner()
            })
    });
    let line = e.location().map(|l| l.line() as usize).filter(|l| *l > 0);
    let message = if e.to_string().contains("end of input") {
        "the document is empty or cut off: `ips` is required (`ips: []` means no LB IPs)".to_owned()
    } else {
        clean_message(&e.to_string(), field.as_deref())
    };
    (line, field, message)
}

fn non_root(p: String) -> Option<String> {
    (p != "." && !p.is_empty()).then_some(p)
}

/// serde-saphyr prefixes "error: line X column Y: " (we print the line
/// ourselves), and messages may name the field again.
fn clean_message(msg: &str, field: Option<&str>) -> String {
    let first = msg.lines().next().unwrap_or(msg);
    let msg = match first.strip_prefix("error: ") {
        Some(rest) => match rest.find(": ") {
            Some(i) if rest[..i].starts_with("line ") => &rest[i + 2..],
            _ => rest,
        },
        None => first,
    };
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

fn is_unicast(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            !(v4.is_unspecified() || v4.is_broadcast() || v4.is_multicast() || v4.is_loopback())
        }
        IpAddr::V6(v6) => !(v6.is_unspecified() || v6.is_multicast() || v6.is_loopback()),
    }
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
            "{\"ips\": [\n  {\"ip\": \"198.51.100.1\"}\n  {\"ip\": \"198.51.100.2\"}\n]}",
        )
        .unwrap_err();
        assert_eq!(e.line, Some(3), "{e}");
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
    fn lines_come_from_the_parser_whatever_the_spelling() {
        // The same address spelt differently, and a longer address that
        // starts with it: each entry keeps its own line.
        let text = "ips:\n  - ip: 198.51.100.100\n  - ip: fd00:0:0::1\n  - ip: 198.51.100.10\n  - {ip: \"fd00::2\", owner: n1}\n";
        let f = p(text).unwrap();
        let line = |s: &str| f.ips[&s.parse::<IpAddr>().unwrap()].line;
        assert_eq!(
            (
                line("198.51.100.100"),
                line("fd00::1"),
                line("198.51.100.10"),
                line("fd00::2")
            ),
            (2, 3, 4, 5)
        );
    }

    /// 65,536 entries parse in linear time (the old line search was
    /// quadratic: minutes for this size). Timing goes to BENCHMARKS.md; this
    /// only guards against a return to quadratic behaviour: doubling the
    /// input must not come near quadrupling the time.
    #[test]
    fn parsing_is_linear() {
        let doc = |n: u32| {
            let mut t = String::from("ips:\n");
            for i in 0..n {
                let ip = std::net::Ipv4Addr::from(0xc612_0000u32 + i);
                t.push_str(&format!("  - ip: {ip}\n    owner: worker-{}\n", i % 50));
            }
            t
        };
        let time = |n: u32| {
            let text = doc(n);
            let t = std::time::Instant::now();
            let f = p(&text).unwrap();
            assert_eq!(f.ips.len(), n as usize);
            t.elapsed()
        };
        let (small, big) = (time(2_048), time(8_192));
        // Linear: ~4x; quadratic: ~16x. Allow noise up to 10x.
        assert!(
            big < small * 10,
            "4x the entries took {big:?} vs {small:?}: not linear"
        );
    }

    #[test]
    fn huge_and_hostile_documents_are_bounded() {
        // An alias bomb does not expand without limit.
        let bomb = "a: &a [1,1,1,1,1,1,1,1,1]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\nc: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\nd: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]\ne: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]\nf: [*e,*e,*e,*e,*e,*e,*e,*e,*e]\nips: []\n";
        assert!(p(bomb).is_err());
        // A huge service text is kept short.
        let long = "x".repeat(100_000);
        let f = p(&format!(
            "ips:\n  - ip: 198.51.100.1\n    service: {long}\n"
        ))
        .unwrap();
        let s = f.ips.values().next().unwrap().service.clone().unwrap();
        assert!(s.len() < 300 && s.ends_with("(100000 bytes)"), "{s}");
    }

    #[test]
    fn only_regular_files_within_the_limit_are_read() {
        let dir = std::env::temp_dir().join(format!("arp-guard-of-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("owners.yaml");
        std::fs::write(&file, "ips: []\n").unwrap();
        assert_eq!(read_bounded(&file, 100).unwrap(), "ips: []\n");
        let e = read_bounded(&file, 4).unwrap_err();
        assert!(e.message.contains("more than the limit of 4"), "{e}");
        // A symlink to a device is followed and refused, not read forever.
        let zero = dir.join("zero.yaml");
        let _ = std::fs::remove_file(&zero);
        std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
        let e = read_bounded(&zero, 1 << 20).unwrap_err();
        assert!(e.message.contains("character device"), "{e}");
        // A FIFO with no writer: refused at once instead of blocking.
        let fifo = dir.join("fifo.yaml");
        let _ = std::fs::remove_file(&fifo);
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: mkfifo with a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let e = read_bounded(&fifo, 1 << 20).unwrap_err();
        assert!(e.message.contains("FIFO"), "{e}");
        assert!(
            e.to_string().contains("fifo.yaml"),
            "the error names the path: {e}"
        );
        let e = read_bounded(&dir, 1 << 20).unwrap_err();
        assert!(e.message.contains("directory"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn node_names() {
        assert!(check_node_name("worker-1.example.com").is_ok());
        assert!(check_node_name("Worker").is_err());
        assert!(check_node_name("-a").is_err());
        assert!(check_node_name("a..b").is_err());
    }
}
