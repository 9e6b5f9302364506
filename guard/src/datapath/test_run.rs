//! Running the loaded programs through BPF_PROG_TEST_RUN, for the tests
//! and benchmarks (nothing is transmitted). Built with the `testing`
//! feature only.

use aya::programs::SchedClassifier;

use super::{census, error::DatapathError, Datapath, Result, PROGRAM};

impl Datapath {
    /// Run the loaded program on `frame` with BPF_PROG_TEST_RUN (nothing is
    /// transmitted). Returns the program's return code and the frame as the
    /// program left it. The kernel runs it with the loopback device as the
    /// egress interface and a dummy socket of family AF_UNSPEC, so the frame
    /// counts as kernel-originated.
    pub fn test_run(&self, frame: &[u8]) -> Result<(i32, Vec<u8>)> {
        self.test_run_from(frame, 0)
    }

    /// The same as a frame that came in through `ingress_ifindex` (non-zero:
    /// a redirected frame, origin `redirect`).
    pub fn test_run_from(&self, frame: &[u8], ingress_ifindex: u32) -> Result<(i32, Vec<u8>)> {
        test_run_on(self.program()?, frame, ingress_ifindex)
    }

    /// Whether this kernel's BPF_PROG_TEST_RUN can name an ingress device
    /// (Linux 5.12): without it, the `redirect` origin cannot be tested so.
    pub fn test_run_sets_ingress(&self) -> bool {
        let frame = [0u8; 60];
        self.test_run_from(&frame, 1).is_ok()
    }

    /// Average kernel time of one program run on `frame` over `repeat` runs
    /// (BPF_PROG_TEST_RUN's own timing; for benchmarks).
    pub fn test_run_timed(&self, frame: &[u8], repeat: u32) -> Result<std::time::Duration> {
        timed_on(self.program()?, frame, repeat)
    }

    /// Run the census program on `frame` (BPF_PROG_TEST_RUN, lo as the device).
    pub fn census_test_run(&self, frame: &[u8]) -> Result<(i32, Vec<u8>)> {
        test_run_on(self.census_program()?, frame, 0)
    }

    /// Mean kernel time of one census run on `frame` (for benchmarks).
    pub fn census_test_run_timed(&self, frame: &[u8], repeat: u32) -> Result<std::time::Duration> {
        timed_on(self.census_program()?, frame, repeat)
    }

    /// The egress and census programs as loaded, for the benchmarks.
    pub fn programs(&self) -> Result<[(&'static str, &SchedClassifier); 2]> {
        Ok([
            (PROGRAM, self.program()?),
            (census::CENSUS_PROGRAM, self.census_program()?),
        ])
    }

    /// Empty COUNTERS, so that what one run counts is all it holds (the
    /// tests that judge a frame at a time read it before and after).
    pub fn clear_counters(&mut self) -> Result<()> {
        use aya::maps::{MapData, PerCpuHashMap};
        use guard_common::{CounterKey, CounterValue, MAP_COUNTERS};
        let map = (self.ebpf)
            .map_mut(MAP_COUNTERS)
            .ok_or_else(|| DatapathError::NoMap(MAP_COUNTERS.into()))?;
        let mut counters: PerCpuHashMap<&mut MapData, CounterKey, CounterValue> =
            PerCpuHashMap::try_from(map)?;
        let keys = counters.keys().collect::<Result<Vec<_>, _>>()?;
        for key in keys {
            counters.remove(&key)?;
        }
        Ok(())
    }

    fn program(&self) -> Result<&SchedClassifier> {
        let p = self
            .ebpf
            .program(PROGRAM)
            .ok_or(DatapathError::NoProgram(PROGRAM))?;
        Ok(p.try_into()?)
    }
}

/// Run a loaded TC program on `frame` with BPF_PROG_TEST_RUN; see
/// [`Datapath::test_run_from`].
pub(super) fn test_run_on(
    prog: &SchedClassifier,
    frame: &[u8],
    ingress_ifindex: u32,
) -> Result<(i32, Vec<u8>)> {
    use aya::programs::{TestRun as _, TestRunOptions};
    let mut out = vec![0u8; frame.len() + 64];
    // The head of a `struct __sk_buff` up to and including `ifindex`:
    // ingress_ifindex sits at offset 36 and is one of the fields
    // BPF_PROG_TEST_RUN copies into the skb (as skb_iif).
    // Kernels before 5.12 refuse a context that sets it (EINVAL): the
    // context is passed only when a frame is to be redirected.
    let mut ctx = [0u8; 44];
    ctx[36..40].copy_from_slice(&ingress_ifindex.to_ne_bytes());
    let res = prog
        .test_run(TestRunOptions {
            data_in: Some(frame),
            data_out: Some(&mut out),
            ctx_in: (ingress_ifindex != 0).then_some(&ctx[..]),
            ..TestRunOptions::new()
        })
        .map_err(DatapathError::TestRun)?;
    out.truncate(res.data_size_out as usize);
    Ok((res.return_value as i32, out))
}

/// Average kernel time of one run of a loaded TC program on `frame`.
pub fn timed_on(prog: &SchedClassifier, frame: &[u8], repeat: u32) -> Result<std::time::Duration> {
    use aya::programs::{TestRun as _, TestRunOptions};
    let res = prog
        .test_run(TestRunOptions {
            data_in: Some(frame),
            repeat,
            ..TestRunOptions::new()
        })
        .map_err(DatapathError::TestRun)?;
    Ok(res.duration)
}
