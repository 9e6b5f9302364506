//! A reproducible OCI image archive (`oci-archive`, the OCI image layout in
//! one tar), written by hand: one layer per platform holding the static
//! binary and a few read-only files (the CA bundle), no base image.
//!
//! Deterministic by construction: every mtime is [`Image::created`], owners
//! are 0:0, gzip carries no name and mtime 0, JSON keys are sorted and blobs
//! are stored in digest order, so the same binaries give the same digests.
//! Several platforms give a multi-arch image: the layout's `index.json` names
//! the tag and points to an image index with one manifest per platform.

use std::io::Write as _;

use anyhow::{Context as _, Result};
use serde_json::{json, Value};
use sha2::{Digest as _, Sha256};

pub const MEDIA_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const MEDIA_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const MEDIA_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
pub const MEDIA_LAYER: &str = "application/vnd.oci.image.layer.v1.tar+gzip";

/// What the image says about itself; the same for every platform.
#[derive(Debug, Clone)]
pub struct Image {
    /// `org.opencontainers.image.ref.name` of the layout's entry, e.g. `arp-guard:0.1.0`.
    pub ref_name: String,
    pub title: String,
    pub version: String,
    pub source: String,
    pub licenses: String,
    /// The VCS revision the binaries were built from, if known.
    pub revision: Option<String>,
    /// Seconds since the epoch: the `created` time and every file's mtime
    /// (SOURCE_DATE_EPOCH).
    pub created: i64,
    /// Where the binary lives in the image; also the entrypoint.
    pub path: String,
    /// The image's `User` ("uid:gid").
    pub user: String,
    /// File capabilities for the binary (e.g. `["CAP_BPF"]`, effective bit
    /// set), written as the `security.capability` xattr; empty for none.
    pub file_caps: Vec<String>,
    /// Other files, 0644 and root-owned: (absolute path, content).
    pub files: Vec<(String, Vec<u8>)>,
}

/// One platform's binary.
#[derive(Debug, Clone)]
pub struct Platform {
    /// OCI architecture: `amd64`, `arm64`.
    pub arch: String,
    pub binary: Vec<u8>,
}

/// What [`write`] produced.
#[derive(Debug, Clone)]
pub struct Written {
    /// The archive itself.
    pub archive: Vec<u8>,
    /// The digest `index.json` points to: the manifest of a single-platform
    /// image, else the image index (what a registry would call the image digest).
    pub digest: String,
    /// Per platform: (arch, manifest digest, compressed layer size).
    pub platforms: Vec<(String, String, u64)>,
}

/// The OCI architecture of a Rust target architecture.
pub fn oci_arch(rust_arch: &str) -> Option<&'static str> {
    match rust_arch {
        "x86_64" => Some("amd64"),
        "aarch64" => Some("arm64"),
        _ => None,
    }
}

/// Capability numbers (linux/capability.h) of the names [`Image::file_caps`] accepts.
fn cap_number(name: &str) -> Option<u32> {
    Some(match name {
        "CAP_NET_ADMIN" => 12,
        "CAP_NET_RAW" => 13,
        "CAP_SYS_ADMIN" => 21,
        "CAP_PERFMON" => 38,
        "CAP_BPF" => 39,
        _ => return None,
    })
}

/// The `security.capability` xattr value (struct vfs_cap_data,
/// VFS_CAP_REVISION_2, little endian) granting `caps` as permitted and
/// effective, nothing inheritable.
pub fn vfs_cap_v2(caps: &[String]) -> Result<Vec<u8>> {
    let mut permitted = 0u64;
    for c in caps {
        let n = cap_number(c).with_context(|| format!("unknown capability {c}"))?;
        permitted |= 1 << n;
    }
    const VFS_CAP_REVISION_2: u32 = 0x0200_0000;
    const VFS_CAP_FLAGS_EFFECTIVE: u32 = 0x1;
    let mut v = Vec::with_capacity(20);
    v.extend_from_slice(&(VFS_CAP_REVISION_2 | VFS_CAP_FLAGS_EFFECTIVE).to_le_bytes());
    v.extend_from_slice(&(permitted as u32).to_le_bytes());
    v.extend_from_slice(&0u32.to_le_bytes());
    v.extend_from_slice(&((permitted >> 32) as u32).to_le_bytes());
    v.extend_from_slice(&0u32.to_le_bytes());
    Ok(v)
}

