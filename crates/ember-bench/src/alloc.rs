//! Allocate-and-free pairs: the caching allocator against the system allocator (the host's
//! `malloc` on the CPU, the driver's `cuMemAlloc`/`cuMemFree` on a CUDA device).

use std::alloc::{GlobalAlloc, Layout, System};

use ember_device::Device;
use ember_device::cuda;

use crate::harness::{Options, Record, ns_per_iter};

const SIZES: [(usize, &str); 6] = [
    (512, "512b"),
    (64 << 10, "64kib"),
    (1 << 20, "1mib"),
    (4 << 20, "4mib"),
    (16 << 20, "16mib"),
    (64 << 20, "64mib"),
];

const ROUNDS: usize = 7;

fn iters_for(size: usize) -> usize {
    if size >= 16 << 20 { 2_000 } else { 20_000 }
}

pub fn run(opts: &Options, out: &mut Vec<Record>) -> Result<(), String> {
    if opts.cpu() {
        run_cpu(opts, out)?;
    }
    if opts.cuda() {
        run_cuda(opts, out)?;
    }
    Ok(())
}

fn run_cpu(opts: &Options, out: &mut Vec<Record>) -> Result<(), String> {
    run_device(opts, out, Device::Cpu, false, |size| {
        let layout = Layout::from_size_align(size, 64).map_err(|e| e.to_string())?;
        // SAFETY: `layout` has a non-zero size (every benchmarked size is); the pointer is
        // freed with the same layout right away, and a null return is never passed on.
        unsafe {
            let p = System.alloc(layout);
            if p.is_null() {
                return Err(format!("system allocator returned null for {size} bytes"));
            }
            System.dealloc(std::hint::black_box(p), layout);
        }
        Ok(())
    })
}

fn run_cuda(opts: &Options, out: &mut Vec<Record>) -> Result<(), String> {
    let driver = cuda::driver().map_err(|e| e.to_string())?;
    run_device(opts, out, Device::Cuda(0), cuda::is_emulated(), |size| {
        let p = driver.malloc(0, size).map_err(|e| e.to_string())?;
        driver.free(0, p).map_err(|e| e.to_string())
    })
}

/// Time allocate-and-free pairs through the device's caching allocator and through
/// `system_pair` (one raw allocate and free of the given size) for every size.
fn run_device(
    opts: &Options,
    out: &mut Vec<Record>,
    device: Device,
    emulated: bool,
    mut system_pair: impl FnMut(usize) -> Result<(), String>,
) -> Result<(), String> {
    let caching = ember_memory::allocator(device).map_err(|e| e.to_string())?;
    for (size, tag) in SIZES {
        let cname = format!("alloc_free_caching_{tag}");
        let sname = format!("alloc_free_system_{tag}");
        if !opts.wants(&cname) && !opts.wants(&sname) {
            continue;
        }
        let iters = iters_for(size);
        let mut failed = None;
        let c = ns_per_iter(ROUNDS, iters, || match caching.allocate(size) {
            Ok(a) => drop(std::hint::black_box(a)),
            Err(e) => failed = Some(e.to_string()),
        });
        let s = ns_per_iter(ROUNDS, iters, || {
            if let Err(e) = system_pair(size) {
                failed = Some(e);
            }
        });
        if let Some(e) = failed {
            return Err(format!("{cname}/{sname}: {e}"));
        }
        push_pair(out, &device.to_string(), emulated, &cname, c, &sname, s);
    }
    Ok(())
}

fn push_pair(
    out: &mut Vec<Record>,
    device: &str,
    emulated: bool,
    cname: &str,
    caching_ns: f64,
    sname: &str,
    system_ns: f64,
) {
    let mut extra = serde_json::Map::new();
    if emulated {
        extra.insert("emulated".into(), true.into());
    }
    let mut cextra = extra.clone();
    cextra.insert(
        "speedup_vs_system".into(),
        serde_json::Value::from(system_ns / caching_ns),
    );
    out.push(Record {
        name: cname.to_string(),
        device: device.to_string(),
        threads: 1,
        value: caching_ns,
        unit: "ns",
        extra: cextra,
    });
    out.push(Record {
        name: sname.to_string(),
        device: device.to_string(),
        threads: 1,
        value: system_ns,
        unit: "ns",
        extra,
    });
}
