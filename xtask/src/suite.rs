//! The test suite as built executables. One `cargo test --no-run` builds
//! every test binary once; the host run, the VM lane and the benches'
//! short run take their executables from here instead of calling cargo
//! again. (Each cargo call that selected other packages resolved other
//! features — guard's dev-dependency on tokio's `test-util`, for one — and
//! rebuilt tokio's dependents: a fresh CI built kube, hyper and rustls four
//! times.)

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

use anyhow::{bail, Context as _, Result};

/// How long one test executable may run, on the host or in the VM lane,
/// before it is killed and reported with the output it printed. The
/// slowest take about 100 s here (300 s emulated on a loaded machine); a
/// hung one would otherwise be silence until CI's own limit, with its
/// held output lost.
pub const BINARY_DEADLINE: Duration = Duration::from_secs(900);

/// What a test executable holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A library's or binary's own `#[test]`s.
    Unit,
    /// An integration test (`[[test]]`).
    Test,
    /// A bench (`[[bench]]`), built like a test and run by `xtask bench`.
    Bench,
}

/// One built test executable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exe {
    /// The target's name (`probing`, `guard`, ...).
    pub name: String,
    /// As `cargo test` shows it: `probing.rs`, `unittests src/lib.rs`.
    pub shown: String,
    pub kind: Kind,
    pub path: PathBuf,
    /// The package's directory: `cargo test` runs each executable there.
    pub dir: PathBuf,
}

/// Make `cmd` (a cargo build of the dev profile) also what `cargo clippy
/// -- -D warnings` is: the workspace's crates are compiled by clippy-driver
/// (cargo's `RUSTC_WORKSPACE_WRAPPER`, which is how `cargo clippy` runs it,
/// over `cargo check`), so that one compile lints them and builds them. A
/// separate `cargo clippy` type-checked the whole workspace and its
/// dependencies a second time (three minutes of a fresh CI). Every cargo
/// call that shares these artefacts must be given the same (cargo rebuilds
/// a crate whose wrapper changed). The dependencies are built by rustc as
/// before; clippy-driver builds the workspace's own test executables
/// unoptimised anyway (it turns MIR optimisations off).
pub fn lint_while_building(cmd: &mut Command) -> Result<()> {
    let cargo = std::env::var_os("CARGO").map(PathBuf::from);
    let driver = cargo
        .as_deref()
        .map(|c| c.with_file_name("clippy-driver"))
        .filter(|d| d.exists())
        .context(
            "clippy-driver is not next to the cargo that runs xtask: rustup component add clippy",
        )?;
    // clippy-driver reads the lint arguments from CLIPPY_ARGS, each ended by
    // this separator (what `cargo clippy -- -D warnings` sets).
    cmd.env("RUSTC_WORKSPACE_WRAPPER", driver).env(
        "CLIPPY_ARGS",
        "-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__",
    );
    Ok(())
}

/// Run `cmd` (a `cargo test ... --no-run`) with JSON messages and return
/// the test executables it built, in cargo's order. Diagnostics still
/// reach the terminal (`json-render-diagnostics`).
pub fn build(mut cmd: Command) -> Result<Vec<Exe>> {
    cmd.arg("--message-format=json-render-diagnostics")
        .stdout(Stdio::piped());
    eprintln!("xtask: running {cmd:?}");
    let out = cmd.output().with_context(|| format!("spawning {cmd:?}"))?;
    if !out.status.success() {
        bail!("{cmd:?} failed with {}", out.status);
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let exes: Vec<Exe> = text.lines().filter_map(parse).collect();
    if exes.is_empty() {
        bail!("{cmd:?} built no test executable");
    }
    Ok(exes)
}

/// One line of cargo's JSON output: a built test executable, if it is one.
fn parse(line: &str) -> Option<Exe> {
    let v: serde_json::Value = serde_json::from_str(line).ok()?;
    if v["reason"] != "compiler-artifact" || v["profile"]["test"] != true {
        return None;
    }
    let path = PathBuf::from(v["executable"].as_str()?);
    let target = &v["target"];
    let kind = match target["kind"][0].as_str()? {
        "lib" | "rlib" | "bin" | "proc-macro" => Kind::Unit,
        "test" => Kind::Test,
        "bench" => Kind::Bench,
        _ => return None,
    };
    let dir = Path::new(v["manifest_path"].as_str()?)
        .parent()?
        .to_path_buf();
    let src = Path::new(target["src_path"].as_str()?);
    let rel = src.strip_prefix(&dir).unwrap_or(src).display().to_string();
    let shown = match kind {
        Kind::Unit => format!("unittests {rel}"),
        Kind::Test | Kind::Bench => rel,
    };
    Some(Exe {
        name: target["name"].as_str()?.to_owned(),
        shown,
        kind,
        path,
        dir,
    })
}

/// The executables of `kind` named in `names`, in the order of `names`;
/// an error names the ones missing.
pub fn pick<'a>(exes: &'a [Exe], kind: Kind, names: &[&str]) -> Result<Vec<&'a Exe>> {
    let mut found = Vec::new();
    let mut missing = Vec::new();
    for n in names {
        match exes.iter().find(|e| e.kind == kind && e.name == *n) {
            Some(e) => found.push(e),
            None => missing.push(*n),
        }
    }
    if !missing.is_empty() {
        bail!("no {kind:?} executable built for {missing:?}");
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn artifact(kind: &str, name: &str, src: &str, test: bool, exe: &str) -> String {
        serde_json::json!({
            "reason": "compiler-artifact",
            "manifest_path": "/w/tests/Cargo.toml",
            "target": {"kind": [kind], "name": name, "src_path": src},
            "profile": {"test": test},
            "executable": exe,
        })
        .to_string()
    }

    #[test]
    fn test_executables_are_read_from_cargos_messages() {
        let lines = [
            artifact(
                "test",
                "probing",
                "/w/tests/probing.rs",
                true,
                "/t/probing-1",
            ),
            artifact(
                "lib",
                "testbed",
                "/w/tests/testbed/lib.rs",
                true,
                "/t/testbed-2",
            ),
            artifact(
                "bench",
                "refresh",
                "/w/tests/benches/refresh.rs",
                true,
                "/t/refresh-3",
            ),
            // The library itself (not a test) and a build script: none.
            artifact("lib", "testbed", "/w/tests/testbed/lib.rs", false, "/t/x"),
            artifact(
                "custom-build",
                "build-script-build",
                "/w/build.rs",
                false,
                "/t/b",
            ),
            r#"{"reason":"build-finished","success":true}"#.to_owned(),
        ];
        let got: Vec<Exe> = lines.iter().filter_map(|l| parse(l)).collect();
        let shown: Vec<(&str, Kind, &str)> = got
            .iter()
            .map(|e| (e.name.as_str(), e.kind, e.shown.as_str()))
            .collect();
        assert_eq!(
            shown,
            [
                ("probing", Kind::Test, "probing.rs"),
                ("testbed", Kind::Unit, "unittests testbed/lib.rs"),
                ("refresh", Kind::Bench, "benches/refresh.rs"),
            ]
        );
        assert_eq!(got[0].dir, PathBuf::from("/w/tests"));
        assert_eq!(got[0].path, PathBuf::from("/t/probing-1"));
        let picked = pick(&got, Kind::Test, &["probing"]).unwrap();
        assert_eq!(picked[0].path, PathBuf::from("/t/probing-1"));
        let err = pick(&got, Kind::Test, &["probing", "refresh"]).unwrap_err();
        assert!(err.to_string().contains("refresh"), "{err}");
    }
}
