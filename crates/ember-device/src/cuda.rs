//! `torch.cuda`: discovery, the thread's current device, streams and events.
//!
//! Note [Choosing the CUDA driver]:
//!
//! The process has one CUDA driver, chosen once, lazily, by the first call that needs it:
//! 1. if `EMBER_CUDA_EMULATOR=N` asks for the emulator (see
//!    [`EmulatorConfig::from_env`]), the emulator with that configuration — or, if the
//!    variables are malformed, no driver, with the parse error as the reason;
//! 2. else the real driver if [`RealDriver::probe`] succeeds;
//! 3. else no driver: [`is_available`] is `false` and [`unavailable_reason`] says why.
//!
//! The emulator is never used silently in place of a missing GPU. Tests install it
//! explicitly with [`use_emulator`] before anything else chooses; every test in the
//! workspace uses `EmulatorConfig::devices(2)` so that they agree within one test binary.
//!
//! The current device is per thread (default 0), as in PyTorch.

use std::cell::Cell;
use std::sync::{Arc, OnceLock};

use crate::driver::emulator::{Emulator, EmulatorConfig};
use crate::driver::real::RealDriver;
use crate::driver::{DeviceProperties, Driver, DriverKind, EventHandle, StreamHandle};
use crate::error::{DeviceError, Result};

#[derive(Debug)]
enum Choice {
    Driver {
        driver: Arc<dyn Driver>,
        /// The emulator's configuration, when the driver is the emulator.
        emulator: Option<EmulatorConfig>,
    },
    Unavailable(String),
}

static CHOICE: OnceLock<Choice> = OnceLock::new();

thread_local! {
    static CURRENT: Cell<usize> = const { Cell::new(0) };
}

fn choose() -> Choice {
    match EmulatorConfig::from_env() {
        Ok(Some(config)) => match Emulator::new(config.clone()) {
            Ok(emulator) => Choice::Driver {
                driver: Arc::new(emulator),
                emulator: Some(config),
            },
            Err(e) => Choice::Unavailable(e.to_string()),
        },
        Ok(None) => match RealDriver::probe() {
            Ok(driver) => Choice::Driver {
                driver: Arc::new(driver),
                emulator: None,
            },
            Err(reason) => Choice::Unavailable(reason),
        },
        Err(e) => Choice::Unavailable(e.to_string()),
    }
}

fn choice() -> &'static Choice {
    CHOICE.get_or_init(choose)
}

/// Install the CPU emulator as the process's CUDA driver (for tests).
///
/// Succeeds if no driver was chosen yet, or if the emulator with an equal configuration is
/// already installed; fails if anything else was chosen (the real driver, no driver, or an
/// emulator with another configuration). See Note [Choosing the CUDA driver].
///
/// ```
/// use ember_device::{cuda, driver::emulator::EmulatorConfig};
/// cuda::use_emulator(EmulatorConfig::devices(2)).unwrap();
/// assert!(cuda::is_available() && cuda::is_emulated());
/// assert_eq!(cuda::device_count(), 2);
/// ```
pub fn use_emulator(config: EmulatorConfig) -> Result<()> {
    if config.devices.is_empty() {
        return Err(DeviceError::Emulator(
            "use_emulator needs at least one device, found 0".into(),
        ));
    }
    config.validate()?;
    let installed = CHOICE.get_or_init(|| match Emulator::new(config.clone()) {
        Ok(emulator) => Choice::Driver {
            driver: Arc::new(emulator),
            emulator: Some(config.clone()),
        },
        Err(e) => Choice::Unavailable(e.to_string()),
    });
    match installed {
        Choice::Driver {
            emulator: Some(existing),
            ..
        } if *existing == config => Ok(()),
        Choice::Driver {
            emulator: Some(existing),
            ..
        } => Err(DeviceError::Emulator(format!(
            "an emulator with another configuration is already the process's CUDA driver \
             (installed: {} device(s), {:?}; requested: {} device(s), {:?}); every test must \
             use the same configuration, EmulatorConfig::devices(2)",
            existing.devices.len(),
            existing.devices.first(),
            config.devices.len(),
            config.devices.first()
        ))),
        Choice::Driver { .. } => Err(DeviceError::Emulator(
            "the real CUDA driver was already chosen for this process; call use_emulator \
             before any other CUDA call"
                .into(),
        )),
        Choice::Unavailable(reason) => Err(DeviceError::Emulator(format!(
            "CUDA was already found unavailable for this process ({reason}); call use_emulator \
             before any other CUDA call"
        ))),
    }
}

