//! Emulated device memory: tagged addresses over host buffers.
//!
//! Note [Tagged device addresses]:
//!
//! A device pointer from the emulator is `TAG | device << 44 | offset`, with
//! `TAG = 0xE0A0_0000_0000_0000`: top byte `0xE0`, bits 52..55 `0b1010`, the device ordinal in
//! bits 44..51 and a 44-bit (16 TiB) offset into that device's address space. Such an address
//! is never dereferenceable on the host:
//! - x86-64 (4- and 5-level paging): bits 63..47 (or 63..56) are not all equal, so the address
//!   is non-canonical and any load or store faults (SIGSEGV/SIGBUS);
//! - AArch64 with top-byte-ignore: bits 55..48 (or 55..52) are not all equal, so the
//!   translation faults too.
//!
//! Host code that touches "device memory" therefore crashes under the emulator as it would on
//! a GPU, instead of silently working. Inside the emulator an address is translated by range
//! lookup: each device has a `BTreeMap` from allocation base to the allocation, and
//! `(ptr, len)` resolves to the allocation with the greatest base `<= ptr`, checked so that
//! `[ptr, ptr + len)` lies inside it. Anything else (freed memory, a gap, another device's
//! tag, past the end) is an error, never undefined behaviour.
//!
//! Offsets come from a per-device bump pointer (aligned to 512 bytes, with a gap between
//! allocations), so a freed address is not handed out again until the 16 TiB offset space
//! wraps; then the first gap that fits is reused. Use-after-free is thus reported rather
//! than silently reading a newer allocation.

use std::collections::BTreeMap;
use std::ptr::NonNull;

use crate::driver::DevicePtr;
use crate::error::{DeviceError, Result};

/// The constant high bits of every emulated device address.
pub const ADDRESS_TAG: u64 = 0xE0A0_0000_0000_0000;
/// Bits of the offset field.
pub const OFFSET_BITS: u32 = 44;
const OFFSET_MASK: u64 = (1 << OFFSET_BITS) - 1;
const DEVICE_MASK: u64 = 0xFF;
/// Alignment of every allocation's base (cudaMalloc guarantees 256).
pub const ALLOCATION_ALIGN: u64 = 512;
/// First offset handed out on each device (keeps `TAG | device << 44` itself invalid).
const FIRST_OFFSET: u64 = 1 << 20;

/// The address of `offset` on `device`.
pub fn tagged_address(device: usize, offset: u64) -> DevicePtr {
    DevicePtr(ADDRESS_TAG | ((device as u64 & DEVICE_MASK) << OFFSET_BITS) | (offset & OFFSET_MASK))
}

/// The device of an emulator address, if `ptr` carries the tag.
pub fn device_of_address(ptr: DevicePtr) -> Option<usize> {
    if ptr.0 & !(OFFSET_MASK | (DEVICE_MASK << OFFSET_BITS)) == ADDRESS_TAG {
        Some(((ptr.0 >> OFFSET_BITS) & DEVICE_MASK) as usize)
    } else {
        None
    }
}

/// A zeroed host buffer of 16-byte-aligned storage, addressed through a raw pointer so that
/// pointers handed to kernels stay valid while the emulator's lock is held.
#[derive(Debug)]
pub(crate) struct HostBuf {
    ptr: NonNull<u128>,
    words: usize,
    len: usize,
}

// SAFETY: HostBuf owns its allocation exclusively (like a Box<[u128]>); all access goes through
// the emulator's memory lock.
unsafe impl Send for HostBuf {}
// SAFETY: as above; shared references only read the pointer value.
unsafe impl Sync for HostBuf {}

impl HostBuf {
    fn new(len: usize) -> HostBuf {
        let words = len.div_ceil(16).max(1);
        // `vec![0; n]` uses calloc, so untouched pages of large buffers cost nothing.
        let boxed: Box<[u128]> = vec![0u128; words].into_boxed_slice();
        let raw = Box::into_raw(boxed) as *mut u128;
        // Box::into_raw never returns null.
        let ptr = NonNull::new(raw).unwrap_or(NonNull::dangling());
        HostBuf { ptr, words, len }
    }

    /// Start of the buffer.
    pub(crate) fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr() as *mut u8
    }
}

impl Drop for HostBuf {
    fn drop(&mut self) {
        let slice = std::ptr::slice_from_raw_parts_mut(self.ptr.as_ptr(), self.words);
        // SAFETY: `slice` is exactly the Box<[u128]> leaked in `new`, dropped once here.
        drop(unsafe { Box::from_raw(slice) });
    }
}

