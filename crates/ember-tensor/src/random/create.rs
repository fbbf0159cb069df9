//! Random tensor constructors: the fronts (dtype rules, bounds, device and generator
//! checks) and the per-device fill (See Note [Dispatch], Note [Random streams]).

use std::sync::Arc;

use ember_device::Device;
use half::{bf16, f16};

use super::philox::{
    Bernoulli, Normal32, Normal64, RandInt, RandInt32, RandInt64, Sampler, Uniform32, Uniform64,
    counters, samples,
};
use super::{Generator, default_generator};
use crate::cuda::PhiloxKernel;
use crate::dtype::{DType, WithDType};
use crate::error::{Result, TensorError};
use crate::raw::{Options, RawTensor};
use crate::shape::Shape;
use crate::storage::{CpuStorage, Storage};

/// The generator an op uses: the one given, or the device's default.
enum Gen<'a> {
    Given(&'a Generator),
    Default(Arc<Generator>),
}

impl Gen<'_> {
    fn get(&self) -> &Generator {
        match self {
            Gen::Given(g) => g,
            Gen::Default(g) => g,
        }
    }
}

/// Checks the device and the generator, and counts the elements.
fn prepare<'a>(
    op: &'static str,
    shape: &Shape,
    device: Device,
    gen_: Option<&'a Generator>,
) -> Result<(usize, Gen<'a>)> {
    if let Some(g) = gen_
        && g.device() != device
    {
        return Err(TensorError::invalid(
            op,
            format!(
                "expected a generator for device {device}, but found one for {}",
                g.device()
            ),
        ));
    }
    if let Device::Cuda(i) = device {
        crate::cuda::ctx(op, i)?;
    }
    let n = shape.checked_numel(op)?;
    let g = match gen_ {
        Some(g) => Gen::Given(g),
        None => Gen::Default(default_generator(device)),
    };
    Ok((n, g))
}

/// Reserves the counters of `n` samples of `s` on `g` and fills a new tensor on the
/// generator's device with `conv` of each sample.
/// On a CUDA device the `philox_*` kernel described by `kernel` draws the same numbers on
/// the device (kernels/random.cu, Note [Random streams]).
fn fill<S: Sampler, T: WithDType>(
    s: S,
    n: usize,
    shape: Shape,
    g: &Generator,
    conv: impl Fn(S::Out) -> T + Sync,
    kernel: PhiloxKernel,
) -> Result<RawTensor> {
    let (key, base) = g.reserve(counters::<S>(n));
    let st = Storage::philox(g.device(), (kernel, T::DTYPE), n, (key, base), || {
        CpuStorage::from_chunks(n, |r| samples(&s, key, base, r).map(&conv))
    })?;
    Ok(RawTensor::from_storage(st, shape))
}

/// f64 samples into f16 through f32, as the CUDA kernels convert (and the same on every
/// CPU: `half`'s direct `from_f64` rounds differently with and without F16C).
fn to_f16(v: f64) -> f16 {
    f16::from_f32(v as f32)
}

fn uniform(shape: Shape, o: Options, gen_: Option<&Generator>) -> Result<RawTensor> {
    let op = "rand";
    let dtype = o.dtype.unwrap_or(DType::F32);
    let (n, g) = prepare(op, &shape, o.device, gen_)?;
    let g = g.get();
    let u = |bits| Uniform32 {
        bits,
        low: 0.0,
        high: 1.0,
    };
    let k = PhiloxKernel::Uniform {
        low: 0.0,
        high: 1.0,
    };
    match dtype {
        DType::F32 => fill(u(24), n, shape, g, |v| v as f32, k),
        DType::F16 => fill(u(11), n, shape, g, to_f16, k),
        DType::Bf16 => fill(u(8), n, shape, g, bf16::from_f64, k),
        DType::F64 => fill(
            Uniform64 {
                low: 0.0,
                high: 1.0,
            },
            n,
            shape,
            g,
            |v| v,
            k,
        ),
        d => Err(not_float(op, d)),
    }
}

fn normal(shape: Shape, o: Options, gen_: Option<&Generator>) -> Result<RawTensor> {
    let op = "randn";
    let dtype = o.dtype.unwrap_or(DType::F32);
    let (n, g) = prepare(op, &shape, o.device, gen_)?;
    let g = g.get();
    let s = Normal32 {
        mean: 0.0,
        std: 1.0,
    };
    let k = PhiloxKernel::Normal {
        mean: 0.0,
        std: 1.0,
    };
    match dtype {
        DType::F32 => fill(s, n, shape, g, |v| v as f32, k),
        DType::F16 => fill(s, n, shape, g, to_f16, k),
        DType::Bf16 => fill(s, n, shape, g, bf16::from_f64, k),
        DType::F64 => fill(
            Normal64 {
                mean: 0.0,
                std: 1.0,
            },
            n,
            shape,
            g,
            |v| v,
            k,
        ),
        d => Err(not_float(op, d)),
    }
}