/// The process's CUDA driver, or [`DeviceError::CudaUnavailable`] with the reason.
pub fn driver() -> Result<Arc<dyn Driver>> {
    match choice() {
        Choice::Driver { driver, .. } => Ok(Arc::clone(driver)),
        Choice::Unavailable(reason) => Err(DeviceError::CudaUnavailable {
            reason: reason.clone(),
        }),
    }
}

/// `torch.cuda.is_initialized()`: whether the process's CUDA driver was chosen already (by
/// any CUDA call, or [`use_emulator`]). Asking does not choose one.
pub fn is_initialized() -> bool {
    CHOICE.get().is_some()
}

/// The process's CUDA driver if one was chosen already and is usable; never chooses one
/// (for observers such as the profiler, which must not fix the process's choice).
pub fn initialized_driver() -> Option<Arc<dyn Driver>> {
    match CHOICE.get()? {
        Choice::Driver { driver, .. } => Some(Arc::clone(driver)),
        Choice::Unavailable(_) => None,
    }
}

/// `torch.cuda.is_available()`: a driver was found and it has at least one device.
pub fn is_available() -> bool {
    device_count() > 0
}

/// Why CUDA is not available (no driver library, no device, driver too old, a malformed
/// `EMBER_CUDA_EMULATOR`); `None` when it is.
pub fn unavailable_reason() -> Option<String> {
    match choice() {
        Choice::Driver { driver, .. } if driver.device_count() == 0 => {
            Some("no CUDA device found".to_string())
        }
        Choice::Driver { .. } => None,
        Choice::Unavailable(reason) => Some(reason.clone()),
    }
}

/// `true` when the process's driver is the CPU emulator.
pub fn is_emulated() -> bool {
    matches!(
        choice(),
        Choice::Driver {
            emulator: Some(_),
            ..
        }
    )
}

/// Which driver is in use, if any.
pub fn driver_kind() -> Option<DriverKind> {
    match choice() {
        Choice::Driver { driver, .. } => Some(driver.kind()),
        Choice::Unavailable(_) => None,
    }
}

/// Number of CUDA devices; 0 when CUDA is unavailable.
pub fn device_count() -> usize {
    match choice() {
        Choice::Driver { driver, .. } => driver.device_count(),
        Choice::Unavailable(_) => 0,
    }
}

fn check_index(index: usize) -> Result<Arc<dyn Driver>> {
    let driver = driver()?;
    let count = driver.device_count();
    if index < count {
        Ok(driver)
    } else {
        Err(DeviceError::InvalidIndex { index, count })
    }
}

/// The thread's current CUDA device (default 0).
pub fn current_device() -> Result<usize> {
    driver()?;
    Ok(CURRENT.with(Cell::get))
}

/// The thread's current CUDA device index without asking for a driver (0 until
/// [`set_device`] chose another): what an index-less `"cuda"` means.
pub(crate) fn current_index() -> usize {
    CURRENT.with(Cell::get)
}

/// Make `index` the thread's current CUDA device.
pub fn set_device(index: usize) -> Result<()> {
    check_index(index)?;
    CURRENT.with(|c| c.set(index));
    Ok(())
}

/// Switches the thread's current device for a scope and restores the previous one on drop
/// (`torch.cuda.device(i)` as a context manager).
///
/// ```
/// use ember_device::{cuda, driver::emulator::EmulatorConfig};
/// cuda::use_emulator(EmulatorConfig::devices(2)).unwrap();
/// {
///     let _guard = cuda::DeviceGuard::new(1).unwrap();
///     assert_eq!(cuda::current_device().unwrap(), 1);
/// }
/// assert_eq!(cuda::current_device().unwrap(), 0);
/// ```
#[derive(Debug)]
#[must_use = "the previous device is restored when the guard drops"]
pub struct DeviceGuard {
    previous: usize,
}

impl DeviceGuard {
    /// Make `index` current until the guard drops.
    pub fn new(index: usize) -> Result<DeviceGuard> {
        let previous = current_device()?;
        set_device(index)?;
        Ok(DeviceGuard { previous })
    }

    /// The device that will be current again after the guard drops.
    pub fn previous(&self) -> usize {
        self.previous
    }
}

impl Drop for DeviceGuard {
    fn drop(&mut self) {
        CURRENT.with(|c| c.set(self.previous));
    }
}

