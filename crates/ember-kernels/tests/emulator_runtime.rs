//! The emulation of CUDA's execution model, through the kernels of `kernels/testing.cu`:
//! `__syncthreads` with shared memory, warp shuffles and votes, threads that return early,
//! poisoned dynamic shared memory, 16-bit conversions, launch errors, and the deadlock report
//! (in a child process, since it aborts).
#![allow(clippy::unwrap_used)]

mod common;

use std::process::Command;

use common::{Buf, launch, setup};
use ember_kernels::{KernelArgs, emulated_kernel_names};
use ember_testing::Lcg;
use half::{bf16, f16};

#[test]
fn block_sum_uses_barriers_shared_memory_and_shuffles() {
    let (d, m) = setup(0);
    // Small integers: every partial sum is exact in f32, so the order does not matter.
    let n = 10_000usize;
    let input: Vec<f32> = (0..n).map(|i| ((i * 7919) % 23) as f32 - 11.0).collect();
    for (grid, block) in [(8u32, 256u32), (3, 1024), (5, 32), (1, 96)] {
        let (din, dout) = (
            Buf::from_slice(&d, 0, &input),
            Buf::<f32>::zeros(&d, 0, grid as usize),
        );
        let mut args = KernelArgs::new();
        args.ptr(din.ptr).ptr(dout.ptr).push(n as i64);
        launch(
            &d,
            m,
            "ember_test_block_sum_f32",
            grid,
            block,
            32 * 4,
            &mut args,
        )
        .unwrap();
        // Block b sums the elements i with (i / block) % grid == b (grid-stride ownership).
        let mut want = vec![0f32; grid as usize];
        for (i, &v) in input.iter().enumerate() {
            want[(i / block as usize) % grid as usize] += v;
        }
        assert_eq!(dout.to_vec(), want, "grid {grid} block {block}");
    }
}

#[test]
fn static_shared_memory_is_shared_by_the_block() {
    let (d, m) = setup(0);
    for (grid, block) in [(3u32, 64u32), (2, 1024), (4, 33)] {
        let n = (grid * block) as usize;
        let input: Vec<i32> = (0..n as i32).collect();
        let (din, dout) = (Buf::from_slice(&d, 0, &input), Buf::<i32>::zeros(&d, 0, n));
        let mut args = KernelArgs::new();
        args.ptr(din.ptr).ptr(dout.ptr);
        launch(
            &d,
            m,
            "ember_test_reverse_block_i32",
            grid,
            block,
            0,
            &mut args,
        )
        .unwrap();
        let want: Vec<i32> = input
            .chunks(block as usize)
            .flat_map(|c| c.iter().rev().copied())
            .collect();
        assert_eq!(dout.to_vec(), want, "grid {grid} block {block}");
    }
}

#[test]
fn warp_shuffles_and_votes_follow_ptx_rules() {
    let (d, m) = setup(0);
    let block = 64usize;
    let out = Buf::<i32>::zeros(&d, 0, block * 8);
    let mut args = KernelArgs::new();
    args.ptr(out.ptr);
    launch(
        &d,
        m,
        "ember_test_warp_ops_i32",
        1,
        block as u32,
        0,
        &mut args,
    )
    .unwrap();
    let got = out.to_vec();
    for t in 0..block as i32 {
        let (lane, base) = (t % 32, t - t % 32);
        let want = [
            base + 3,
            if lane >= 1 { t - 1 } else { t },
            if lane + 2 < 32 { t + 2 } else { t },
            base + (lane ^ 5),
            // xor 9 within segments of 8: an earlier segment may be read, a later one not.
            if (lane ^ 9) / 8 <= lane / 8 {
                base + (lane ^ 9)
            } else {
                t
            },
            0xAAAA_AAAAu32 as i32,
            1,
            1,
        ];
        assert_eq!(
            &got[t as usize * 8..t as usize * 8 + 8],
            &want,
            "thread {t}"
        );
    }
}

#[test]
fn threads_that_return_early_leave_the_barrier() {
    let (d, m) = setup(0);
    for (block, keep) in [(64u32, 37i32), (64, 64), (256, 1), (1024, 1000)] {
        let out = Buf::<i32>::zeros(&d, 0, 1);
        let mut args = KernelArgs::new();
        args.ptr(out.ptr).push(keep);
        launch(
            &d,
            m,
            "ember_test_early_exit_sum_i32",
            2,
            block,
            0,
            &mut args,
        )
        .unwrap();
        assert_eq!(
            out.to_vec(),
            vec![keep * (keep - 1) / 2],
            "block {block} keep {keep}"
        );
    }
}

