//! promtool, for `promtool check rules` in the tests. Debian ships it only
//! inside the `prometheus` package, whose installation would also enable and
//! start a Prometheus server on this machine; so the package is downloaded
//! and only its `promtool` binary is unpacked.

use std::{path::Path, process::Command};

use anyhow::{bail, Context as _, Result};

use crate::run;

/// Where the unpacked promtool goes (on PATH).
const TARGET: &str = "/usr/local/bin/promtool";

pub fn install() -> Result<()> {
    let works = |p: &str| {
        Command::new(p)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if works("promtool") || works(TARGET) {
        return Ok(());
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("promtool is missing; run `cargo xtask setup` as root to install it");
    }
    let dir = std::env::temp_dir().join(format!("xtask-promtool-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let result = (|| -> Result<()> {
        let download = |dir: &Path| {
            run(Command::new("apt-get")
                .args(["download", "-qq", "prometheus"])
                .current_dir(dir))
        };
        if download(&dir).is_err() {
            run(Command::new("apt-get").args(["update", "-qq"]))?;
            download(&dir)?;
        }
        let deb = std::fs::read_dir(&dir)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| p.extension().is_some_and(|x| x == "deb"))
            .context("apt-get download prometheus left no .deb")?;
        let root = dir.join("root");
        run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&root))?;
        std::fs::copy(root.join("usr/bin/promtool"), TARGET)
            .with_context(|| format!("installing {TARGET}"))?;
        Ok(())
    })();
    let _ = std::fs::remove_dir_all(&dir);
    result?;
    if !works(TARGET) {
        bail!("{TARGET} does not run");
    }
    eprintln!("xtask setup: promtool unpacked from Debian's prometheus package to {TARGET}");
    Ok(())
}
