//! Writing large fresh outputs with non-temporal (streaming) stores.
//!
//! Note [Streaming stores for large outputs]:
//! An ordinary store to a line that is not in cache first reads the line from memory (to
//! own it), so `y = relu(x)` over 64 MiB moves 192 MiB: x read, y read, y written. A
//! non-temporal store writes whole lines through the write-combining buffers without that
//! read, and does not evict useful lines to hold data that will be gone from cache before
//! anything reads it. On an AVX-512 Zen 4, a bare relu loop over 16M f32 on two threads
//! gained about what the saved traffic predicts, and through `from_chunks_as` as below
//! Ember's `add_f32_16m` and `relu_f32_16m` gained by a fifth or more, while `exp` (bound
//! by arithmetic) and `sum` (no output) stayed level (docs/performance.md).
//!
//! So [`CpuStorage::from_chunks_as`](super::CpuStorage) writes an output of at least
//! [`threshold_bytes`] (the last-level cache's size: anything larger leaves the cache as it
//! is written anyway) through [`fill`]: each piece is produced in blocks into a buffer on
//! the stack, which stays in L1, and each block is copied out with 64-byte streaming stores
//! (AVX-512; 16-byte SSE2 ones, present on every x86-64, elsewhere; the choice is made once
//! per piece). Smaller outputs keep ordinary stores, so a
//! consumer that runs next finds them in cache. Streaming stores are weakly ordered: [`fill`]
//! ends with a store fence, before the parallel loop's completion (an atomic release) can
//! publish the piece to another thread. Elsewhere than x86-64 the block is copied plainly.
//!
//! Not every host gains: on an Intel host a one-core `relu` was slower with streaming
//! stores, and on a Zen 3 a two-thread `add` was ahead in half the runs and level in the
//! rest. `EMBER_CPU_STREAMING=0` turns it off, so a new host can be measured both ways with
//! one binary.

use std::mem::MaybeUninit;
use std::sync::OnceLock;

/// Elements per block produced into the stack buffer (1 KiB of f32). Short blocks keep the
/// loads of the producer and the stores of the copy close together: with 1024-element
/// blocks, relu was slower than streaming straight from the loop, and 256-element blocks
/// were as fast as that.
const BLOCK: usize = 256;

/// Outputs of at least this many bytes are written with streaming stores: the size of the
/// last-level cache (Linux's sysfs, cpu0's level-3 or else level-2 cache), 32 MiB where that
/// cannot be read; never with `EMBER_CPU_STREAMING=0` (for A/B runs on a new host).
pub(crate) fn threshold_bytes() -> usize {
    static BYTES: OnceLock<usize> = OnceLock::new();
    *BYTES.get_or_init(|| {
        if std::env::var("EMBER_CPU_STREAMING").as_deref() == Ok("0") {
            usize::MAX
        } else {
            last_level_cache().unwrap_or(32 << 20)
        }
    })
}

/// The largest cache size sysfs lists for cpu0.
fn last_level_cache() -> Option<usize> {
    (0..8)
        .filter_map(|i| {
            let dir = format!("/sys/devices/system/cpu/cpu0/cache/index{i}");
            std::fs::read_to_string(format!("{dir}/size")).ok()
        })
        .filter_map(|s| parse_size(s.trim()))
        .max()
}

/// `"32768K"`, `"1M"`, `"512"` → bytes.
fn parse_size(s: &str) -> Option<usize> {
    let (digits, unit) = match s.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((i, _)) => s.split_at(i),
        None => (s, ""),
    };
    let n: usize = digits.parse().ok()?;
    let scale = match unit {
        "" => 1,
        "K" => 1 << 10,
        "M" => 1 << 20,
        "G" => 1 << 30,
        _ => return None,
    };
    n.checked_mul(scale).filter(|&b| b > 0)
}