#[test]
fn dynamic_shared_memory_starts_poisoned() {
    let (d, m) = setup(0);
    // A launch that writes its dynamic shared memory, then one that only reads it.
    let sum_in = Buf::from_slice(&d, 0, &[1.0f32; 64]);
    let sum_out = Buf::<f32>::zeros(&d, 0, 1);
    let mut args = KernelArgs::new();
    args.ptr(sum_in.ptr).ptr(sum_out.ptr).push(64i64);
    launch(&d, m, "ember_test_block_sum_f32", 1, 64, 64, &mut args).unwrap();
    let out = Buf::<u32>::zeros(&d, 0, 16);
    let mut args = KernelArgs::new();
    args.ptr(out.ptr).push(16i32);
    launch(&d, m, "ember_test_shared_poison_u32", 1, 32, 64, &mut args).unwrap();
    assert_eq!(out.to_vec(), vec![0xFFFF_FFFFu32; 16]);
}

#[test]
fn sixteen_bit_conversions_match_the_half_crate() {
    let (d, m) = setup(0);
    let mut rng = Lcg(12345);
    let mut input: Vec<f32> = (0..20_000)
        .map(|_| f32::from_bits(rng.next_u64() as u32))
        .collect();
    // Ties, overflow boundaries, subnormals, signed zeros, infinities.
    for bits in [
        0x3F80_1000u32,
        0x3F80_3000,
        0x3F80_8000,
        0x3F81_8000,
        0x477F_E000,
        0x477F_F000,
        0x477F_EFFF,
        0x3380_0000,
        0x3300_0000,
        0x3300_0001,
        0x0000_0001,
        0x8000_0000,
        0x7F80_0000,
        0xFF80_0000,
        0x7F7F_FFFF,
        0x0080_0000,
        0x007F_FFFF,
        0x3F7F_FFFF,
    ] {
        input.push(f32::from_bits(bits));
    }
    // Plenty of values inside f16's range too.
    input.extend((0..20_000).map(|_| rng.f32(70_000.0)));
    let n = input.len();
    let din = Buf::from_slice(&d, 0, &input);
    let (h, b) = (Buf::<f16>::zeros(&d, 0, n), Buf::<bf16>::zeros(&d, 0, n));
    let (hb, bb) = (Buf::<f32>::zeros(&d, 0, n), Buf::<f32>::zeros(&d, 0, n));
    let mut args = KernelArgs::new();
    args.ptr(din.ptr)
        .ptr(h.ptr)
        .ptr(b.ptr)
        .ptr(hb.ptr)
        .ptr(bb.ptr)
        .push(n as i64);
    launch(&d, m, "ember_test_convert_f32", 8, 256, 0, &mut args).unwrap();
    let (h, b, hb, bb) = (h.to_vec(), b.to_vec(), hb.to_vec(), bb.to_vec());
    for i in 0..n {
        let x = input[i];
        let (wh, wb) = (f16::from_f32(x), bf16::from_f32(x));
        assert_eq!(
            h[i].to_bits(),
            wh.to_bits(),
            "f16({x:e}) bits {:#x}",
            x.to_bits()
        );
        assert_eq!(
            b[i].to_bits(),
            wb.to_bits(),
            "bf16({x:e}) bits {:#x}",
            x.to_bits()
        );
        assert_eq!(
            hb[i].to_bits(),
            wh.to_f32().to_bits(),
            "f16 {:#x} to f32",
            wh.to_bits()
        );
        assert_eq!(
            bb[i].to_bits(),
            wb.to_f32().to_bits(),
            "bf16 {:#x} to f32",
            wb.to_bits()
        );
    }
}

#[test]
fn atomics_on_every_type() {
    let (d, m) = setup(0);
    let f = Buf::<f32>::zeros(&d, 0, 1);
    let i = Buf::<i32>::zeros(&d, 0, 1);
    let h = Buf::<f16>::zeros(&d, 0, 1);
    let b = Buf::<bf16>::zeros(&d, 0, 1);
    let mx = Buf::<u32>::zeros(&d, 0, 1);
    let mut args = KernelArgs::new();
    args.ptr(f.ptr).ptr(i.ptr).ptr(h.ptr).ptr(b.ptr).ptr(mx.ptr);
    // 192 threads: every count is exact even in bf16 (integers up to 256).
    launch(&d, m, "ember_test_atomics", 2, 96, 0, &mut args).unwrap();
    assert_eq!(f.to_vec(), vec![192.0]);
    assert_eq!(i.to_vec(), vec![192]);
    assert_eq!(h.to_vec(), vec![f16::from_f32(192.0)]);
    assert_eq!(b.to_vec(), vec![bf16::from_f32(192.0)]);
    assert_eq!(mx.to_vec(), vec![191]);
}