fn not_float(op: &'static str, dtype: DType) -> TensorError {
    TensorError::UnsupportedDType {
        op,
        dtype,
        hint: "expected a floating-point dtype; use randint for integers",
    }
}

/// The integers `[lo, hi]` that `dtype` holds exactly (PyTorch's bounds for `random_`).
fn int_bounds(dtype: DType) -> (i64, i64) {
    match dtype {
        DType::Bool => (0, 1),
        DType::U8 => (0, 255),
        DType::I32 => (i32::MIN.into(), i32::MAX.into()),
        DType::I64 => (i64::MIN, i64::MAX),
        DType::F16 => (-(1 << 11), 1 << 11),
        DType::Bf16 => (-(1 << 8), 1 << 8),
        DType::F32 => (-(1 << 24), 1 << 24),
        DType::F64 => (-(1 << 53), 1 << 53),
    }
}

fn integers(
    low: i64,
    high: i64,
    shape: Shape,
    o: Options,
    gen_: Option<&Generator>,
) -> Result<RawTensor> {
    let op = "randint";
    let dtype = o.dtype.unwrap_or(DType::I64);
    if low >= high {
        return Err(TensorError::invalid(
            op,
            format!("expected low < high, but got low={low} >= high={high}"),
        ));
    }
    let (lo, hi) = int_bounds(dtype);
    if low < lo || high - 1 > hi {
        return Err(TensorError::invalid(
            op,
            format!(
                "expected low and high - 1 within [{lo}, {hi}] for {dtype}, but got low={low}, high={high}"
            ),
        ));
    }
    let (n, g) = prepare(op, &shape, o.device, gen_)?;
    let g = g.get();
    let r = RandInt {
        low,
        // `high > low`, so the difference is in 1..=u64::MAX.
        range: high.abs_diff(low),
    };
    let k = PhiloxKernel::RandInt {
        low,
        range: r.range,
    };
    let t = crate::cpu::dispatch!(dtype, T => {
        if r.range <= 1 << 32 {
            fill(RandInt32(r), n, shape, g, T::from_i64, k)
        } else {
            fill(RandInt64(r), n, shape, g, T::from_i64, k)
        }
    })?;
    // Fresh and unshared: the kernels that take it as indices need not read it back to
    // check it (Note [Known index ranges]).
    t.cell().set_known_range(low, high - 1);
    Ok(t)
}

fn bernoulli(
    op: &'static str,
    shape: Shape,
    p: f64,
    o: Options,
    gen_: Option<&Generator>,
) -> Result<RawTensor> {
    let dtype = o.dtype.unwrap_or(DType::Bool);
    let (n, g) = prepare(op, &shape, o.device, gen_)?;
    let k = PhiloxKernel::Bernoulli { p };
    crate::cpu::dispatch!(dtype, T => fill(Bernoulli { p }, n, shape, g.get(), |b| T::from_i64(i64::from(b)), k))
}

fn check_p(op: &'static str, p: f64, what: &str) -> Result<()> {
    if (0.0..=1.0).contains(&p) {
        Ok(())
    } else {
        Err(TensorError::invalid(
            op,
            format!("{what} probability has to be between 0 and 1, but got {p}"),
        ))
    }
}

impl RawTensor {
    /// Uniform samples in `[0, 1)` (f32 unless told; f64, f16, bf16 too; integer dtypes are
    /// an error, as in PyTorch) from the device's default generator.
    ///
    /// ```
    /// use ember_tensor::{DType, Tensor};
    /// let t = Tensor::rand([2, 3], DType::F64)?;
    /// assert!(t.to_vec::<f64>()?.iter().all(|x| (0.0..1.0).contains(x)));
    /// assert!(Tensor::rand([2], DType::I64).is_err());
    /// # Ok::<(), ember_tensor::Error>(())
    /// ```
    pub fn rand(shape: impl Into<Shape>, opts: impl Into<Options>) -> Result<RawTensor> {
        uniform(shape.into(), opts.into(), None)
    }

    /// [`Tensor::rand`] from `generator`, which must be for the tensor's device.
    pub fn rand_with(
        shape: impl Into<Shape>,
        opts: impl Into<Options>,
        generator: &Generator,
    ) -> Result<RawTensor> {
        uniform(shape.into(), opts.into(), Some(generator))
    }

    /// Standard normal samples (f32 unless told; f64, f16, bf16 too) from the device's
    /// default generator.
    pub fn randn(shape: impl Into<Shape>, opts: impl Into<Options>) -> Result<RawTensor> {
        normal(shape.into(), opts.into(), None)
    }