/// Initialises every element of `dst` with streaming stores: `produce(offset, buf)` must
/// write every element of `buf`, which becomes `dst[offset..offset + buf.len()]`.
pub(crate) fn fill<T: Copy>(
    dst: &mut [MaybeUninit<T>],
    mut produce: impl FnMut(usize, &mut [MaybeUninit<T>]),
) {
    let copy = copier();
    let mut buf = [MaybeUninit::<T>::uninit(); BLOCK];
    for (b, out) in dst.chunks_mut(BLOCK).enumerate() {
        let src = &mut buf[..out.len()];
        produce(b * BLOCK, src);
        let bytes = std::mem::size_of_val(out);
        // SAFETY: `src` and `out` are distinct slices (the stack buffer and the output) of
        // `bytes` bytes each; `copier` picked a copy this CPU runs. Bytes of a `T: Copy`
        // copied whole make the same `T`s.
        unsafe { copy(src.as_ptr().cast(), out.as_mut_ptr().cast(), bytes) };
    }
    fence();
}

/// A byte copy `(src, dst, bytes)` whose `dst` may not overlap `src`.
type ByteCopy = unsafe fn(*const u8, *mut u8, usize);

/// The widest streaming copy this CPU has (a plain copy elsewhere than x86-64).
fn copier() -> ByteCopy {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            copy_bytes_avx512
        } else {
            copy_bytes_sse2
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        copy_bytes_plain
    }
}

/// `bytes` bytes from `s` to `d`: the `W`-byte groups of `d` that are `W`-aligned through
/// `stream(off)`, which copies bytes `off..off + W` with one streaming store; the unaligned
/// head and the short tail plainly.
///
/// # Safety
/// `s` and `d` address `bytes` readable / writable bytes that do not overlap; `stream(off)`
/// must be sound for every `off` with `d + off` `W`-aligned and `off + W <= bytes`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn copy_with<const W: usize>(
    s: *const u8,
    d: *mut u8,
    bytes: usize,
    stream: impl Fn(usize),
) {
    let head = d.align_offset(W).min(bytes);
    let end = head + (bytes - head) / W * W;
    // SAFETY: the caller's contract; `head <= bytes` and `end <= bytes`, so both plain
    // copies stay inside the two regions, and `off` steps by `W` from the aligned `head`
    // to `end`.
    unsafe { std::ptr::copy_nonoverlapping(s, d, head) };
    let mut off = head;
    while off < end {
        stream(off);
        off += W;
    }
    // SAFETY: as above.
    unsafe { std::ptr::copy_nonoverlapping(s.add(end), d.add(end), bytes - end) };
}

/// [`copy_with`] by 64-byte lines (`vmovntdq zmm`).
///
/// # Safety
/// `s` and `d` address `bytes` readable / writable bytes that do not overlap; the CPU has
/// AVX-512 F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn copy_bytes_avx512(s: *const u8, d: *mut u8, bytes: usize) {
    use std::arch::x86_64::{__m512i, _mm512_loadu_si512, _mm512_stream_si512};
    // SAFETY: the caller's contract; `copy_with` calls the store only at 64-byte-aligned
    // `d + off` with `off + 64 <= bytes` (the load is an unaligned one).
    unsafe {
        copy_with::<64>(s, d, bytes, |off| {
            let v = _mm512_loadu_si512(s.add(off).cast::<__m512i>());
            _mm512_stream_si512(d.add(off).cast::<__m512i>(), v);
        })
    }
}

/// [`copy_with`] by 16 bytes (`movntdq`); SSE2 is part of x86-64.
///
/// # Safety
/// `s` and `d` address `bytes` readable / writable bytes that do not overlap.
#[cfg(target_arch = "x86_64")]
unsafe fn copy_bytes_sse2(s: *const u8, d: *mut u8, bytes: usize) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_stream_si128};
    // SAFETY: as in `copy_bytes_avx512`, with 16-byte alignment and steps.
    unsafe {
        copy_with::<16>(s, d, bytes, |off| {
            let v = _mm_loadu_si128(s.add(off).cast::<__m128i>());
            _mm_stream_si128(d.add(off).cast::<__m128i>(), v);
        })
    }
}

