#![allow(clippy::unwrap_used)]
//! Tensors live in the caching allocator: `memory_allocated(cpu)` moves as they are made
//! and dropped. (Its own test binary: the statistic is process-wide.)

use ember_memory::memory_allocated;
use ember_tensor::{Device, Tensor};

#[test]
fn memory_allocated_moves_with_tensors() {
    let before = memory_allocated(Device::Cpu).unwrap();
    let t = Tensor::zeros([1024, 256], ()).unwrap();
    let during = memory_allocated(Device::Cpu).unwrap();
    assert!(during >= before + 1024 * 256 * 4, "{before} -> {during}");
    let v = t.narrow(0, 0, 10).unwrap(); // a view allocates nothing
    assert_eq!(memory_allocated(Device::Cpu).unwrap(), during);
    drop(t);
    assert_eq!(
        memory_allocated(Device::Cpu).unwrap(),
        during,
        "the view keeps the storage"
    );
    drop(v);
    assert_eq!(memory_allocated(Device::Cpu).unwrap(), before);
    let empty = Tensor::zeros([0, 5], ()).unwrap();
    assert_eq!(memory_allocated(Device::Cpu).unwrap(), before);
    drop(empty);
}
