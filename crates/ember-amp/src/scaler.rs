//! `GradScaler`: loss scaling for f16 training (`torch.amp.GradScaler`).
//!
//! Gradients of an f16 forward pass underflow to zero when they are smaller than f16's
//! smallest subnormal (~6e-8). The scaler multiplies the loss by a large factor (2^16 at
//! first) before `backward`, so the gradients are computed scaled, and divides them by the
//! same factor before the optimizer uses them. A scale that is too large makes some gradient
//! overflow to inf (or NaN): that step is skipped and the scale backed off; after
//! `growth_interval` steps without one, the scale grows again.
//!
//! ```
//! use ember_amp::scaler::GradScaler;
//! use ember_nn::optim::{Optimizer, SGD, SgdOptions};
//! use ember_nn::Tensor;
//! use ember_tensor::Device;
//!
//! let w = Tensor::from_vec(vec![1f32, 2.], [2], &Device::Cpu)?.requires_grad_(true)?;
//! let mut opt = SGD::new(vec![w.clone()], SgdOptions { lr: 0.1, ..Default::default() })?;
//! let mut scaler = GradScaler::new(Device::Cpu)?;
//! let loss = w.mul(&w)?.sum_all()?;
//! scaler.scale(&loss)?.backward()?;        // grads are 65536 * 2w
//! assert!(scaler.step(&mut opt)?);         // unscaled to 2w, no inf: stepped
//! scaler.update()?;
//! assert_eq!(w.to_vec::<f32>()?, vec![0.8, 1.6]);
//! # Ok::<(), ember_autograd::Error>(())
//! ```
//!
//! Note [GradScaler state]:
//! As PyTorch's, per optimizer (keyed by the optimizer's address, PyTorch's `id()`), a
//! stage READY -> UNSCALED (`unscale_`) -> STEPPED (`step`), reset to READY for every
//! optimizer by `update`, and the found-inf flags of its last unscale, one 1-element f32
//! tensor per device that stays on that device until `step` reads it (one `item()`, the
//! only synchronisation of a step). The scale (f32) and the growth tracker (i32) are
//! 1-element tensors on the scaler's device, made by the first `scale` call; `update` runs
//! `_amp_update_scale_` on them where they are (a one-thread kernel on CUDA). The inf/NaN
//! check and the unscale are one fused pass over all gradients of a device
//! (`ember_tensor::Tensor::amp_foreach_non_finite_check_and_unscale_`: one parallel loop
//! on the CPU, one multi-tensor launch per dtype on CUDA). Every call checks everything it
//! can before it changes anything, so an error leaves the scaler as it was.
//! The optimizer's address is its identity, so an optimizer must not be moved between its
//! `unscale_` and its `step` of one iteration (a training loop borrows it; a moved one would
//! look new to the scaler and be unscaled twice).

use std::collections::HashMap;

use ember_autograd::{Error, ErrorKind, Result, Tensor};
use ember_nn::optim::Optimizer;
use ember_nn::{StateDict, Value};
use ember_tensor::{DType, Device, Shape, Tensor as Raw};

/// A scaler's error: the message, and the [`ErrorKind`] it is carried as in [`Error`].
#[derive(Debug, Clone, PartialEq)]
pub struct ScalerError {
    /// The call that failed (`unscale_`, `step`, `load_state_dict`, ...).
    pub op: &'static str,
    /// What was wrong and what to do.
    pub msg: String,
}

impl std::fmt::Display for ScalerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GradScaler.{}: {}", self.op, self.msg)
    }
}

impl std::error::Error for ScalerError {}

fn err(kind: ErrorKind, op: &'static str, msg: impl Into<String>) -> Error {
    Error::new(
        kind,
        ScalerError {
            op,
            msg: msg.into(),
        },
    )
}

/// The keys of [`GradScaler::state_dict`], PyTorch's.
pub const STATE_KEYS: [&str; 5] = [
    "scale",
    "growth_factor",
    "backoff_factor",
    "growth_interval",
    "_growth_tracker",
];

