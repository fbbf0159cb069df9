//! The emulator's launch trace (Note [Launch trace]): each launched kernel's name is appended
//! once per process, whole lines, also with many processes appending to one file at once.
//! Its own test binary, because pointing the trace elsewhere is process-wide.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::ffi::{c_int, c_void};
use std::path::PathBuf;
use std::process::{Command, Stdio};

use ember_device::driver::emulator::{
    ENV_EMULATOR_TRACE, Emulator, EmulatorConfig, KernelLaunch, launch_trace, register_kernel,
    set_launch_trace,
};
use ember_device::driver::{Driver, LaunchConfig, StreamHandle};

/// A kernel that does nothing.
///
/// # Safety
/// None: it reads nothing; `unsafe` only because the registry's kernel type is.
unsafe extern "C" fn nothing(_launch: *const KernelLaunch) -> c_int {
    0
}

fn launch_by_name(e: &Emulator, name: &str) {
    let m = e.module_load(0, b"ignored").unwrap();
    let f = e.module_function(m, name).unwrap();
    let config = LaunchConfig {
        grid: (1, 1, 1),
        block: (1, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut params: Vec<*mut c_void> = Vec::new();
    // SAFETY: `nothing` takes no parameters and touches no memory.
    unsafe {
        e.launch_kernel(f, config, StreamHandle::DEFAULT, &mut params)
            .unwrap()
    };
}

fn fresh_file(name: &str) -> PathBuf {
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("launch-trace-{name}-{}.txt", std::process::id()));
    let _ = std::fs::remove_file(&path);
    path
}

#[test]
fn launched_kernels_are_appended_once_each() {
    let path = fresh_file("once");
    register_kernel("trace_test_a", nothing);
    register_kernel("trace_test_b", nothing);
    register_kernel("trace_test_never", nothing);
    let e = Emulator::new(EmulatorConfig::devices(1)).unwrap();
    set_launch_trace(Some(&path));
    assert_eq!(launch_trace(), Some(path.clone()));
    launch_by_name(&e, "trace_test_a");
    launch_by_name(&e, "trace_test_b");
    launch_by_name(&e, "trace_test_a");
    // A launch the emulator refuses (no threads) runs nothing and is not recorded.
    let m = e.module_load(0, b"ignored").unwrap();
    let f = e.module_function(m, "trace_test_never").unwrap();
    let zero = LaunchConfig {
        grid: (0, 1, 1),
        block: (1, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: rejected before it runs; `nothing` takes no parameters anyway.
    assert!(unsafe { e.launch_kernel(f, zero, StreamHandle::DEFAULT, &mut []) }.is_err());
    assert_eq!(
        std::fs::read_to_string(&path).unwrap(),
        "trace_test_a\ntrace_test_b\n"
    );
    // Off: nothing more is written.
    set_launch_trace(None);
    assert_eq!(launch_trace(), None);
    launch_by_name(&e, "trace_test_never");
    assert_eq!(
        std::fs::read_to_string(&path).unwrap(),
        "trace_test_a\ntrace_test_b\n"
    );
    // Pointed at a new file, names are written again.
    let second = fresh_file("second");
    set_launch_trace(Some(&second));
    launch_by_name(&e, "trace_test_a");
    assert_eq!(std::fs::read_to_string(&second).unwrap(), "trace_test_a\n");
    set_launch_trace(None);
}

const CHILDREN: usize = 6;
const NAMES: usize = 40;

/// In a child started by the test below (with the variable set): launches NAMES kernels with
/// long names, each three times. Otherwise skipped, said so with the line of Note [Skipped
/// tests] (printed here: this crate's tests cannot depend on `ember-testing`, which
/// depends on it).
#[test]
fn child_launches_many_kernels() {
    if std::env::var_os("EMBER_TRACE_TEST_CHILD").is_none() {
        println!("ember-skip: runs only as a child of concurrent_processes_append_whole_lines");
        return;
    }
    let e = Emulator::new(EmulatorConfig::devices(1)).unwrap();
    let names: Vec<String> = (0..NAMES)
        .map(|i| format!("trace_child_kernel_{i:03}_{}", "x".repeat(200)))
        .collect();
    for name in &names {
        register_kernel(name, nothing);
    }
    for _ in 0..3 {
        for name in &names {
            launch_by_name(&e, name);
        }
    }
}

#[test]
fn concurrent_processes_append_whole_lines() {
    let path = fresh_file("concurrent");
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..CHILDREN)
        .map(|_| {
            Command::new(&exe)
                .args(["--exact", "child_launches_many_kernels", "--test-threads=1"])
                .env("EMBER_TRACE_TEST_CHILD", "1")
                .env(ENV_EMULATOR_TRACE, &path)
                .stdout(Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    for mut c in children {
        assert!(c.wait().unwrap().success());
    }
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.ends_with('\n'));
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for line in text.lines() {
        *counts.entry(line).or_default() += 1;
    }
    // Every line is one whole name, and each process wrote each name exactly once.
    assert_eq!(counts.len(), NAMES, "{counts:?}");
    for (name, count) in counts {
        assert!(
            name.starts_with("trace_child_kernel_") && name.len() == 19 + 3 + 1 + 200,
            "a torn line: {name:?}"
        );
        assert_eq!(count, CHILDREN, "{name}");
    }
}