/// `torch.cuda.get_device_name(i)`.
pub fn get_device_name(index: usize) -> Result<String> {
    Ok(get_device_properties(index)?.name)
}

/// `torch.cuda.get_device_properties(i)`.
pub fn get_device_properties(index: usize) -> Result<DeviceProperties> {
    check_index(index)?.properties(index)
}

/// `torch.cuda.synchronize(device)`: wait for all work on a device (the current one for
/// `None`).
pub fn synchronize(device: Option<usize>) -> Result<()> {
    let index = match device {
        Some(i) => i,
        None => current_device()?,
    };
    check_index(index)?.synchronize(index)
}

/// `torch.cuda.mem_get_info(i)`: `(free, total)` bytes.
pub fn mem_get_info(index: usize) -> Result<(u64, u64)> {
    check_index(index)?.mem_get_info(index)
}

/// A CUDA stream on the process driver; destroyed on drop (except a default stream).
#[derive(Debug)]
pub struct Stream {
    driver: Arc<dyn Driver>,
    handle: StreamHandle,
    device: usize,
    owned: bool,
}

impl Stream {
    /// A new stream on `device`.
    pub fn new(device: usize) -> Result<Stream> {
        let driver = check_index(device)?;
        let handle = driver.stream_create(device)?;
        Ok(Stream {
            driver,
            handle,
            device,
            owned: true,
        })
    }

    /// The default stream of `device` (never destroyed).
    pub fn default_stream(device: usize) -> Result<Stream> {
        Ok(Stream {
            driver: check_index(device)?,
            handle: StreamHandle::DEFAULT,
            device,
            owned: false,
        })
    }

    /// The driver's handle.
    pub fn handle(&self) -> StreamHandle {
        self.handle
    }

    /// The device the stream belongs to.
    pub fn device(&self) -> usize {
        self.device
    }

    /// Wait for all work on the stream.
    pub fn synchronize(&self) -> Result<()> {
        self.driver.stream_synchronize(self.handle)
    }

    /// `true` when all work on the stream is done.
    pub fn query(&self) -> Result<bool> {
        self.driver.stream_query(self.handle)
    }

    /// Make future work on this stream wait for `event`.
    pub fn wait_event(&self, event: &Event) -> Result<()> {
        self.driver.stream_wait_event(self.handle, event.handle)
    }

    /// Record a new event on this stream and return it (`torch.cuda.Stream.record_event`).
    pub fn record_event(&self, timing: bool) -> Result<Event> {
        let event = Event::new(self.device, timing)?;
        event.record(self)?;
        Ok(event)
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if self.owned {
            // Errors cannot be reported from drop; a failed destroy only leaks the handle.
            let _ = self.driver.stream_destroy(self.handle);
        }
    }
}

thread_local! {
    /// Per device ordinal, the stream this thread's work goes to (`None`: the default).
    static CURRENT_STREAMS: std::cell::RefCell<Vec<Option<StreamHandle>>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// `torch.cuda.current_stream(device)` as a handle: the stream this thread's work on
/// `device` is enqueued on — the innermost [`StreamGuard`]'s, else the default stream.
pub fn current_stream(device: usize) -> StreamHandle {
    CURRENT_STREAMS.with(|c| {
        c.borrow()
            .get(device)
            .copied()
            .flatten()
            .unwrap_or(StreamHandle::DEFAULT)
    })
}

fn set_current_stream(device: usize, stream: Option<StreamHandle>) -> Option<StreamHandle> {
    CURRENT_STREAMS.with(|c| {
        let mut v = c.borrow_mut();
        if v.len() <= device {
            v.resize(device + 1, None);
        }
        std::mem::replace(&mut v[device], stream)
    })
}

/// `with torch.cuda.stream(s):` — makes `stream` the current stream of its device on this
/// thread until dropped, then restores the previous one. The stream must outlive the guard
/// (the borrow ensures it).
///
/// ```
/// use ember_device::cuda::{self, Stream, StreamGuard};
/// use ember_device::driver::{StreamHandle, emulator::EmulatorConfig};
/// cuda::use_emulator(EmulatorConfig::devices(2))?;
/// let s = Stream::new(0)?;
/// {
///     let _g = StreamGuard::new(&s);
///     assert_eq!(cuda::current_stream(0), s.handle());
/// }
/// assert_eq!(cuda::current_stream(0), StreamHandle::DEFAULT);
/// # Ok::<(), ember_device::DeviceError>(())
/// ```
#[derive(Debug)]
pub struct StreamGuard<'a> {
    device: usize,
    previous: Option<StreamHandle>,
    _stream: std::marker::PhantomData<&'a Stream>,
}