/// The options of a [`GradScaler`] (PyTorch's constructor arguments and defaults).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GradScalerOptions {
    /// The first scale (2^16).
    pub init_scale: f64,
    /// Multiplies the scale after `growth_interval` steps without inf/NaN (2.0; > 1).
    pub growth_factor: f64,
    /// Multiplies the scale after a step with inf/NaN (0.5; in (0, 1)).
    pub backoff_factor: f64,
    /// Steps without inf/NaN between two growths (2000; > 0).
    pub growth_interval: i64,
    /// `false`: every call is a pass-through (`scale` returns the loss, `step` steps).
    pub enabled: bool,
}

impl Default for GradScalerOptions {
    fn default() -> Self {
        GradScalerOptions {
            init_scale: 65536.0,
            growth_factor: 2.0,
            backoff_factor: 0.5,
            growth_interval: 2000,
            enabled: true,
        }
    }
}

fn check_growth_factor(op: &'static str, v: f64) -> Result<()> {
    if v > 1.0 && v.is_finite() {
        Ok(())
    } else {
        Err(err(
            ErrorKind::InvalidArgument,
            op,
            format!("The growth factor must be > 1.0 (and finite), but got {v}"),
        ))
    }
}

fn check_backoff_factor(op: &'static str, v: f64) -> Result<()> {
    if v > 0.0 && v < 1.0 {
        Ok(())
    } else {
        Err(err(
            ErrorKind::InvalidArgument,
            op,
            format!("The backoff factor must be < 1.0 (and > 0), but got {v}"),
        ))
    }
}

fn check_growth_interval(op: &'static str, v: i64) -> Result<()> {
    if v > 0 && v <= i64::from(i32::MAX) {
        Ok(())
    } else {
        Err(err(
            ErrorKind::InvalidArgument,
            op,
            format!(
                "the growth interval must be a positive integer of at most {}, but got {v}",
                i32::MAX
            ),
        ))
    }
}

fn check_scale(op: &'static str, what: &str, v: f64) -> Result<()> {
    // The scale lives in an f32: it must be positive and finite there.
    if v > 0.0 && (v as f32).is_finite() {
        Ok(())
    } else {
        Err(err(
            ErrorKind::InvalidArgument,
            op,
            format!("{what} must be a positive, finite f32 value, but got {v}"),
        ))
    }
}

/// Where an optimizer is in the current iteration (PyTorch's `OptState`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    Ready,
    Unscaled,
    Stepped,
}

/// One optimizer's state for the current iteration. See Note [GradScaler state].
#[derive(Debug)]
struct PerOptimizer {
    stage: Stage,
    /// One 1-element f32 flag per device, on that device.
    found_inf_per_device: Vec<(Device, Raw)>,
}

impl Default for PerOptimizer {
    fn default() -> Self {
        PerOptimizer {
            stage: Stage::Ready,
            found_inf_per_device: Vec::new(),
        }
    }
}

/// Loss scaling for mixed-precision training (`torch.amp.GradScaler`). See the module
/// documentation and Note [GradScaler state].
#[derive(Debug)]
pub struct GradScaler {
    device: Device,
    enabled: bool,
    init_scale: f64,
    growth_factor: f64,
    backoff_factor: f64,
    growth_interval: i64,
    init_growth_tracker: i64,
    /// The scale (0-dim f32) and growth tracker (0-dim i32) on `device`, made by the first
    /// `scale`.
    scale: Option<Raw>,
    growth_tracker: Option<Raw>,
    per_optimizer: HashMap<usize, PerOptimizer>,
}

/// An optimizer's identity for the per-optimizer states: its address (PyTorch's `id()`).
fn key<O: Optimizer + ?Sized>(optimizer: &O) -> usize {
    (optimizer as *const O).cast::<()>() as usize
}