/// One live allocation.
#[derive(Debug)]
pub(crate) struct Allocation {
    pub(crate) buf: HostBuf,
}

/// One device's address space.
#[derive(Debug)]
pub(crate) struct DeviceMemory {
    pub(crate) total: u64,
    pub(crate) used: u64,
    next_offset: u64,
    allocations: BTreeMap<u64, Allocation>,
}

impl DeviceMemory {
    /// Live allocations.
    pub(crate) fn allocation_count(&self) -> usize {
        self.allocations.len()
    }
}

/// All devices' memory; lives behind the emulator's memory lock.
#[derive(Debug)]
pub(crate) struct MemoryState {
    pub(crate) devices: Vec<DeviceMemory>,
}

impl MemoryState {
    pub(crate) fn new(totals: impl Iterator<Item = u64>) -> MemoryState {
        MemoryState {
            devices: totals
                .map(|total| DeviceMemory {
                    total,
                    used: 0,
                    next_offset: FIRST_OFFSET,
                    allocations: BTreeMap::new(),
                })
                .collect(),
        }
    }

    pub(crate) fn malloc(&mut self, device: usize, bytes: usize) -> Result<DevicePtr> {
        let count = self.devices.len();
        let mem = self
            .devices
            .get_mut(device)
            .ok_or(DeviceError::InvalidIndex {
                index: device,
                count,
            })?;
        if bytes == 0 {
            return Err(DeviceError::Driver {
                call: "cuMemAlloc",
                code: "CUDA_ERROR_INVALID_VALUE".into(),
                detail: "cannot allocate 0 bytes".into(),
            });
        }
        let size = bytes as u64;
        if mem.used.checked_add(size).is_none_or(|u| u > mem.total) {
            return Err(DeviceError::OutOfMemory { device, bytes });
        }
        let span = size.div_ceil(ALLOCATION_ALIGN) * ALLOCATION_ALIGN + ALLOCATION_ALIGN;
        let offset = if mem.next_offset + span <= OFFSET_MASK {
            mem.next_offset
        } else {
            // Wrapped: first gap that fits.
            let mut candidate = FIRST_OFFSET;
            let mut found = None;
            for (&base, a) in &mem.allocations {
                let base_off = base & OFFSET_MASK;
                if candidate + span <= base_off {
                    found = Some(candidate);
                    break;
                }
                let end =
                    base_off + (a.buf.len as u64).div_ceil(ALLOCATION_ALIGN) * ALLOCATION_ALIGN;
                candidate = candidate.max(end + ALLOCATION_ALIGN);
            }
            match found {
                Some(c) => c,
                None if candidate + span <= OFFSET_MASK => candidate,
                None => return Err(DeviceError::OutOfMemory { device, bytes }),
            }
        };
        mem.next_offset = offset + span;
        let ptr = tagged_address(device, offset);
        mem.allocations.insert(
            ptr.0,
            Allocation {
                buf: HostBuf::new(bytes),
            },
        );
        mem.used += size;
        Ok(ptr)
    }

    pub(crate) fn free(&mut self, device: usize, ptr: DevicePtr) -> Result<()> {
        let count = self.devices.len();
        let mem = self
            .devices
            .get_mut(device)
            .ok_or(DeviceError::InvalidIndex {
                index: device,
                count,
            })?;
        let Some(a) = mem.allocations.remove(&ptr.0) else {
            let detail = match device_of_address(ptr) {
                Some(d) if d != device => format!("pointer belongs to cuda:{d}, not cuda:{device}"),
                _ => "not the base of a live allocation on this device".to_string(),
            };
            return Err(DeviceError::Driver {
                call: "cuMemFree",
                code: "CUDA_ERROR_INVALID_VALUE".into(),
                detail: format!("{ptr:?}: {detail}"),
            });
        };
        mem.used -= a.buf.len as u64;
        Ok(())
    }

    /// The host address of `[ptr, ptr + len)`, checked to lie inside one live allocation.
    /// `call` names the operation for the error.
    pub(crate) fn translate(
        &self,
        call: &'static str,
        ptr: DevicePtr,
        len: usize,
    ) -> Result<*mut u8> {
        let invalid = |detail: String| DeviceError::Driver {
            call,
            code: "CUDA_ERROR_INVALID_VALUE".into(),
            detail,
        };
        let Some(device) = device_of_address(ptr) else {
            return Err(invalid(format!(
                "{ptr:?} is not an emulated device address"
            )));
        };
        let Some(mem) = self.devices.get(device) else {
            return Err(invalid(format!(
                "{ptr:?} names cuda:{device}, but the emulator has {} device(s)",
                self.devices.len()
            )));
        };
        let Some((&base, a)) = mem.allocations.range(..=ptr.0).next_back() else {
            return Err(invalid(format!("{ptr:?} is not inside a live allocation")));
        };
        let start = ptr.0 - base;
        let size = a.buf.len as u64;
        if start >= size && !(start == size && len == 0) {
            return Err(invalid(format!("{ptr:?} is not inside a live allocation")));
        }
        if start + len as u64 > size {
            return Err(invalid(format!(
                "access of {len} bytes at offset {start} overruns the allocation at {:?} of {size} bytes",
                DevicePtr(base)
            )));
        }
        // SAFETY: start <= size, so the result is within (or one past) the buffer.
        Ok(unsafe { a.buf.as_ptr().add(start as usize) })
    }

