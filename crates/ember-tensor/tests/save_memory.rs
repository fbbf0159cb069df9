#![allow(clippy::unwrap_used)]
//! `io::save` streams (Note [Atomic save]): saving 64 MiB of tensors raises the process's
//! peak memory by a few MiB, not by a host copy of the data. Alone in its test binary, so
//! that no other test's allocations land in the measured window.

#[cfg(target_os = "linux")]
#[test]
fn saving_streams_without_a_host_copy_of_the_data() {
    use ember_tensor::{Device, Tensor, io};

    /// The process's peak resident memory (`VmHWM`), in bytes.
    fn peak_rss() -> u64 {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
        let kb: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
        kb * 1024
    }
    const MIB: u64 = 1 << 20;
    let dir = std::env::temp_dir().join(format!("ember-save-mem-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("big.safetensors");
    // Two tensors, 64 MiB in all; `randn` writes every page, so they are resident.
    let a = Tensor::randn([8 << 20], ()).unwrap();
    let b = Tensor::randn([2048, 4096], ()).unwrap();
    let b_t = b.t().unwrap(); // non-contiguous: made contiguous, then streamed
    // A small save first, so that one-time setup is not measured.
    io::save([("x", &Tensor::ones([4], ()).unwrap())], &path).unwrap();
    // Resets VmHWM to the current RSS (Linux 4.0+); when that is refused, the peak so far
    // (the tensors' creation) is the baseline, which only makes the check weaker.
    let _ = std::fs::write("/proc/self/clear_refs", "5");
    let before = peak_rss();
    io::save([("a", &a)], &path).unwrap();
    let grew_contiguous = peak_rss().saturating_sub(before);
    assert!(
        grew_contiguous < 16 * MIB,
        "saving 32 MiB raised the peak by {} MiB",
        grew_contiguous / MIB
    );
    // A non-contiguous tensor is made contiguous first (one copy of that tensor), then
    // streamed: no second copy.
    let _ = std::fs::write("/proc/self/clear_refs", "5");
    let before = peak_rss();
    io::save([("a", &a), ("b_t", &b_t)], &path).unwrap();
    let grew = peak_rss().saturating_sub(before);
    assert!(
        grew < 32 * MIB + 16 * MIB,
        "saving 64 MiB (32 MiB of it strided) raised the peak by {} MiB",
        grew / MIB
    );
    let loaded = io::load(&path, Device::Cpu).unwrap();
    assert_eq!(loaded["b_t"].dims(), &[4096, 2048]);
    std::fs::remove_dir_all(&dir).unwrap();
}
