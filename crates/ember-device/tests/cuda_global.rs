#![allow(clippy::unwrap_used)]
//! `ember_device::cuda` over the process-global emulator (`EmulatorConfig::devices(2)`, as
//! every test in the workspace), and the real driver's probe.

use std::time::Duration;

use ember_device::cuda::{self, DeviceGuard, Event, Stream};
use ember_device::driver::emulator::EmulatorConfig;
use ember_device::driver::real::RealDriver;
use ember_device::driver::{Driver, StreamHandle};
use ember_device::{Device, DeviceError, try_all_gpus, try_gpu};

fn setup() {
    cuda::use_emulator(EmulatorConfig::devices(2)).unwrap();
}

#[test]
fn discovery_over_the_emulator() {
    setup();
    assert!(cuda::is_available());
    assert!(cuda::is_emulated());
    assert_eq!(cuda::device_count(), 2);
    assert_eq!(try_gpu(1), Device::Cuda(1));
    assert_eq!(try_gpu(2), Device::Cpu);
    assert_eq!(try_all_gpus(), vec![Device::Cuda(0), Device::Cuda(1)]);
    let props = cuda::get_device_properties(0).unwrap();
    assert_eq!((props.major, props.minor), (9, 0));
    assert_eq!(props.total_memory, 16 << 30);
    let (free, total) = cuda::mem_get_info(1).unwrap();
    assert!(free <= total && total == 16 << 30);
    cuda::synchronize(None).unwrap();
    cuda::synchronize(Some(1)).unwrap();
    assert!(matches!(
        cuda::synchronize(Some(2)),
        Err(DeviceError::InvalidIndex { index: 2, count: 2 })
    ));
}

#[test]
fn set_device_and_guard() {
    setup();
    let err = cuda::set_device(7).unwrap_err().to_string();
    assert!(err.contains('7') && err.contains("2 CUDA devices"), "{err}");
    let err = cuda::get_device_name(3).unwrap_err().to_string();
    assert!(err.contains('3') && err.contains('2'), "{err}");
    {
        let _g = DeviceGuard::new(1).unwrap();
        assert_eq!(cuda::current_device().unwrap(), 1);
        {
            let _inner = DeviceGuard::new(0).unwrap();
            assert_eq!(cuda::current_device().unwrap(), 0);
        }
        assert_eq!(cuda::current_device().unwrap(), 1);
    }
    assert_eq!(cuda::current_device().unwrap(), 0);
}

#[test]
fn stream_and_event_wrappers() {
    setup();
    let stream = Stream::new(1).unwrap();
    assert_eq!(stream.device(), 1);
    assert!(stream.query().unwrap());
    let start = Event::new(1, true).unwrap();
    let end = Event::new(1, true).unwrap();
    start.record(&stream).unwrap();
    std::thread::sleep(Duration::from_millis(15));
    end.record(&stream).unwrap();
    end.synchronize().unwrap();
    assert!(end.query().unwrap());
    assert!(start.elapsed_time(&end).unwrap() >= 15.0);
    stream.wait_event(&end).unwrap();
    stream.synchronize().unwrap();
    let marker = stream.record_event(false).unwrap();
    assert!(start.elapsed_time(&marker).is_err());

    // A default stream is valid and not destroyed on drop.
    let default = Stream::default_stream(0).unwrap();
    assert_eq!(default.handle(), StreamHandle::DEFAULT);
    drop(default);
    // Dropping the wrappers destroys their handles.
    let driver = cuda::driver().unwrap();
    let (sh, eh) = (stream.handle(), start.handle());
    drop(stream);
    drop(start);
    assert!(driver.stream_query(sh).is_err());
    assert!(driver.event_query(eh).is_err());
    assert!(Stream::new(2).is_err());
}

#[test]
fn real_probe_reports_the_reason_without_panicking() {
    // SAFETY: only probes whether the library can be loaded.
    let library = unsafe { cudarc::driver::sys::is_culib_present() };
    match RealDriver::probe() {
        Ok(driver) => assert!(library && driver.device_count() > 0),
        Err(reason) if !library => {
            assert_eq!(reason, "no CUDA driver library (libcuda.so) found");
        }
        Err(reason) => assert!(reason.contains("CUDA"), "{reason}"),
    }
}