impl GradScaler {
    /// `torch.amp.GradScaler(device)`: a scaler for gradients on `device`, with PyTorch's
    /// defaults ([`GradScalerOptions::default`]: scale 2^16, growth ×2 every 2000 good
    /// steps, backoff ×0.5), enabled on every device, the CPU included, as PyTorch's.
    ///
    /// The one rule for the CPU: enabled unless you say otherwise. bf16 (the CPU's autocast
    /// dtype) has f32's range and needs no loss scaling, so a loop meant for both CUDA (f16)
    /// and the CPU usually asks for `GradScaler::new(device)?.enabled(device.is_cuda())` —
    /// the effect of the older `torch.cuda.amp.GradScaler()`, which disables itself without
    /// CUDA. A disabled scaler passes everything through (`scale` returns the loss, `step`
    /// steps). A `Result`, as its neighbours' constructors.
    ///
    /// ```
    /// use ember_amp::GradScaler;
    /// use ember_tensor::Device;
    /// assert!(GradScaler::new(Device::Cpu)?.is_enabled());
    /// let device = Device::Cpu;
    /// assert!(!GradScaler::new(device)?.enabled(device.is_cuda()).is_enabled());
    /// # Ok::<(), ember_autograd::Error>(())
    /// ```
    pub fn new(device: Device) -> Result<GradScaler> {
        GradScaler::with_options(device, GradScalerOptions::default())
    }

    /// `self`, enabled or not (PyTorch's `enabled=`): a disabled scaler passes everything
    /// through. Set it before the first `scale`.
    pub fn enabled(mut self, enabled: bool) -> GradScaler {
        self.enabled = enabled;
        self
    }

    /// A scaler with `options`; an error names an option out of range (growth factor ≤ 1,
    /// backoff factor outside (0, 1), growth interval ≤ 0, a scale that is not a positive
    /// finite f32).
    pub fn with_options(device: Device, options: GradScalerOptions) -> Result<GradScaler> {
        const OP: &str = "new";
        check_scale(OP, "init_scale", options.init_scale)?;
        check_growth_factor(OP, options.growth_factor)?;
        check_backoff_factor(OP, options.backoff_factor)?;
        check_growth_interval(OP, options.growth_interval)?;
        Ok(GradScaler::build(device, options))
    }

    fn build(device: Device, o: GradScalerOptions) -> GradScaler {
        GradScaler {
            device,
            enabled: o.enabled,
            init_scale: o.init_scale,
            growth_factor: o.growth_factor,
            backoff_factor: o.backoff_factor,
            growth_interval: o.growth_interval,
            init_growth_tracker: 0,
            scale: None,
            growth_tracker: None,
            per_optimizer: HashMap::new(),
        }
    }

    /// The device whose gradients this scaler handles.
    pub fn device(&self) -> Device {
        self.device
    }

    /// Whether the scaler is enabled (a disabled one passes everything through).
    pub fn is_enabled(&self) -> bool {
        self.enabled
    }

    fn check_device(&self, op: &'static str, what: &str, found: Device) -> Result<()> {
        if found == self.device {
            Ok(())
        } else {
            Err(err(
                ErrorKind::DeviceMismatch,
                op,
                format!(
                    "this GradScaler was made for {} but {what} is on {found}; make one GradScaler per device (GradScaler::new({found}))",
                    self.device
                ),
            ))
        }
    }

    /// The scale and tracker, made on first use (PyTorch's `_lazy_init_scale_growth_tracker`).
    fn scale_tensors(&mut self) -> Result<(Raw, Raw)> {
        if let (Some(s), Some(t)) = (&self.scale, &self.growth_tracker) {
            return Ok((s.clone(), t.clone()));
        }
        let s = Raw::scalar(self.init_scale as f32, self.device)?;
        let t = Raw::scalar(self.init_growth_tracker as i32, self.device)?;
        self.scale = Some(s.clone());
        self.growth_tracker = Some(t.clone());
        Ok((s, t))
    }