pub fn sha256(data: &[u8]) -> String {
    let d = Sha256::digest(data);
    let hex: String = d.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

/// `v` with every object's keys in sorted order, whatever serde_json's map
/// type (the `preserve_order` feature keeps insertion order).
fn sorted(v: &Value) -> Value {
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            Value::Object(
                keys.into_iter()
                    .map(|k| (k.clone(), sorted(&m[k])))
                    .collect(),
            )
        }
        Value::Array(a) => Value::Array(a.iter().map(sorted).collect()),
        other => other.clone(),
    }
}

/// Canonical JSON bytes: sorted keys, no whitespace.
pub fn canonical_json(v: &Value) -> Vec<u8> {
    serde_json::to_vec(&sorted(v)).expect("a Value always serialises")
}

fn header(path: &str, kind: tar::EntryType, mode: u32, size: u64, mtime: i64) -> tar::Header {
    let mut h = tar::Header::new_ustar();
    h.set_path(path).expect("short relative path");
    h.set_entry_type(kind);
    h.set_mode(mode);
    h.set_size(size);
    h.set_mtime(mtime.max(0) as u64);
    h.set_uid(0);
    h.set_gid(0);
    h.set_cksum();
    h
}

/// One PAX extended header record, `"<len> <key>=<value>\n"`, where len
/// counts the whole record including its own digits.
fn pax_record(key: &str, value: &[u8]) -> Vec<u8> {
    let rest = 3 + key.len() + value.len(); // ' ', '=', '\n'
    let mut len = rest + 1;
    while len != rest + len.to_string().len() {
        len = rest + len.to_string().len();
    }
    let mut r = format!("{len} {key}=").into_bytes();
    r.extend_from_slice(value);
    r.push(b'\n');
    r
}

/// The layer: the directories leading to the files, the other files (0644),
/// then the binary (0755, root-owned, with its file capabilities if any).
fn layer_tar(image: &Image, binary: &[u8]) -> Result<Vec<u8>> {
    let path = image.path.trim_start_matches('/');
    let mut b = tar::Builder::new(Vec::new());
    let parts: Vec<&str> = path.split('/').collect();
    let mut dirs: Vec<String> = Vec::new();
    for p in image.files.iter().map(|f| f.0.as_str()).chain([path]) {
        let parts: Vec<&str> = p.trim_start_matches('/').split('/').collect();
        for i in 1..parts.len() {
            let dir = format!("{}/", parts[..i].join("/"));
            if !dirs.contains(&dir) {
                dirs.push(dir);
            }
        }
    }
    for dir in &dirs {
        b.append(
            &header(dir, tar::EntryType::Directory, 0o755, 0, image.created),
            std::io::empty(),
        )?;
    }
    for (name, data) in &image.files {
        let name = name.trim_start_matches('/');
        let h = header(
            name,
            tar::EntryType::Regular,
            0o644,
            data.len() as u64,
            image.created,
        );
        b.append(&h, data.as_slice())?;
    }
    if !image.file_caps.is_empty() {
        // How GNU tar --xattrs, Go's archive/tar (containerd, podman) and
        // umoci carry extended attributes.
        let pax = pax_record(
            "SCHILY.xattr.security.capability",
            &vfs_cap_v2(&image.file_caps)?,
        );
        let name = format!("PaxHeaders/{}", parts[parts.len() - 1]);
        b.append(
            &header(
                &name,
                tar::EntryType::XHeader,
                0o644,
                pax.len() as u64,
                image.created,
            ),
            pax.as_slice(),
        )?;
    }
    b.append(
        &header(
            path,
            tar::EntryType::Regular,
            0o755,
            binary.len() as u64,
            image.created,
        ),
        binary,
    )?;
    Ok(b.into_inner()?)
}

fn gzip(data: &[u8]) -> Result<Vec<u8>> {
    let mut gz = flate2::GzBuilder::new()
        .mtime(0)
        .write(Vec::new(), flate2::Compression::best());
    gz.write_all(data)?;
    Ok(gz.finish()?)
}

