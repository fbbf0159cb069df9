//! Steady-state allocate + free pairs through the `cpu` caching allocator vs the system
//! allocator, in ns per pair. A quick check, not the workspace benchmark
//! (`cargo xtask bench`): `cargo run --release -p ember-memory --example alloc_pairs`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::time::Instant;

use ember_memory::{Device, MemoryError, allocator};

fn main() -> Result<(), MemoryError> {
    let cpu = allocator(Device::Cpu)?;
    for (name, size) in [
        ("512b", 512usize),
        ("64kib", 64 << 10),
        ("1mib", 1 << 20),
        ("4mib", 4 << 20),
        ("16mib", 16 << 20),
        ("64mib", 64 << 20),
    ] {
        let iters = if size >= 16 << 20 { 20_000 } else { 200_000 };
        drop(cpu.allocate(size)?); // warm the cache
        let t = Instant::now();
        for _ in 0..iters {
            let a = cpu.allocate(black_box(size))?;
            black_box(a.addr());
        }
        let caching = t.elapsed().as_nanos() as f64 / iters as f64;
        let layout = Layout::from_size_align(size, 64).map_err(|e| MemoryError::Serialize {
            what: "layout",
            message: e.to_string(),
        })?;
        let t = Instant::now();
        for _ in 0..iters {
            // SAFETY: non-zero size; freed right away with the same layout.
            unsafe {
                let p = System.alloc(black_box(layout));
                black_box(p);
                if !p.is_null() {
                    System.dealloc(p, layout);
                }
            }
        }
        let system = t.elapsed().as_nanos() as f64 / iters as f64;
        println!(
            "{name:>6}: caching {caching:8.1} ns/pair  system {system:9.1} ns/pair  ({:.1}x)",
            system / caching
        );
    }
    Ok(())
}