    fn existing_scale(&self, op: &'static str) -> Result<(Raw, Raw)> {
        match (&self.scale, &self.growth_tracker) {
            (Some(s), Some(t)) => Ok((s.clone(), t.clone())),
            _ => Err(err(
                ErrorKind::InvalidArgument,
                op,
                format!(
                    "Attempted {op} but _scale is None. This may indicate your script did not use scaler.scale(loss or outputs) earlier in the iteration."
                ),
            )),
        }
    }

    /// `loss * scale` (differentiable; `loss` itself when disabled). The first call makes
    /// the scale on the scaler's device; a loss on another device is an error.
    pub fn scale(&mut self, loss: &Tensor) -> Result<Tensor> {
        if !self.enabled {
            return Ok(loss.clone());
        }
        self.check_device("scale", "the loss", loss.device())?;
        let (s, _) = self.scale_tensors()?;
        // The scale is 0-dim: it broadcasts against any loss shape.
        loss.mul(&s)
    }

    /// Divides the gradients of `optimizer`'s parameters by the scale in place and records
    /// whether any was inf or NaN (one fused pass per device; nothing is read back). At most
    /// once per optimizer between two `update`s; `step` calls it when it was not called, so
    /// call it yourself only to look at or clip the true gradients before `step`:
    ///
    /// ```
    /// # use ember_amp::scaler::GradScaler;
    /// # use ember_nn::optim::{clip_grad_norm_, Optimizer, SGD, SgdOptions};
    /// # use ember_nn::Tensor;
    /// # use ember_tensor::Device;
    /// # let w = Tensor::from_vec(vec![3f32, 4.], [2], &Device::Cpu)?.requires_grad_(true)?;
    /// # let mut opt = SGD::new(vec![w.clone()], SgdOptions { lr: 0.1, ..Default::default() })?;
    /// # let mut scaler = GradScaler::new(Device::Cpu)?;
    /// scaler.scale(&w.mul(&w)?.sum_all()?)?.backward()?;
    /// scaler.unscale_(&mut opt)?;                       // the true gradients, 2w
    /// clip_grad_norm_(&[w.clone()], 1.0, 2.0)?;        // clip those
    /// scaler.step(&mut opt)?;
    /// scaler.update()?;
    /// # Ok::<(), ember_autograd::Error>(())
    /// ```
    ///
    /// Errors (nothing changed): a second call before `update` ("unscale_() has already
    /// been called on this optimizer since the last update()"), a call after `step`, a
    /// scaler that never scaled a loss, a gradient on another device than the scaler's, an
    /// f16 gradient (as PyTorch: keep f32 master weights).
    pub fn unscale_<O: Optimizer + ?Sized>(&mut self, optimizer: &mut O) -> Result<()> {
        if !self.enabled {
            return Ok(());
        }
        self.unscale_inner("unscale_", optimizer)
    }

    /// The checks of `unscale_` and the fused unscale; returns the found-inf flags to
    /// record (none when the optimizer has no gradient, PyTorch's empty
    /// `found_inf_per_device`). Changes no state of the scaler.
    fn unscale_grads<O: Optimizer + ?Sized>(
        &self,
        op: &'static str,
        optimizer: &O,
    ) -> Result<Vec<(Device, Raw)>> {
        let (scale, _) = self.existing_scale(op)?;
        match self.per_optimizer.get(&key(optimizer)).map(|s| s.stage) {
            Some(Stage::Unscaled) => {
                return Err(err(
                    ErrorKind::InvalidArgument,
                    op,
                    "unscale_() has already been called on this optimizer since the last update(): call it at most once per optimizer per iteration, between backward and step",
                ));
            }
            Some(Stage::Stepped) => {
                return Err(err(
                    ErrorKind::InvalidArgument,
                    op,
                    "unscale_() is being called after step(): call it before step(), once per iteration",
                ));
            }
            _ => {}
        }
        let mut grads: Vec<Raw> = Vec::new();
        for group in optimizer.param_groups() {
            for p in &group.params {
                let Some(g) = p.grad() else { continue };
                let g = g.data();
                self.check_device(op, "a gradient of this optimizer", g.device())?;
                if g.dtype() == DType::F16 {
                    return Err(err(
                        ErrorKind::DType,
                        op,
                        "Attempting to unscale FP16 gradients: keep the parameters (master weights) in f32 and run the forward under autocast",
                    ));
                }
                grads.push(g);
            }
        }
        if grads.is_empty() {
            return Ok(Vec::new());
        }
        // inv_scale = 1 / scale, in f64 then rounded to f32 (PyTorch's
        // `scale.double().reciprocal().float()`), on the device; `found_inf` filled there
        // too (an upload of a host scalar would make the host wait for the device).
        let inv_scale = scale
            .to_dtype(DType::F64)?
            .reciprocal()?
            .to_dtype(DType::F32)?;
        let found_inf = Raw::zeros(Shape::scalar(), (self.device, DType::F32))?;
        Raw::amp_foreach_non_finite_check_and_unscale_(&grads, &found_inf, &inv_scale)?;
        Ok(vec![(self.device, found_inf)])
    }