#[test]
fn launch_structs_have_the_c_layout() {
    // The C++ side static_asserts the same sizes (kernels/ember.cuh, kernels/emu/cuda_emu.h).
    assert_eq!(
        std::mem::size_of::<ember_kernels::StridedLayout>(),
        8 + 16 * ember_kernels::MAX_DIMS
    );
    assert_eq!(
        std::mem::size_of::<ember_device::driver::emulator::KernelLaunch>(),
        64
    );
    assert_eq!(
        std::mem::offset_of!(ember_device::driver::emulator::KernelLaunch, params),
        32
    );
}

#[test]
fn launch_errors_are_reported() {
    let (d, m) = setup(0);
    // A freed pointer is not inside a live allocation: the launch fails, nothing is written.
    let p = d.malloc(0, 64).unwrap();
    d.free(0, p).unwrap();
    let mut args = KernelArgs::new();
    args.ptr(p).push(16i64).push(1.0f32);
    let err = launch(&d, m, "ember_fill_f32", 1, 32, 0, &mut args)
        .unwrap_err()
        .to_string();
    assert!(err.contains("CUDA_ERROR_LAUNCH_FAILED"), "{err}");
    // Too few parameters.
    let buf = Buf::<f32>::zeros(&d, 0, 16);
    let mut args = KernelArgs::new();
    args.ptr(buf.ptr).push(16i64);
    let err = launch(&d, m, "ember_fill_f32", 1, 32, 0, &mut args)
        .unwrap_err()
        .to_string();
    assert!(err.contains("CUDA_ERROR_LAUNCH_FAILED"), "{err}");
    // Unknown names are not found.
    let err = d
        .module_function(m, "ember_no_such_kernel")
        .unwrap_err()
        .to_string();
    assert!(err.contains("CUDA_ERROR_NOT_FOUND"), "{err}");
}

#[test]
fn every_kernel_family_is_registered() {
    let names = emulated_kernel_names();
    for dtype in ["f32", "f16", "bf16", "i64"] {
        assert!(
            names.contains(&format!("ember_fill_{dtype}").as_str()),
            "{names:?}"
        );
        assert!(
            names.contains(&format!("ember_arange_{dtype}").as_str()),
            "{names:?}"
        );
    }
    let all = ["f32", "f64", "f16", "bf16", "i64", "i32", "u8", "bool"];
    let mut want: Vec<String> = Vec::new();
    for dtype in all {
        for op in ["badd", "bmul", "bmaximum", "bminimum", "usign", "where"] {
            want.push(format!("{op}_{dtype}"));
        }
        for op in ["eq", "ne", "lt", "le", "gt", "ge"] {
            want.push(format!("cmp_{op}_{dtype}"));
        }
        for op in ["sum", "prod", "max", "min", "argmax", "argmin"] {
            want.push(format!("reduce_{op}_{dtype}"));
        }
        for dst in all {
            want.push(format!("cast_{dtype}_{dst}"));
        }
    }
    for dtype in &all[..7] {
        for op in ["bsub", "bpow", "uneg", "uabs", "urelu"] {
            want.push(format!("{op}_{dtype}"));
        }
    }
    for dtype in &all[..4] {
        for op in [
            "bdiv",
            "uexp",
            "ulog",
            "ulog1p",
            "usqrt",
            "ursqrt",
            "usin",
            "ucos",
            "utanh",
            "usigmoid",
            "ureciprocal",
            "usilu",
            "usoftplus",
            "ugelu_tanh",
            "ugelu_erf",
            "uhardswish",
            "blogaddexp",
            "softmax",
            "log_softmax",
        ] {
            want.push(format!("{op}_{dtype}"));
        }
    }
    for op in ["bland", "blor", "blxor"] {
        want.push(format!("{op}_bool"));
    }
    for name in &want {
        assert!(names.contains(&name.as_str()), "{name} missing: {names:?}");
    }
    // Every name is registered once.
    let mut dedup = names.clone();
    dedup.dedup();
    assert_eq!(dedup, names);
}

