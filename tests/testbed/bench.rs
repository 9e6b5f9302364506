//! What the benches share: the short mode CI runs, samples with their
//! spread, and the JIT image's instruction count.
//!
//! Every bench prints `RESULT <table> <row> <column>=<value> ...` lines next to
//! its human text; `cargo xtask bench` turns them into BENCHMARKS.md tables.
//! A value `median/min/max` is shown as "median (min–max)".

/// `BENCH_SHORT=1`: small sizes and few samples, to show in CI that the
/// bench still runs (no timing is asserted anywhere).
pub fn short() -> bool {
    std::env::var_os("BENCH_SHORT").is_some_and(|v| v != "0")
}

/// Measurements of one quantity, in the order taken.
#[derive(Debug, Clone, Default)]
pub struct Samples(Vec<f64>);

impl Samples {
    pub fn new() -> Self {
        Samples::default()
    }

    pub fn push(&mut self, v: f64) {
        self.0.push(v);
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn sorted(&self) -> Vec<f64> {
        let mut s = self.0.clone();
        s.sort_by(f64::total_cmp);
        s
    }

    /// The value at quantile `p` (0..=1), nearest rank; NaN when empty.
    pub fn quantile(&self, p: f64) -> f64 {
        let s = self.sorted();
        if s.is_empty() {
            return f64::NAN;
        }
        s[((s.len() - 1) as f64 * p).round() as usize]
    }

    pub fn median(&self) -> f64 {
        self.quantile(0.5)
    }

    pub fn min(&self) -> f64 {
        self.quantile(0.0)
    }

    pub fn max(&self) -> f64 {
        self.quantile(1.0)
    }

    /// `median/min/max` for a RESULT line, with `decimals` digits.
    pub fn spread_with(&self, decimals: usize) -> String {
        format!(
            "{:.d$}/{:.d$}/{:.d$}",
            self.median(),
            self.min(),
            self.max(),
            d = decimals
        )
    }

    /// `median/min/max`, whole numbers.
    pub fn spread(&self) -> String {
        self.spread_with(0)
    }
}

/// The JIT image of a loaded program, through BPF_OBJ_GET_INFO_BY_FD (bpftool
/// can only dump it when built with a disassembler, which Debian's is not).
/// `len` is the image's size (`jited_prog_len`, from the program's info).
pub fn jited_image(prog: std::os::fd::BorrowedFd<'_>, len: u32) -> Option<Vec<u8>> {
    use std::os::fd::AsRawFd as _;
    const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
    let fd = prog.as_raw_fd();
    let mut image = vec![0u8; len as usize];
    // struct bpf_prog_info up to the fields used: type, id, tag[8],
    // jited_prog_len (offset 16), xlated_prog_len, jited_prog_insns (offset 24).
    let mut info = [0u8; 256];
    info[16..20].copy_from_slice(&len.to_ne_bytes());
    info[24..32].copy_from_slice(&(image.as_mut_ptr() as u64).to_ne_bytes());
    // The `info` member of union bpf_attr: bpf_fd, info_len, info pointer.
    #[repr(C)]
    struct InfoAttr {
        bpf_fd: u32,
        info_len: u32,
        info: u64,
    }
    let attr = InfoAttr {
        bpf_fd: fd as u32,
        info_len: info.len() as u32,
        info: info.as_mut_ptr() as u64,
    };
    // SAFETY: attr points at live buffers of the sizes given; the kernel
    // writes at most `len` bytes of image and `info_len` bytes of info.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_OBJ_GET_INFO_BY_FD,
            &attr as *const InfoAttr,
            std::mem::size_of::<InfoAttr>(),
        )
    };
    (rc == 0).then_some(image)
}

/// x86 instructions in a JIT image, counted by `objdump`. `None` when it is
/// missing or the architecture is not x86-64.
pub fn count_x86_insns(image: &[u8]) -> Option<usize> {
    if !cfg!(target_arch = "x86_64") || image.is_empty() {
        return None;
    }
    let dir = crate::bed::TempDir::new("jit").ok()?;
    let path = dir.path().join("image");
    std::fs::write(&path, image).ok()?;
    let out = std::process::Command::new("objdump")
        .args(["-D", "-b", "binary", "-m", "i386:x86-64"])
        .arg(&path)
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    // Instruction lines read "   1f:\t48 89 e5 \tmov ...".
    let n = text
        .lines()
        .filter(|l| {
            let mut parts = l.trim_start().splitn(2, ":\t");
            matches!((parts.next(), parts.next()),
                (Some(a), Some(_)) if !a.is_empty() && a.chars().all(|c| c.is_ascii_hexdigit()))
        })
        .count();
    (n > 0).then_some(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_and_quantiles() {
        let mut s = Samples::new();
        for v in [5.0, 1.0, 3.0, 4.0, 2.0] {
            s.push(v);
        }
        assert_eq!(s.median(), 3.0);
        assert_eq!(s.spread(), "3/1/5");
        assert_eq!(s.quantile(0.99), 5.0);
        assert!(Samples::new().median().is_nan());
    }
}