    fn unscale_inner<O: Optimizer + ?Sized>(
        &mut self,
        op: &'static str,
        optimizer: &mut O,
    ) -> Result<()> {
        let found_inf_per_device = self.unscale_grads(op, optimizer)?;
        let state = self.per_optimizer.entry(key(optimizer)).or_default();
        state.found_inf_per_device = found_inf_per_device;
        state.stage = Stage::Unscaled;
        Ok(())
    }

    /// Steps `optimizer` unless one of its gradients was inf or NaN, and returns whether it
    /// stepped. Unscales the gradients first if [`unscale_`](GradScaler::unscale_) was not
    /// called this iteration. Disabled: steps and returns `true`.
    ///
    /// Errors (nothing changed): a scaler that never scaled a loss, a second `step` before
    /// `update`, an optimizer whose unscale recorded no inf checks, and `unscale_`'s.
    pub fn step<O: Optimizer + ?Sized>(&mut self, optimizer: &mut O) -> Result<bool> {
        if !self.enabled {
            optimizer.step()?;
            return Ok(true);
        }
        const OP: &str = "step";
        self.existing_scale(OP)?;
        let k = key(optimizer);
        let stage = self.per_optimizer.get(&k).map_or(Stage::Ready, |s| s.stage);
        if stage == Stage::Stepped {
            return Err(err(
                ErrorKind::InvalidArgument,
                OP,
                "step() has already been called since the last update(): call update() once per iteration, after step()",
            ));
        }
        let no_checks = || {
            err(
                ErrorKind::InvalidArgument,
                OP,
                "No inf checks were recorded for this optimizer: it has no gradients; call scaler.scale(loss).backward() before step",
            )
        };
        if stage == Stage::Ready {
            // Checked before anything is recorded, so that the error leaves the scaler as
            // it was.
            let found_inf_per_device = self.unscale_grads(OP, optimizer)?;
            if found_inf_per_device.is_empty() {
                return Err(no_checks());
            }
            let state = self.per_optimizer.entry(k).or_default();
            state.found_inf_per_device = found_inf_per_device;
            state.stage = Stage::Unscaled;
        }
        let mut found = 0.0;
        let flags = self
            .per_optimizer
            .get(&k)
            .map(|s| s.found_inf_per_device.as_slice())
            .unwrap_or_default();
        if flags.is_empty() {
            return Err(no_checks());
        }
        for (_, f) in flags {
            // The one read back of a step (Note [GradScaler state]).
            found += f64::from(f.item::<f32>()?);
        }
        let stepped = found == 0.0;
        if stepped {
            optimizer.step()?;
        }
        if let Some(state) = self.per_optimizer.get_mut(&k) {
            state.stage = Stage::Stepped;
        }
        Ok(stepped)
    }