#[test]
fn the_fatbin_matches_the_emulated_kernels() {
    match ember_kernels::fatbin() {
        Err(e) => {
            assert!(!ember_kernels::has_fatbin());
            assert_eq!(
                e.to_string(),
                "CUDA kernels were not built: run `cargo xtask kernels --install-nvcc`"
            );
        }
        Ok(bytes) => {
            assert_eq!(
                bytes.as_ptr() as usize % 16,
                0,
                "aligned for cuModuleLoadData"
            );
            assert!(!bytes.is_empty());
            // Every kernel in the fatbin runs on the emulator; the emulator has nothing the
            // fatbin lacks except the deliberately broken test kernels.
            let fat = ember_kernels::fatbin_kernel_names().unwrap();
            let emu = emulated_kernel_names();
            let emulator_only = ["ember_test_deadlock", "ember_test_out_of_bounds"];
            let want: Vec<&str> = emu
                .iter()
                .copied()
                .filter(|n| !emulator_only.contains(n))
                .collect();
            assert_eq!(fat, want);
        }
    }
}

/// Runs one deliberately broken kernel when the parent test asks for it (see below);
/// otherwise skipped.
#[test]
fn child_runs_a_broken_kernel() {
    let Ok(name) = std::env::var("EMBER_KERNELS_TEST_CHILD") else {
        ember_testing::skip!("runs only as a child of the tests of broken kernels below");
    };
    let (d, m) = setup(0);
    let out = Buf::<i32>::zeros(&d, 0, 64);
    let mut args = KernelArgs::new();
    args.ptr(out.ptr);
    if name == "ember_test_out_of_bounds" {
        args.push(64i32);
    }
    let _ = launch(&d, m, &name, 1, 64, 0, &mut args);
    eprintln!("child: the broken kernel {name} returned");
}

fn run_child(kernel: &str) -> (bool, String) {
    let exe = std::env::current_exe().unwrap();
    let output = Command::new(exe)
        .args([
            "--exact",
            "child_runs_a_broken_kernel",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("EMBER_KERNELS_TEST_CHILD", kernel)
        .output()
        .unwrap();
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn a_barrier_that_cannot_complete_is_reported_and_aborts() {
    let (ok, stderr) = run_child("ember_test_deadlock");
    assert!(!ok, "the child should abort:\n{stderr}");
    assert!(
        stderr.contains("deadlock") && stderr.contains("ember_test_deadlock"),
        "{stderr}"
    );
    assert!(stderr.contains("waiting at __syncthreads"), "{stderr}");
    assert!(stderr.contains("waiting at a warp barrier"), "{stderr}");
    // The second warp finished its shuffle and returned; the report says so.
    assert!(
        stderr.contains("threads 32..=63 (linear ids): returned"),
        "{stderr}"
    );
}

/// Under `EMBER_KERNELS_ASAN=1` (kernels/README.md, "Sanitizers"), a kernel writing one past
/// the end of its buffer is caught, as compute-sanitizer would catch it on a GPU.
#[cfg(ember_kernels_asan)]
#[test]
fn address_sanitizer_catches_a_kernel_writing_out_of_bounds() {
    let (ok, stderr) = run_child("ember_test_out_of_bounds");
    assert!(!ok, "the child should abort:\n{stderr}");
    assert!(stderr.contains("heap-buffer-overflow"), "{stderr}");
    assert!(stderr.contains("ember_test_out_of_bounds"), "{stderr}");
}

/// The emulated symbol table, for `cargo xtask test`'s launch-coverage check
/// (xtask/src/coverage.rs): written to the file `EMBER_KERNELS_TABLE` names, when set.
#[test]
fn emulated_kernel_table_for_the_launch_check() {
    let names = emulated_kernel_names();
    assert!(!names.is_empty());
    assert!(
        names.windows(2).all(|w| w[0] < w[1]),
        "kernel names are unique"
    );
    if let Some(path) = std::env::var_os("EMBER_KERNELS_TABLE") {
        let mut text = names.join("\n");
        text.push('\n');
        std::fs::write(&path, text).expect("write the kernel table");
    }
}

/// The out-of-bounds test kernel is an ordinary store of 1 at out[n]: within the buffer it
/// runs in every build (so the launch-coverage check sees it without the ASan pass); one past
/// the end it is the AddressSanitizer build's test above.
#[test]
fn the_out_of_bounds_kernel_stores_at_index_n() {
    let (d, m) = setup(0);
    let out = Buf::<i32>::zeros(&d, 0, 8);
    let mut args = KernelArgs::new();
    args.ptr(out.ptr).push(5i32);
    launch(&d, m, "ember_test_out_of_bounds", 1, 64, 0, &mut args).unwrap();
    assert_eq!(out.to_vec(), [0, 0, 0, 0, 0, 1, 0, 0]);
}