/// RFC 3339 UTC for seconds since the epoch (civil-from-days, H. Hinnant).
pub fn rfc3339(secs: i64) -> String {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

impl Image {
    /// The OCI annotations / config labels.
    pub fn labels(&self) -> Value {
        let mut l = json!({
            "org.opencontainers.image.title": self.title,
            "org.opencontainers.image.version": self.version,
            "org.opencontainers.image.source": self.source,
            "org.opencontainers.image.licenses": self.licenses,
            "org.opencontainers.image.created": rfc3339(self.created),
        });
        if let Some(r) = &self.revision {
            l["org.opencontainers.image.revision"] = json!(r);
        }
        l
    }
}

/// Content-addressed blobs, by digest.
#[derive(Default)]
struct Blobs(std::collections::BTreeMap<String, Vec<u8>>);

impl Blobs {
    /// Store `data`; its descriptor.
    fn add(&mut self, media_type: &str, data: Vec<u8>) -> Value {
        let digest = sha256(&data);
        let d = json!({"mediaType": media_type, "digest": digest, "size": data.len()});
        self.0.insert(digest, data);
        d
    }
}

/// The manifest of one platform; its descriptor (with `platform`) and layer size.
fn platform_manifest(blobs: &mut Blobs, image: &Image, p: &Platform) -> Result<(Value, u64)> {
    let raw = layer_tar(image, &p.binary)?;
    let diff_id = sha256(&raw);
    let layer = blobs.add(MEDIA_LAYER, gzip(&raw)?);
    let layer_size = layer["size"].as_u64().unwrap_or(0);
    let created = rfc3339(image.created);
    let mut platform = json!({"architecture": p.arch, "os": "linux"});
    if p.arch == "arm64" {
        platform["variant"] = json!("v8");
    }
    let mut config = json!({
        "created": created,
        "architecture": p.arch,
        "os": "linux",
        "config": {
            "User": image.user,
            "Entrypoint": [image.path],
            "Cmd": ["--help"],
            "Env": ["PATH=/usr/local/bin"],
            "Labels": image.labels(),
        },
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created": created, "created_by": "cargo xtask image"}],
    });
    if let Some(v) = platform.get("variant") {
        config["variant"] = v.clone();
    }
    let config = blobs.add(MEDIA_CONFIG, canonical_json(&config));
    let manifest = json!({
        "schemaVersion": 2,
        "mediaType": MEDIA_MANIFEST,
        "config": config,
        "layers": [layer],
        "annotations": image.labels(),
    });
    let mut d = blobs.add(MEDIA_MANIFEST, canonical_json(&manifest));
    d["platform"] = platform;
    Ok((d, layer_size))
}

/// The image as an `oci-archive`.
pub fn write(image: &Image, platforms: &[Platform]) -> Result<Written> {
    anyhow::ensure!(
        !platforms.is_empty(),
        "an image needs at least one platform"
    );
    let mut blobs = Blobs::default();
    let mut descriptors = Vec::new();
    let mut summary = Vec::new();
    for p in platforms {
        let (d, layer_size) = platform_manifest(&mut blobs, image, p)?;
        summary.push((
            p.arch.clone(),
            d["digest"].as_str().unwrap_or_default().to_owned(),
            layer_size,
        ));
        descriptors.push(d);
    }
    let mut top = if let [single] = descriptors.as_slice() {
        let mut d = single.clone();
        d.as_object_mut().map(|m| m.remove("platform"));
        d
    } else {
        let index = json!({
            "schemaVersion": 2,
            "mediaType": MEDIA_INDEX,
            "manifests": descriptors,
            "annotations": image.labels(),
        });
        blobs.add(MEDIA_INDEX, canonical_json(&index))
    };
    top["annotations"] = json!({"org.opencontainers.image.ref.name": image.ref_name});
    let digest = top["digest"].as_str().unwrap_or_default().to_owned();
    let index = json!({"schemaVersion": 2, "mediaType": MEDIA_INDEX, "manifests": [top]});

    let t = image.created;
    let mut b = tar::Builder::new(Vec::new());
    let file = |b: &mut tar::Builder<Vec<u8>>, name: &str, data: &[u8]| {
        b.append(
            &header(name, tar::EntryType::Regular, 0o644, data.len() as u64, t),
            data,
        )
    };
    for dir in ["blobs/", "blobs/sha256/"] {
        b.append(
            &header(dir, tar::EntryType::Directory, 0o755, 0, t),
            std::io::empty(),
        )?;
    }
    file(&mut b, "oci-layout", br#"{"imageLayoutVersion":"1.0.0"}"#)?;
    file(&mut b, "index.json", &canonical_json(&index))?;
    for (digest, data) in &blobs.0 {
        let hex = digest.trim_start_matches("sha256:");
        file(&mut b, &format!("blobs/sha256/{hex}"), data)?;
    }
    Ok(Written {
        archive: b.into_inner()?,
        digest,
        platforms: summary,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(file_caps: &[&str]) -> Image {
        Image {
            ref_name: "arp-guard:0.1.0".into(),
            title: "arp-guard".into(),
            version: "0.1.0".into(),
            source: "https://example.invalid/arp-guard".into(),
            licenses: "MIT OR Apache-2.0".into(),
            revision: Some("abc".into()),
            created: 1_700_000_000,
            path: "/usr/local/bin/arp-guard".into(),
            user: "0:0".into(),
            file_caps: file_caps.iter().map(|s| s.to_string()).collect(),
            files: Vec::new(),
        }
    }

    fn platform(arch: &str) -> Platform {
        Platform {
            arch: arch.into(),
            binary: format!("\x7fELF {arch} binary").into_bytes(),
        }
    }

    /// An entry of a tar: name, header, data, PAX extensions.
    type Entry = (String, tar::Header, Vec<u8>, Vec<(String, Vec<u8>)>);

    /// Every entry of a tar.
    fn entries(tar_bytes: &[u8]) -> Vec<Entry> {
        let mut a = tar::Archive::new(tar_bytes);
        let mut out = Vec::new();
        for e in a.entries().unwrap() {
            let mut e = e.unwrap();
            let pax = e
                .pax_extensions()
                .unwrap()
                .map(|exts| {
                    exts.map(|x| {
                        let x = x.unwrap();
                        (x.key().unwrap().to_owned(), x.value_bytes().to_vec())
                    })
                    .collect()
                })
                .unwrap_or_default();
            let mut data = Vec::new();
            std::io::Read::read_to_end(&mut e, &mut data).unwrap();
            let name = e.path().unwrap().to_string_lossy().into_owned();
            out.push((name, e.header().clone(), data, pax));
        }
        out
    }

    fn blob(archive: &[u8], digest: &str) -> Vec<u8> {
        let name = format!("blobs/sha256/{}", digest.trim_start_matches("sha256:"));
        let found = entries(archive).into_iter().find(|(n, ..)| *n == name);
        let data = found.unwrap_or_else(|| panic!("no {name}")).2;
        assert_eq!(sha256(&data), digest, "blob content matches its name");
        data
    }

    /// The uncompressed tar of the manifest's first layer.
    fn first_layer(archive: &[u8], manifest: &Value) -> Vec<u8> {
        let gz = blob(archive, manifest["layers"][0]["digest"].as_str().unwrap());
        let mut raw = Vec::new();
        std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(gz.as_slice()), &mut raw)
            .unwrap();
        raw
    }

    fn json_blob(archive: &[u8], digest: &str) -> Value {
        serde_json::from_slice(&blob(archive, digest)).unwrap()
    }

    #[test]
    fn same_input_same_bytes() {
        let a = write(&image(&[]), &[platform("amd64")]).unwrap();
        let b = write(&image(&[]), &[platform("amd64")]).unwrap();
        assert_eq!(a.archive, b.archive);
        assert_eq!(a.digest, b.digest);
        let mut other = platform("amd64");
        other.binary.push(0);
        assert_ne!(write(&image(&[]), &[other]).unwrap().digest, a.digest);
    }

    #[test]
    fn single_platform_layout() {
        let w = write(&image(&[]), &[platform("amd64")]).unwrap();
        let names: Vec<String> = entries(&w.archive).into_iter().map(|e| e.0).collect();
        assert_eq!(
            names[..4],
            ["blobs/", "blobs/sha256/", "oci-layout", "index.json"]
        );
        let index: Value = serde_json::from_slice(
            &entries(&w.archive)
                .into_iter()
                .find(|e| e.0 == "index.json")
                .unwrap()
                .2,
        )
        .unwrap();
        let top = &index["manifests"][0];
        assert_eq!(top["digest"], w.digest);
        assert_eq!(top["mediaType"], MEDIA_MANIFEST);
        assert_eq!(
            top["annotations"]["org.opencontainers.image.ref.name"],
            "arp-guard:0.1.0"
        );
        let manifest = json_blob(&w.archive, &w.digest);
        let config = json_blob(&w.archive, manifest["config"]["digest"].as_str().unwrap());
        assert_eq!(config["architecture"], "amd64");
        assert_eq!(config["config"]["User"], "0:0");
        assert_eq!(
            config["config"]["Entrypoint"][0],
            "/usr/local/bin/arp-guard"
        );
        let labels = &config["config"]["Labels"];
        assert_eq!(labels["org.opencontainers.image.version"], "0.1.0");
        assert_eq!(labels["org.opencontainers.image.revision"], "abc");
        assert_eq!(
            labels["org.opencontainers.image.created"],
            "2023-11-14T22:13:20Z"
        );
        // The layer: directories, then the binary, 0755, root, fixed mtime.
        let raw = first_layer(&w.archive, &manifest);
        assert_eq!(config["rootfs"]["diff_ids"][0], sha256(&raw));
        let layer = entries(&raw);
        let names: Vec<&str> = layer.iter().map(|e| e.0.as_str()).collect();
        assert_eq!(
            names,
            [
                "usr/",
                "usr/local/",
                "usr/local/bin/",
                "usr/local/bin/arp-guard"
            ]
        );
        let (_, h, data, pax) = &layer[3];
        assert_eq!(data, &platform("amd64").binary);
        assert_eq!(h.mode().unwrap(), 0o755);
        assert_eq!(
            (h.uid().unwrap(), h.gid().unwrap(), h.mtime().unwrap()),
            (0, 0, 1_700_000_000)
        );
        assert!(pax.is_empty(), "no file capabilities unless asked");
    }

    #[test]
    fn other_files_are_read_only_and_come_with_their_directories() {
        let mut img = image(&[]);
        img.files = vec![("/etc/ssl/certs/ca.crt".into(), b"PEM".to_vec())];
        let w = write(&img, &[platform("amd64")]).unwrap();
        let raw = first_layer(&w.archive, &json_blob(&w.archive, &w.digest));
        let layer = entries(&raw);
        let names: Vec<&str> = layer.iter().map(|e| e.0.as_str()).collect();
        assert_eq!(
            names,
            [
                "etc/",
                "etc/ssl/",
                "etc/ssl/certs/",
                "usr/",
                "usr/local/",
                "usr/local/bin/",
                "etc/ssl/certs/ca.crt",
                "usr/local/bin/arp-guard"
            ]
        );
        let (_, h, data, _) = &layer[6];
        assert_eq!((h.mode().unwrap(), data.as_slice()), (0o644, &b"PEM"[..]));
    }

    #[test]
    fn file_caps_travel_as_a_pax_xattr() {
        let caps = ["CAP_BPF", "CAP_PERFMON", "CAP_NET_ADMIN"];
        let w = write(&image(&caps), &[platform("amd64")]).unwrap();
        let manifest = json_blob(&w.archive, &w.digest);
        let raw = first_layer(&w.archive, &manifest);
        let layer = entries(&raw);
        let (name, _, _, pax) = layer.last().unwrap();
        assert_eq!(name, "usr/local/bin/arp-guard");
        assert_eq!(pax.len(), 1);
        assert_eq!(pax[0].0, "SCHILY.xattr.security.capability");
        // What `setcap cap_bpf,cap_perfmon,cap_net_admin+ep` writes.
        let want = [
            0x01, 0, 0, 0x02, // revision 2, effective
            0, 0x10, 0, 0, // permitted low: NET_ADMIN (12)
            0, 0, 0, 0, // inheritable low
            0xc0, 0, 0, 0, // permitted high: PERFMON (38), BPF (39)
            0, 0, 0, 0, // inheritable high
        ];
        assert_eq!(pax[0].1, want);
    }

    #[test]
    fn several_platforms_make_an_index() {
        let w = write(&image(&[]), &[platform("amd64"), platform("arm64")]).unwrap();
        let index = json_blob(&w.archive, &w.digest);
        assert_eq!(index["mediaType"], MEDIA_INDEX);
        let archs: Vec<&str> = index["manifests"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["platform"]["architecture"].as_str().unwrap())
            .collect();
        assert_eq!(archs, ["amd64", "arm64"]);
        assert_eq!(index["manifests"][1]["platform"]["variant"], "v8");
        for (arch, digest, _) in &w.platforms {
            let manifest = json_blob(&w.archive, digest);
            let config = json_blob(&w.archive, manifest["config"]["digest"].as_str().unwrap());
            assert_eq!(config["architecture"], arch.as_str());
        }
    }

    #[test]
    fn pax_record_length_counts_itself() {
        for n in [0, 1, 5, 6, 7, 90, 95, 96, 97, 1000] {
            let r = pax_record("k", &vec![b'x'; n]);
            let (len, _) = std::str::from_utf8(&r[..r.iter().position(|&c| c == b' ').unwrap()])
                .map(|s| (s.parse::<usize>().unwrap(), ()))
                .unwrap();
            assert_eq!(len, r.len(), "value of {n} bytes");
        }
    }

    #[test]
    fn rfc3339_dates() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_700_000_000), "2023-11-14T22:13:20Z");
    }
}
