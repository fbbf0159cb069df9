//! `test_device!`: one test body, one `#[test]` per device.

/// Stamps one `#[test]` per device from one body, so that a failure names its device.
///
/// `test_device!(name, body)` writes `name_cpu` and `name_cuda` (`cuda:0`);
/// `test_device!(name, body, [cpu, cuda, cuda1])` picks the devices (`cuda1` is `cuda:1`).
/// `body` is a function or closure taking `&Device` and returning `()` or a `Result` whose
/// error implements `Display`; each test calls it through [`run_on`](crate::run_on), which
/// makes the device ready (the emulator, or the real GPU under `EMBER_GPU_TEST=1`: Note
/// [Test devices] in `device.rs`).
///
/// ```
/// use ember_tensor::{Device, Result, Tensor};
/// use ember_testing::{assert_close, test_device};
///
/// fn doubles(device: &Device) -> Result<()> {
///     let x = Tensor::from_slice(&[1f32, 2., 3.], [3], device)?;
///     assert_close(&x.add(&x)?, &[2.0, 4.0, 6.0][..]);
///     Ok(())
/// }
/// // `doubles_cpu` and `doubles_cuda`, each a `#[test]`:
/// test_device!(doubles, doubles);
/// ```
#[macro_export]
macro_rules! test_device {
    ($name:ident, $body:expr $(,)?) => {
        $crate::test_device!($name, $body, [cpu, cuda]);
    };
    ($name:ident, $body:expr, [$($device:ident),+ $(,)?]) => {
        $crate::__paste::paste! {
            $(
                #[test]
                fn [<$name _ $device>]() {
                    $crate::run_on(
                        concat!(stringify!($name), "_", stringify!($device)),
                        $crate::__test_device_device!($device),
                        $body,
                    );
                }
            )+
        }
    };
}

/// The device a `test_device!` suffix names.
#[doc(hidden)]
#[macro_export]
macro_rules! __test_device_device {
    (cpu) => {
        $crate::Device::Cpu
    };
    (cuda) => {
        $crate::Device::Cuda(0)
    };
    (cuda1) => {
        $crate::Device::Cuda(1)
    };
}