    /// [`Tensor::randn`] from `generator`.
    pub fn randn_with(
        shape: impl Into<Shape>,
        opts: impl Into<Options>,
        generator: &Generator,
    ) -> Result<RawTensor> {
        normal(shape.into(), opts.into(), Some(generator))
    }

    /// Integers uniform in `[low, high)` (i64 unless told; any dtype that holds both
    /// bounds exactly, as in PyTorch), from the device's default generator.
    ///
    /// ```
    /// use ember_tensor::{DType, Tensor};
    /// let t = Tensor::randint(-2, 3, [100], ())?;
    /// assert_eq!(t.dtype(), DType::I64);
    /// assert!(t.to_vec::<i64>()?.iter().all(|x| (-2..3).contains(x)));
    /// assert!(Tensor::randint(0, 300, [1], DType::U8).is_err());
    /// # Ok::<(), ember_tensor::Error>(())
    /// ```
    pub fn randint(
        low: i64,
        high: i64,
        shape: impl Into<Shape>,
        opts: impl Into<Options>,
    ) -> Result<RawTensor> {
        integers(low, high, shape.into(), opts.into(), None)
    }

    /// [`Tensor::randint`] from `generator`.
    pub fn randint_with(
        low: i64,
        high: i64,
        shape: impl Into<Shape>,
        opts: impl Into<Options>,
        generator: &Generator,
    ) -> Result<RawTensor> {
        integers(low, high, shape.into(), opts.into(), Some(generator))
    }

    /// [`Tensor::rand`] with this tensor's shape, dtype and device.
    pub fn rand_like(&self) -> Result<RawTensor> {
        RawTensor::rand(self.shape(), (self.device(), self.dtype()))
    }

    /// [`Tensor::randn`] with this tensor's shape, dtype and device.
    pub fn randn_like(&self) -> Result<RawTensor> {
        RawTensor::randn(self.shape(), (self.device(), self.dtype()))
    }

    /// [`Tensor::rand_like`] from `generator`.
    pub fn rand_like_with(&self, generator: &Generator) -> Result<RawTensor> {
        RawTensor::rand_with(self.shape(), (self.device(), self.dtype()), generator)
    }

    /// [`Tensor::randn_like`] from `generator`.
    pub fn randn_like_with(&self, generator: &Generator) -> Result<RawTensor> {
        RawTensor::randn_with(self.shape(), (self.device(), self.dtype()), generator)
    }

    /// Independent Bernoulli(`p`) samples: 1 (true) with probability `p` (bool unless told;
    /// any dtype holds 0/1). `p` must be in `[0, 1]`.
    pub fn bernoulli_mask(
        shape: impl Into<Shape>,
        p: f64,
        opts: impl Into<Options>,
    ) -> Result<RawTensor> {
        check_p("bernoulli", p, "bernoulli")?;
        bernoulli("bernoulli", shape.into(), p, opts.into(), None)
    }

    /// [`Tensor::bernoulli_mask`] from `generator`.
    pub fn bernoulli_mask_with(
        shape: impl Into<Shape>,
        p: f64,
        opts: impl Into<Options>,
        generator: &Generator,
    ) -> Result<RawTensor> {
        check_p("bernoulli", p, "bernoulli")?;
        bernoulli("bernoulli", shape.into(), p, opts.into(), Some(generator))
    }

    /// The keep-mask of dropout with drop probability `p`: true (kept) with probability
    /// `1 - p` (bool unless told). The same seed gives the same mask.
    ///
    /// ```
    /// use ember_tensor::{random, Tensor};
    /// random::manual_seed(0);
    /// let m = Tensor::dropout_mask([1000], 0.25, ())?;
    /// let kept = m.to_vec::<bool>()?.iter().filter(|&&k| k).count();
    /// assert!((650..850).contains(&kept));
    /// # Ok::<(), ember_tensor::Error>(())
    /// ```
    pub fn dropout_mask(
        shape: impl Into<Shape>,
        p: f64,
        opts: impl Into<Options>,
    ) -> Result<RawTensor> {
        check_p("dropout", p, "dropout")?;
        bernoulli("dropout", shape.into(), 1.0 - p, opts.into(), None)
    }

    /// [`Tensor::dropout_mask`] from `generator`.
    pub fn dropout_mask_with(
        shape: impl Into<Shape>,
        p: f64,
        opts: impl Into<Options>,
        generator: &Generator,
    ) -> Result<RawTensor> {
        check_p("dropout", p, "dropout")?;
        bernoulli(
            "dropout",
            shape.into(),
            1.0 - p,
            opts.into(),
            Some(generator),
        )
    }
}
