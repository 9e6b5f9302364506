//! A `newc` cpio archive, the format the kernel unpacks as its initramfs.
//! Written here (a header of hex fields per entry) so the lane needs no
//! cpio tool; parent directories are added before their first child.

use std::{
    collections::BTreeSet,
    io::Write,
    path::{Component, Path},
};

use anyhow::{bail, Result};

pub struct Cpio<W: Write> {
    out: W,
    ino: u32,
    dirs: BTreeSet<String>,
    written: u64,
}

impl<W: Write> Cpio<W> {
    pub fn new(out: W) -> Cpio<W> {
        Cpio {
            out,
            ino: 1,
            dirs: BTreeSet::new(),
            written: 0,
        }
    }

    /// The archive's name for an absolute guest path ("usr/bin/ip").
    fn name(path: &str) -> Result<String> {
        let p = Path::new(path);
        let mut parts = Vec::new();
        for c in p.components() {
            match c {
                Component::RootDir => {}
                Component::Normal(s) => parts.push(s.to_string_lossy().into_owned()),
                _ => bail!("guest path {path:?} must be absolute and plain"),
            }
        }
        if parts.is_empty() {
            bail!("guest path {path:?} names the root");
        }
        Ok(parts.join("/"))
    }

    fn header(&mut self, name: &str, mode: u32, size: usize) -> Result<()> {
        self.ino += 1;
        let fields = [
            self.ino,
            mode,
            0,
            0,
            1,
            0,
            size as u32,
            0,
            0,
            0,
            0,
            (name.len() + 1) as u32,
            0,
        ];
        let mut h = String::from("070701");
        for f in fields {
            h.push_str(&format!("{f:08x}"));
        }
        self.raw(h.as_bytes())?;
        self.raw(name.as_bytes())?;
        self.raw(&[0])?;
        self.pad()
    }

    fn raw(&mut self, b: &[u8]) -> Result<()> {
        self.out.write_all(b)?;
        self.written += b.len() as u64;
        Ok(())
    }

    fn pad(&mut self) -> Result<()> {
        let n = (4 - (self.written % 4) as usize) % 4;
        self.raw(&[0; 3][..n])
    }

    fn parents(&mut self, name: &str) -> Result<()> {
        let mut acc = String::new();
        let parts: Vec<&str> = name.split('/').collect();
        for part in &parts[..parts.len() - 1] {
            if !acc.is_empty() {
                acc.push('/');
            }
            acc.push_str(part);
            if self.dirs.insert(acc.clone()) {
                let d = acc.clone();
                self.header(&d, 0o040755, 0)?;
            }
        }
        Ok(())
    }

    pub fn dir(&mut self, path: &str) -> Result<()> {
        let name = Self::name(path)?;
        self.parents(&name)?;
        if self.dirs.insert(name.clone()) {
            self.header(&name, 0o040755, 0)?;
        }
        Ok(())
    }

    pub fn file(&mut self, path: &str, mode: u32, data: &[u8]) -> Result<()> {
        let name = Self::name(path)?;
        self.parents(&name)?;
        self.header(&name, 0o100000 | mode, data.len())?;
        self.raw(data)?;
        self.pad()
    }

    pub fn symlink(&mut self, path: &str, target: &str) -> Result<()> {
        let name = Self::name(path)?;
        self.parents(&name)?;
        self.header(&name, 0o120777, target.len())?;
        self.raw(target.as_bytes())?;
        self.pad()
    }

    pub fn finish(mut self) -> Result<W> {
        self.header("TRAILER!!!", 0, 0)?;
        self.out.flush()?;
        Ok(self.out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn newc_entries_are_aligned_and_parents_come_first() {
        let mut c = Cpio::new(Vec::new());
        c.file("/a/b/c", 0o755, b"hello").unwrap();
        c.symlink("/bin/sh", "busybox").unwrap();
        let out = c.finish().unwrap();
        let text = String::from_utf8_lossy(&out);
        let a = text.find("a\0").unwrap();
        let ab = text.find("a/b\0").unwrap();
        let abc = text.find("a/b/c\0").unwrap();
        assert!(a < ab && ab < abc, "parents before children");
        assert_eq!(out.len() % 4, 0);
        assert!(text.contains("hello"));
        assert!(text.ends_with("TRAILER!!!\0\0\0\0") || text.contains("TRAILER!!!"));
        // Every header starts on a 4-byte boundary with the newc magic.
        let heads: Vec<usize> = text.match_indices("070701").map(|(i, _)| i).collect();
        assert_eq!(heads.len(), 6, "a, a/b, a/b/c, bin, bin/sh, trailer");
        assert!(heads.iter().all(|i| i % 4 == 0));
    }

    #[test]
    fn relative_paths_are_refused() {
        let mut c = Cpio::new(Vec::new());
        assert!(c.file("x/../y", 0o644, b"").is_err());
        assert!(c.file("/", 0o644, b"").is_err());
    }
}