    /// `[ptr, ptr + len)` as a host slice, checked like [`MemoryState::translate`].
    pub(crate) fn slice(&self, call: &'static str, ptr: DevicePtr, len: usize) -> Result<&[u8]> {
        let p = self.translate(call, ptr, len)?;
        if len == 0 {
            return Ok(&[]);
        }
        // SAFETY: `translate` checked that [p, p + len) lies inside a live buffer owned by
        // `self`; the shared borrow of `self` keeps it alive and excludes `slice_mut`.
        Ok(unsafe { std::slice::from_raw_parts(p, len) })
    }

    /// `[ptr, ptr + len)` as a mutable host slice, checked like [`MemoryState::translate`].
    pub(crate) fn slice_mut(
        &mut self,
        call: &'static str,
        ptr: DevicePtr,
        len: usize,
    ) -> Result<&mut [u8]> {
        let p = self.translate(call, ptr, len)?;
        if len == 0 {
            return Ok(&mut []);
        }
        // SAFETY: as in `slice`; the exclusive borrow of `self` makes this the only reference
        // into the buffer while it lives.
        Ok(unsafe { std::slice::from_raw_parts_mut(p, len) })
    }

    /// The host address at which `ptr` lies, with no length check (for kernels, which carry
    /// their own bounds); null when `ptr` is not inside a live allocation.
    pub(crate) fn translate_base(&self, ptr: DevicePtr) -> *mut u8 {
        self.translate("kernel", ptr, 0)
            .unwrap_or(std::ptr::null_mut())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tagged_addresses_are_not_host_addresses() {
        for device in [0usize, 1, 7, 8, 200, 255] {
            for offset in [0u64, FIRST_OFFSET, OFFSET_MASK] {
                let p = tagged_address(device, offset).0;
                // x86-64 4-level: bits 63..47 must all equal for a canonical address.
                let top17 = p >> 47;
                assert!(top17 != 0 && top17 != (1 << 17) - 1, "{p:#x}");
                // x86-64 5-level: bits 63..56.
                let top8 = p >> 56;
                assert!(top8 != 0 && top8 != 0xFF, "{p:#x}");
                // AArch64 with top-byte-ignore: bits 55..48 and 55..52 must be uniform.
                let b55_48 = (p >> 48) & 0xFF;
                assert!(b55_48 != 0 && b55_48 != 0xFF, "{p:#x}");
                let b55_52 = (p >> 52) & 0xF;
                assert!(b55_52 != 0 && b55_52 != 0xF, "{p:#x}");
                assert_eq!(device_of_address(DevicePtr(p)), Some(device));
            }
        }
        assert_eq!(device_of_address(DevicePtr(0x7fff_0000_1000)), None);
        assert_eq!(device_of_address(DevicePtr::NULL), None);
    }

    #[test]
    fn translate_checks_bounds_and_interior_pointers() {
        let mut m = MemoryState::new([1 << 20, 1 << 20].into_iter());
        let a = m.malloc(0, 100).unwrap();
        let b = m.malloc(0, 100).unwrap();
        assert!(b.0 >= a.0 + 100 + ALLOCATION_ALIGN);
        assert!(m.translate("t", a, 100).is_ok());
        assert!(m.translate("t", a.offset(99), 1).is_ok());
        assert!(m.translate("t", a.offset(100), 0).is_ok());
        let err = m.translate("t", a.offset(50), 51).unwrap_err().to_string();
        assert!(
            err.contains("overruns") && err.contains("100 bytes"),
            "{err}"
        );
        assert!(m.translate("t", a.offset(100), 1).is_err());
        assert!(m.translate("t", DevicePtr(a.0 - 1), 1).is_err());
        m.free(0, a).unwrap();
        assert!(m.translate("t", a, 1).is_err());
        assert!(m.free(0, a).is_err());
        assert!(m.free(1, b).unwrap_err().to_string().contains("cuda:0"));
    }
}