    /// Updates the scale from this iteration's inf checks (of every optimizer unscaled since
    /// the last update): backoff if any found an inf/NaN, growth after `growth_interval`
    /// clean iterations. Runs on the scaler's device (`_amp_update_scale_`). Resets every
    /// optimizer to READY. Disabled: nothing.
    pub fn update(&mut self) -> Result<()> {
        if !self.enabled {
            return Ok(());
        }
        const OP: &str = "update";
        let (scale, tracker) = self.existing_scale(OP)?;
        let found_infs: Vec<&Raw> = self
            .per_optimizer
            .values()
            .flat_map(|s| s.found_inf_per_device.iter().map(|(_, f)| f))
            .collect();
        let Some((first, rest)) = found_infs.split_first() else {
            return Err(err(
                ErrorKind::InvalidArgument,
                OP,
                "No inf checks were recorded prior to update(): call step(optimizer) (or unscale_) before update()",
            ));
        };
        let combined = first.copy()?;
        for f in rest {
            combined.add_(*f)?;
        }
        scale.amp_update_scale_(
            &tracker,
            &combined,
            self.growth_factor,
            self.backoff_factor,
            self.growth_interval as i32,
        )?;
        self.per_optimizer.clear();
        Ok(())
    }

    /// Sets the scale to `new_scale` (PyTorch's `update(new_scale)`), leaving the growth
    /// tracker as it is, and resets every optimizer to READY. Disabled: nothing.
    pub fn update_with(&mut self, new_scale: f64) -> Result<()> {
        if !self.enabled {
            return Ok(());
        }
        const OP: &str = "update";
        let (scale, _) = self.existing_scale(OP)?;
        check_scale(OP, "new_scale", new_scale)?;
        scale.fill_(new_scale as f32)?;
        self.per_optimizer.clear();
        Ok(())
    }

    /// The current scale (a read back from the device): `init_scale` before the first
    /// `scale`, 1.0 when disabled.
    pub fn get_scale(&self) -> Result<f64> {
        if !self.enabled {
            return Ok(1.0);
        }
        match &self.scale {
            None => Ok(self.init_scale),
            Some(s) => Ok(f64::from(s.item::<f32>()?)),
        }
    }

    /// The count of clean iterations since the last growth or backoff (0 when disabled).
    pub fn get_growth_tracker(&self) -> Result<i64> {
        if !self.enabled {
            return Ok(0);
        }
        match &self.growth_tracker {
            None => Ok(self.init_growth_tracker),
            Some(t) => Ok(i64::from(t.item::<i32>()?)),
        }
    }

    /// The growth factor.
    pub fn get_growth_factor(&self) -> f64 {
        self.growth_factor
    }

    /// Sets the growth factor (> 1).
    pub fn set_growth_factor(&mut self, new_factor: f64) -> Result<()> {
        check_growth_factor("set_growth_factor", new_factor)?;
        self.growth_factor = new_factor;
        Ok(())
    }

    /// The backoff factor.
    pub fn get_backoff_factor(&self) -> f64 {
        self.backoff_factor
    }

    /// Sets the backoff factor (in (0, 1)).
    pub fn set_backoff_factor(&mut self, new_factor: f64) -> Result<()> {
        check_backoff_factor("set_backoff_factor", new_factor)?;
        self.backoff_factor = new_factor;
        Ok(())
    }

    /// The growth interval.
    pub fn get_growth_interval(&self) -> i64 {
        self.growth_interval
    }

    /// Sets the growth interval (> 0).
    pub fn set_growth_interval(&mut self, new_interval: i64) -> Result<()> {
        check_growth_interval("set_growth_interval", new_interval)?;
        self.growth_interval = new_interval;
        Ok(())
    }