/// A plain copy, where there are no streaming stores to use.
///
/// # Safety
/// `s` and `d` address `bytes` readable / writable bytes that do not overlap.
#[cfg(not(target_arch = "x86_64"))]
unsafe fn copy_bytes_plain(s: *const u8, d: *mut u8, bytes: usize) {
    // SAFETY: the caller's contract.
    unsafe { std::ptr::copy_nonoverlapping(s, d, bytes) };
}

/// Orders the streaming stores before anything after it (a no-op elsewhere than x86-64).
fn fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `sfence` has no operands and no preconditions; SSE is part of x86-64.
    unsafe {
        std::arch::x86_64::_mm_sfence();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_as_sysfs_writes_them() {
        assert_eq!(parse_size("32768K"), Some(32 << 20));
        assert_eq!(parse_size("1M"), Some(1 << 20));
        assert_eq!(parse_size("512"), Some(512));
        assert_eq!(parse_size("0K"), None);
        assert_eq!(parse_size("12Q"), None);
        assert_eq!(parse_size(""), None);
        assert!(threshold_bytes() > 0);
    }

    /// Every offset and length around the 16- and 64-byte alignments and the block size, for 1-, 2-,
    /// 4- and 8-byte elements: each element lands where it belongs.
    #[test]
    fn fill_writes_every_element_in_place() {
        fn check<T: Copy + PartialEq + std::fmt::Debug>(make: impl Fn(usize) -> T) {
            let mut backing = [MaybeUninit::<T>::uninit(); 3 * BLOCK + 64];
            for start in 0..70 {
                for len in [
                    0,
                    1,
                    15,
                    16,
                    17,
                    BLOCK - 1,
                    BLOCK,
                    BLOCK + 1,
                    2 * BLOCK + 37,
                ] {
                    let dst = &mut backing[start..start + len];
                    // Each element first holds a value other than the one `fill` must put
                    // there, so a missed element is seen (and every element is initialised).
                    for (i, d) in dst.iter_mut().enumerate() {
                        d.write(make(i + 7));
                    }
                    fill(dst, |off, buf| {
                        for (i, b) in buf.iter_mut().enumerate() {
                            b.write(make(off + i));
                        }
                    });
                    for (i, d) in dst.iter().enumerate() {
                        // SAFETY: every element of `dst` was initialised above.
                        let v = unsafe { d.assume_init() };
                        assert_eq!(v, make(i), "start {start}, len {len}, element {i}");
                    }
                }
            }
        }
        check(|i| i as u8);
        check(|i| i as u16 ^ 0x5a5a);
        check(|i| i as f32 * 0.5);
        check(|i| (i as i64) << 33);
    }

    /// Both x86-64 copies (the one `fill` does not pick on this CPU included), at every
    /// misalignment of either side to a 64-byte line and lengths around it.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn both_streaming_copies_copy_every_byte() {
        let src: Vec<u8> = (0..600).map(|i| (i * 37 % 251) as u8).collect();
        for s0 in 0..66 {
            for d0 in 0..66 {
                for len in [0, 1, 15, 16, 63, 64, 65, 129, 300] {
                    let mut avx = vec![0xeeu8; 600];
                    let mut sse = vec![0xeeu8; 600];
                    let from = src[s0..s0 + len].as_ptr();
                    // SAFETY: `len` bytes from offsets `s0`, `d0` lie inside the 600-byte
                    // vectors, which are distinct allocations.
                    unsafe { copy_bytes_sse2(from, sse.as_mut_ptr().add(d0), len) };
                    assert_eq!(&sse[d0..d0 + len], &src[s0..s0 + len]);
                    assert!(sse[..d0].iter().chain(&sse[d0 + len..]).all(|&b| b == 0xee));
                    if std::arch::is_x86_feature_detected!("avx512f") {
                        // SAFETY: as above, and the CPU has AVX-512 F (checked).
                        unsafe { copy_bytes_avx512(from, avx.as_mut_ptr().add(d0), len) };
                        assert_eq!(avx, sse, "s0 {s0}, d0 {d0}, len {len}");
                    }
                }
            }
        }
        fence();
    }
}