impl<'a> StreamGuard<'a> {
    /// Make `stream` current for its device on this thread.
    pub fn new(stream: &'a Stream) -> StreamGuard<'a> {
        StreamGuard {
            device: stream.device,
            previous: set_current_stream(stream.device, Some(stream.handle)),
            _stream: std::marker::PhantomData,
        }
    }
}

impl Drop for StreamGuard<'_> {
    fn drop(&mut self) {
        set_current_stream(self.device, self.previous);
    }
}

/// A CUDA event on the process driver; destroyed on drop.
#[derive(Debug)]
pub struct Event {
    driver: Arc<dyn Driver>,
    handle: EventHandle,
    device: usize,
}

impl Event {
    /// A new event on `device`; `timing` enables [`Event::elapsed_time`].
    pub fn new(device: usize, timing: bool) -> Result<Event> {
        let driver = check_index(device)?;
        let handle = driver.event_create(device, timing)?;
        Ok(Event {
            driver,
            handle,
            device,
        })
    }

    /// The driver's handle.
    pub fn handle(&self) -> EventHandle {
        self.handle
    }

    /// The device the event belongs to.
    pub fn device(&self) -> usize {
        self.device
    }

    /// Record the event on `stream`.
    pub fn record(&self, stream: &Stream) -> Result<()> {
        self.driver.event_record(self.handle, stream.handle)
    }

    /// Wait for the event to complete.
    pub fn synchronize(&self) -> Result<()> {
        self.driver.event_synchronize(self.handle)
    }

    /// `true` when the event has completed.
    pub fn query(&self) -> Result<bool> {
        self.driver.event_query(self.handle)
    }

    /// Milliseconds from this event to `end` (both recorded, both with timing).
    pub fn elapsed_time(&self, end: &Event) -> Result<f32> {
        self.driver.event_elapsed_ms(self.handle, end.handle)
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // Errors cannot be reported from drop; a failed destroy only leaks the handle.
        let _ = self.driver.event_destroy(self.handle);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup() {
        use_emulator(EmulatorConfig::devices(2)).unwrap();
    }

    #[test]
    fn emulator_is_installed_and_says_so() {
        setup();
        assert!(is_available() && is_emulated());
        assert_eq!(unavailable_reason(), None);
        assert_eq!(driver_kind(), Some(DriverKind::Emulated));
        assert!(get_device_name(1).unwrap().contains("Emulated"));
        assert!(get_device_properties(0).unwrap().emulated);
    }

    #[test]
    fn a_different_config_is_refused_clearly() {
        setup();
        let err = use_emulator(EmulatorConfig::devices(3))
            .unwrap_err()
            .to_string();
        assert!(err.contains("another configuration"), "{err}");
        assert!(use_emulator(EmulatorConfig::devices(0)).is_err());
        setup();
    }

    #[test]
    fn set_device_out_of_range_names_index_and_count() {
        setup();
        let err = set_device(5).unwrap_err().to_string();
        assert!(err.contains('5') && err.contains('2'), "{err}");
        assert_eq!(current_device().unwrap(), 0);
    }

    #[test]
    fn an_index_less_cuda_parses_as_the_current_device() {
        use crate::Device;
        setup();
        std::thread::spawn(|| {
            assert_eq!("cuda".parse::<Device>().unwrap(), Device::Cuda(0));
            set_device(1).unwrap();
            assert_eq!("cuda".parse::<Device>().unwrap(), Device::Cuda(1));
            assert_eq!(" cuda ".parse::<Device>().unwrap(), Device::Cuda(1));
            assert_eq!("cuda:0".parse::<Device>().unwrap(), Device::Cuda(0));
            let _g = DeviceGuard::new(0).unwrap();
            assert_eq!("cuda".parse::<Device>().unwrap(), Device::Cuda(0));
        })
        .join()
        .unwrap();
    }

    #[test]
    fn guard_restores_and_is_per_thread() {
        setup();
        {
            let g = DeviceGuard::new(1).unwrap();
            assert_eq!(g.previous(), 0);
            assert_eq!(current_device().unwrap(), 1);
            std::thread::spawn(|| assert_eq!(current_device().unwrap(), 0))
                .join()
                .unwrap();
        }
        assert_eq!(current_device().unwrap(), 0);
        assert!(DeviceGuard::new(9).is_err());
        assert_eq!(current_device().unwrap(), 0);
    }
}