    /// The state with PyTorch's keys ([`STATE_KEYS`]), as plain values of a [`StateDict`]
    /// (`scale`, `growth_factor`, `backoff_factor` floats; `growth_interval`,
    /// `_growth_tracker` integers), the type every `state_dict()` in Ember returns; empty
    /// when disabled, as PyTorch's.
    pub fn state_dict(&self) -> Result<StateDict> {
        if !self.enabled {
            return Ok(StateDict::new());
        }
        Ok(StateDict::new()
            .with("scale", self.get_scale()?)
            .with("growth_factor", self.growth_factor)
            .with("backoff_factor", self.backoff_factor)
            .with("growth_interval", self.growth_interval)
            .with("_growth_tracker", self.get_growth_tracker()?))
    }

    /// Loads a [`state_dict`](GradScaler::state_dict) (its values plain, or 0-dim tensors).
    /// Every key must be there with a valid value, and no other key (nothing is changed
    /// otherwise). Disabled: nothing.
    pub fn load_state_dict(&mut self, state: &StateDict) -> Result<()> {
        if !self.enabled {
            return Ok(());
        }
        const OP: &str = "load_state_dict";
        if state.is_empty() {
            return Err(err(
                ErrorKind::StateDict,
                OP,
                "The source state dict is empty, possibly because it was saved from a disabled instance of GradScaler.",
            ));
        }
        let mut keys = state.keys().chain(state.plain().map(|(k, _)| k));
        if let Some(k) = keys.find(|k| !STATE_KEYS.contains(&k.as_str())) {
            return Err(err(
                ErrorKind::StateDict,
                OP,
                format!("unexpected key {k:?}; a GradScaler state has the keys {STATE_KEYS:?}"),
            ));
        }
        let get = |k: &str| -> Result<Value> {
            if !state.contains_key(k) {
                return Err(err(
                    ErrorKind::StateDict,
                    OP,
                    format!("missing key {k:?}; a GradScaler state has the keys {STATE_KEYS:?}"),
                ));
            }
            state
                .item::<Value>(k)
                .map_err(|e| err(ErrorKind::StateDict, OP, e.to_string()))
        };
        let float = |k: &str| -> Result<f64> {
            match get(k)? {
                Value::Float(v) => Ok(v),
                Value::Int(v) => Ok(v as f64),
                other => Err(err(
                    ErrorKind::StateDict,
                    OP,
                    format!("{k:?} must be a number, but is {other}"),
                )),
            }
        };
        let int = |k: &str| -> Result<i64> {
            match get(k)? {
                Value::Int(v) => i64::try_from(v).map_err(|_| {
                    err(
                        ErrorKind::StateDict,
                        OP,
                        format!("{k:?} is out of range: {v}"),
                    )
                }),
                other => Err(err(
                    ErrorKind::StateDict,
                    OP,
                    format!("{k:?} must be an integer, but is {other}"),
                )),
            }
        };
        let as_state = |e: Error| {
            err(
                ErrorKind::StateDict,
                OP,
                e.downcast::<ScalerError>()
                    .map_or_else(|e| e.to_string(), |s| s.msg),
            )
        };
        let scale = float("scale")?;
        check_scale(OP, "scale", scale).map_err(as_state)?;
        let growth_factor = float("growth_factor")?;
        check_growth_factor(OP, growth_factor).map_err(as_state)?;
        let backoff_factor = float("backoff_factor")?;
        check_backoff_factor(OP, backoff_factor).map_err(as_state)?;
        let growth_interval = int("growth_interval")?;
        check_growth_interval(OP, growth_interval).map_err(as_state)?;
        let tracker = int("_growth_tracker")?;
        if !(0..growth_interval).contains(&tracker) {
            return Err(err(
                ErrorKind::StateDict,
                OP,
                format!(
                    "\"_growth_tracker\" must be in [0, growth_interval = {growth_interval}), but is {tracker}"
                ),
            ));
        }
        if let (Some(s), Some(t)) = (&self.scale, &self.growth_tracker) {
            s.fill_(scale as f32)?;
            t.fill_(tracker as i32)?;
        }
        self.init_scale = scale;
        self.growth_factor = growth_factor;
        self.backoff_factor = backoff_factor;
        self.growth_interval = growth_interval;
        self.init_growth_tracker = tracker;
        Ok(())
    }
}
