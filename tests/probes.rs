//! The probe suite: bad input through the public API, on `cpu` and the emulated `cuda:0`,
//! each case an error value of the expected [`ErrorKind`], never a panic, an abort or a
//! silently accepted call (issue 26).
//!
//! Note [Probe tables]: the cases are generated from tables, one row per case or per op:
//! [`BINARY`] (every binary op × [`BAD_SHAPE_PAIRS`], and × a second device), [`DIM_OPS`]
//! (every op taking a dim × [`BAD_DIMS`]), and [`CASES`] (one closure each: indices, dtypes,
//! devices, hooks and grads, module moves, allocation sizes, environment variables). Each row
//! says what PyTorch does. A new op joins by adding a row. Every case runs inside
//! `catch_unwind`, so a panic is reported as that case's failure, and all failures of a run
//! are listed together.
#![allow(clippy::unwrap_used)]

use std::panic::{AssertUnwindSafe, catch_unwind};

use ember::nn::{Linear, Module};
use ember::{DType, Device, ErrorKind, Result, Tensor, cuda};

/// One probe: `run` calls the public API with bad input on a device and must fail.
struct Case {
    name: &'static str,
    kind: ErrorKind,
    /// What PyTorch does with the same input.
    torch: &'static str,
    run: fn(&Device) -> Result<()>,
}

type Bin = fn(&Tensor, &Tensor) -> Result<Tensor>;

/// Binary ops with broadcasting: (name, the kind of a shape mismatch, op). Each meets every pair of [`BAD_SHAPE_PAIRS`]
/// (PyTorch: "The size of tensor a (3) must match the size of tensor b (4) at non-singleton
/// dimension 1") and a second operand on another device (PyTorch: "Expected all tensors to
/// be on the same device, but found at least two devices").
const BINARY: &[(&str, ErrorKind, Bin)] = &[
    ("add", ErrorKind::Shape, |a, b| a.add(b)),
    ("sub", ErrorKind::Shape, |a, b| a.sub(b)),
    ("mul", ErrorKind::Shape, |a, b| a.mul(b)),
    ("div", ErrorKind::Shape, |a, b| a.div(b)),
    ("pow", ErrorKind::Shape, |a, b| a.pow(b)),
    ("maximum", ErrorKind::Shape, |a, b| a.maximum(b)),
    ("minimum", ErrorKind::Shape, |a, b| a.minimum(b)),
    ("eq", ErrorKind::Shape, |a, b| a.eq(b)),
    ("lt", ErrorKind::Shape, |a, b| a.lt(b)),
    ("where", ErrorKind::Shape, |a, b| {
        ember::r#where(&a.gt(0.0)?, a, b)
    }),
    // PyTorch: "Using a target size that is different to the input size" (a warning where
    // the shapes broadcast; an error here and where they do not).
    ("mse_loss", ErrorKind::InvalidArgument, |a, b| {
        ember::nn::functional::mse_loss(a, b, ember::Reduction::Mean)
    }),
];

/// Shapes that do not broadcast.
const BAD_SHAPE_PAIRS: &[(&[usize], &[usize])] = &[
    (&[2, 3], &[4]),
    (&[2, 3], &[3, 2]),
    (&[5], &[4]),
    (&[2, 1, 3], &[4, 2]),
];

type DimOp = fn(&Tensor, isize) -> Result<Tensor>;

/// Ops taking a dim, on a `[2, 3, 4]` tensor; each meets every dim of [`BAD_DIMS`]
/// (PyTorch: IndexError "Dimension out of range (expected to be in range of [-3, 2], but
/// got 3)").
const DIM_OPS: &[(&str, DimOp)] = &[
    ("sum", |t, d| t.sum(d)),
    ("mean", |t, d| t.mean(d)),
    ("softmax", |t, d| t.softmax(d)),
    ("log_softmax", |t, d| t.log_softmax(d)),
    ("argmax", |t, d| t.argmax(d)),
    ("max_dim", |t, d| t.max_dim(d).map(|(v, _)| v)),
    ("transpose", |t, d| t.transpose(0, d)),
    ("narrow", |t, d| t.narrow(d, 0, 1)),
    ("select", |t, d| t.select(d, 0)),
    ("squeeze_dim", |t, d| t.squeeze_dim(d)),
    ("cat", |t, d| Tensor::cat(&[t, t], d)),
    ("index_select", |t, d| {
        t.index_select(d, &Tensor::zeros([1], (t.device(), DType::I64))?)
    }),
    ("flatten", |t, d| t.flatten(0, d)),
    ("split", |t, d| t.split(1, d).map(|mut v| v.remove(0))),
];

const BAD_DIMS: &[isize] = &[3, -4, 100, isize::MIN];

fn t23(d: &Device) -> Result<Tensor> {
    Tensor::from_vec(vec![1f32, 2., 3., 4., 5., 6.], [2, 3], d)
}

fn leaf(d: &Device) -> Result<Tensor> {
    Tensor::from_vec(vec![1f64, 2., 3.], [3], d)?.requires_grad_(true)
}

/// Another device than `d`: `cuda:0` for the CPU, the CPU otherwise.
fn other(d: &Device) -> Device {
    if d.is_cpu() {
        Device::Cuda(0)
    } else {
        Device::Cpu
    }
}

/// A broadcast view of `n` f32 ones: costs one element, materialises to `4n` bytes.
fn huge(d: &Device, n: usize) -> Result<Tensor> {
    Tensor::ones([1], (d, DType::F32))?.expand([n])
}

/// 2^46 elements: 256 TiB as f32, beyond any host's address space.
const HUGE: usize = 1 << 46;

fn env(count: Option<&str>, memory: Option<&str>) -> Result<()> {
    ember::driver::emulator::EmulatorConfig::from_env_values(count, memory)?;
    Ok(())
}

macro_rules! case {
    ($name:expr, $kind:ident, $torch:expr, $run:expr) => {
        Case {
            name: $name,
            kind: ErrorKind::$kind,
            torch: $torch,
            run: $run,
        }
    };
}

/// One-off probes, by area.
const CASES: &[Case] = &[
    // --- shapes ----------------------------------------------------------------------------
    case!(
        "matmul [2,3]x[2,3]",
        Shape,
        "mat1 and mat2 shapes cannot be multiplied",
        |d| { t23(d)?.matmul(&t23(d)?).map(drop) }
    ),
    case!(
        "matmul of a 0-dim",
        InvalidArgument,
        "both arguments to matmul need to be at least 1D",
        |d| { Tensor::scalar(1f32, d)?.matmul(&t23(d)?).map(drop) }
    ),
    case!(
        "reshape [2,3] to [4]",
        Shape,
        "shape '[4]' is invalid for input of size 6",
        |d| { t23(d)?.reshape([4]).map(drop) }
    ),
    case!(
        "view of a transposed tensor",
        Shape,
        "view size is not compatible with input tensor's size and stride",
        |d| { t23(d)?.t()?.view([6]).map(drop) }
    ),
    case!(
        "expand [2,3] to [4,3]",
        Shape,
        "The expanded size of the tensor (4) must match the existing size (2)",
        |d| { t23(d)?.expand([4, 3]).map(drop) }
    ),
    case!(
        "cat of different ranks",
        Shape,
        "Tensors must have same number of dimensions",
        |d| { Tensor::cat(&[&t23(d)?, &Tensor::zeros([3], d)?], 0).map(drop) }
    ),
    case!(
        "backward of a non-scalar",
        Autograd,
        "grad can be implicitly created only for scalar outputs",
        |d| { leaf(d)?.mul(2.0)?.backward() }
    ),
    case!(
        "backward_with a gradient of another shape",
        InvalidArgument,
        "Mismatch in shape: grad_output[0] has a shape of torch.Size([2])",
        |d| {
            leaf(d)?
                .mul(2.0)?
                .backward_with(&Tensor::ones([2], (d, DType::F64))?)
        }
    ),
    // --- indices ---------------------------------------------------------------------------
    case!(
        "select index 3 of size 2",
        Index,
        "index 3 is out of bounds for dimension 0 with size 2",
        |d| { t23(d)?.select(0, 3).map(drop) }
    ),
    case!(
        "narrow past the end",
        InvalidArgument,
        "start (2) + length (2) exceeds dimension size (3)",
        |d| { t23(d)?.narrow(1, 2, 2).map(drop) }
    ),
    case!(
        "index_select index 5 of size 3",
        Index,
        "index out of range in self",
        |d| {
            t23(d)?
                .index_select(1, &Tensor::from_vec(vec![0i64, 5], [2], d)?)
                .map(drop)
        }
    ),
    case!(
        "index_select index -1",
        Index,
        "index out of range in self",
        |d| {
            t23(d)?
                .index_select(1, &Tensor::from_vec(vec![-1i64], [1], d)?)
                .map(drop)
        }
    ),
    case!(
        "gather index 3 of size 3",
        Index,
        "index 3 is out of bounds for dimension 1 with size 3",
        |d| {
            t23(d)?
                .gather(1, &Tensor::from_vec(vec![0i64, 3], [2, 1], d)?)
                .map(drop)
        }
    ),
    case!(
        "embedding index 10 of 4 rows",
        Index,
        "index out of range in self",
        |d| {
            Tensor::zeros([4, 2], d)?
                .embedding(&Tensor::from_vec(vec![10i64], [1], d)?)
                .map(drop)
        }
    ),
    case!(
        "one_hot class 5 of 3",
        InvalidArgument,
        "Class values must be smaller than num_classes",
        |d| {
            Tensor::from_vec(vec![5i64], [1], d)?
                .one_hot(Some(3))
                .map(drop)
        }
    ),
    // --- dtypes ----------------------------------------------------------------------------
    case!(
        "matmul f32 x f64",
        InvalidArgument,
        "expected m1 and m2 to have the same dtype",
        |d| {
            t23(d)?
                .matmul(&Tensor::zeros([3, 2], (d, DType::F64))?)
                .map(drop)
        }
    ),
    case!(
        "matmul bool",
        DType,
        "\"addmm\" not implemented for 'Bool'",
        |d| {
            Tensor::zeros([2, 2], (d, DType::Bool))?
                .matmul(&Tensor::zeros([2, 2], (d, DType::Bool))?)
                .map(drop)
        }
    ),
    case!(
        "requires_grad on i64",
        InvalidArgument,
        "only Tensors of floating point dtype can require gradients",
        |d| {
            Tensor::zeros([2], (d, DType::I64))?
                .requires_grad_(true)
                .map(drop)
        }
    ),
    case!(
        "index_select with float indices",
        DType,
        "index_select(): Expected dtype int32/int64 for index",
        |d| { t23(d)?.index_select(0, &Tensor::zeros([1], d)?).map(drop) }
    ),
    case!(
        "i64 ** -1",
        InvalidArgument,
        "Integers to negative integer powers are not allowed.",
        |d| { Tensor::ones([2], (d, DType::I64))?.pow(-1).map(drop) }
    ),
    case!(
        "u8 ** -2",
        InvalidArgument,
        "Integers to negative integer powers are not allowed.",
        |d| { Tensor::ones([2], (d, DType::U8))?.pow(-2).map(drop) }
    ),
    case!(
        "full 1e30 as i32",
        InvalidArgument,
        "value cannot be converted to type int32_t without overflow",
        |d| { Tensor::full([2], 1e30, (d, DType::I32)).map(drop) }
    ),
    case!(
        "full 300 as u8",
        InvalidArgument,
        "value cannot be converted to type uint8_t without overflow",
        |d| { Tensor::full([2], 300, (d, DType::U8)).map(drop) }
    ),
    case!(
        "full NaN as i64",
        InvalidArgument,
        "value cannot be converted to type int64_t without overflow",
        |d| { Tensor::full([2], f64::NAN, (d, DType::I64)).map(drop) }
    ),
    case!(
        "full 1e5 as f16",
        InvalidArgument,
        "value cannot be converted to type at::Half without overflow",
        |d| { Tensor::full([2], 1e5, (d, DType::F16)).map(drop) }
    ),
    case!(
        "scalar 300 as u8",
        InvalidArgument,
        "value cannot be converted to type uint8_t without overflow",
        |d| { Tensor::scalar(300i64, (d, DType::U8)).map(drop) }
    ),
    case!(
        "fill_ -inf into i32",
        InvalidArgument,
        "value cannot be converted to type int32_t without overflow",
        |d| {
            Tensor::zeros([2], (d, DType::I32))?
                .fill_(f64::NEG_INFINITY)
                .map(drop)
        }
    ),
    // A target of the input's shape holds class probabilities (accepted); a floating target
    // of another shape is neither probabilities nor class indices.
    case!(
        "cross_entropy with a float target of another shape",
        InvalidArgument,
        "Expected target size [2], got [3] (read as class indices)",
        |d| {
            t23(d)?
                .cross_entropy(
                    &Tensor::zeros([3], d)?,
                    &ember::autograd::CrossEntropyOptions::new(),
                )
                .map(drop)
        }
    ),
    case!(
        "cross_entropy with class probabilities of another shape",
        InvalidArgument,
        "0D or 1D target tensor expected, multi-target not supported (read as class indices)",
        |d| {
            t23(d)?
                .cross_entropy(
                    &Tensor::full([3, 2], 0.5, d)?,
                    &ember::autograd::CrossEntropyOptions::new(),
                )
                .map(drop)
        }
    ),
    case!(
        "cross_entropy with integer class probabilities",
        InvalidArgument,
        "Expected floating point type for target with class probabilities, got Long",
        |d| {
            t23(d)?
                .cross_entropy(
                    &Tensor::zeros([2, 3], (d, DType::I64))?,
                    &ember::autograd::CrossEntropyOptions::new(),
                )
                .map(drop)
        }
    ),
    case!(
        "cross_entropy with class probabilities and ignore_index 0",
        InvalidArgument,
        "ignore_index is not supported for floating point target",
        |d| {
            t23(d)?
                .cross_entropy(
                    &Tensor::full([2, 3], 0.5, d)?,
                    &ember::autograd::CrossEntropyOptions::new().ignore_index(0),
                )
                .map(drop)
        }
    ),
    // --- devices ---------------------------------------------------------------------------
    case!(
        "to cuda:5 of 2",
        Device,
        "CUDA error: invalid device ordinal",
        |d| { t23(d)?.to("cuda:5").map(drop) }
    ),
    case!(
        "to tpu",
        Device,
        "Expected one of cpu, cuda, ... device type at start of device string: tpu",
        |d| { t23(d)?.to("tpu").map(drop) }
    ),
    case!(
        "zeros on cuda:7",
        Device,
        "CUDA error: invalid device ordinal",
        |_| { Tensor::zeros([2], Device::Cuda(7)).map(drop) }
    ),
    case!(
        "parse cuda:-1",
        Device,
        "Device index must not be negative",
        |_| {
            "cuda:-1".parse::<Device>()?;
            Ok(())
        }
    ),
    case!(
        "set_device(9) of 2",
        Device,
        "CUDA error: invalid device ordinal",
        |_| {
            cuda::set_device(9)?;
            Ok(())
        }
    ),
    case!(
        "matmul across devices",
        DeviceMismatch,
        "Expected all tensors to be on the same device",
        |d| { t23(d)?.matmul(&Tensor::zeros([3, 2], other(d))?).map(drop) }
    ),
    // --- hooks and grads -------------------------------------------------------------------
    case!(
        "hook changing the size",
        InvalidArgument,
        "hook 'hook' has changed the size of value",
        |d| {
            let x = leaf(d)?;
            let dd = *d;
            x.register_hook(move |_| Tensor::zeros([5], (dd, DType::F64)).ok())?;
            x.sum_all()?.backward()
        }
    ),
    case!(
        "hook changing the dtype",
        InvalidArgument,
        "hook 'hook' has changed the type of value",
        |d| {
            let x = leaf(d)?;
            let y = x.mul(2.0)?;
            y.register_hook(|g| g.to(DType::F32).ok())?;
            y.sum_all()?.backward()
        }
    ),
    case!(
        "set_grad of another dtype",
        InvalidArgument,
        "assigned grad has data of a different type",
        |d| { leaf(d)?.set_grad(Some(&Tensor::zeros([3], (d, DType::F32))?)) }
    ),
    case!(
        "set_grad of another shape",
        InvalidArgument,
        "assigned grad has data of a different size",
        |d| { leaf(d)?.set_grad(Some(&Tensor::zeros([4], (d, DType::F64))?)) }
    ),
    case!(
        "set_grad on another device",
        InvalidArgument,
        "assigned grad has data located on a different device",
        |d| { leaf(d)?.set_grad(Some(&Tensor::zeros([3], (other(d), DType::F64))?)) }
    ),
    case!(
        "second backward through saved tensors",
        Autograd,
        "Trying to backward through the graph a second time ... Specify retain_graph=True",
        |d| {
            let x = leaf(d)?;
            let y = x.mul(&x)?.sum_all()?;
            y.backward()?;
            y.backward()
        }
    ),
    case!(
        "backward of a tensor without grad",
        Autograd,
        "element 0 of tensors does not require grad and does not have a grad_fn",
        |d| { t23(d)?.sum_all()?.backward() }
    ),
    case!(
        "in-place on a leaf that requires grad",
        Autograd,
        "a leaf Variable that requires grad is being used in an in-place operation.",
        |d| { leaf(d)?.mul_(2.0).map(drop) }
    ),
    case!(
        "in-place on a view of such a leaf",
        Autograd,
        "a view of a leaf Variable that requires grad is being used in an in-place operation.",
        |d| { leaf(d)?.narrow(0, 0, 2)?.add_(1.0).map(drop) }
    ),
    case!(
        "in-place on an expanded view",
        Autograd,
        "unsupported operation: more than one element of the written-to tensor refers to a single memory location",
        |d| {
            leaf(d)?
                .mul(1.0)?
                .narrow(0, 0, 1)?
                .expand([4])?
                .mul_(2.0)
                .map(drop)
        }
    ),
    case!(
        "saved tensor modified in place",
        Autograd,
        "one of the variables needed for gradient computation has been modified by an inplace operation",
        |d| {
            let x = leaf(d)?;
            let y = x.mul(1.0)?;
            let z = y.mul(&y)?;
            y.add_(1.0)?;
            z.sum_all()?.backward()
        }
    ),
    // --- module moves ----------------------------------------------------------------------
    case!(
        "Linear to cuda:5 of 2",
        Device,
        "CUDA error: invalid device ordinal (the model unchanged)",
        |d| {
            let m = Linear::new(3, 2, d)?;
            m.to(Device::Cuda(5))
        }
    ),
    case!(
        "Linear on input of 4 features",
        InvalidArgument,
        "mat1 and mat2 shapes cannot be multiplied (2x4 and 3x2)",
        |d| {
            Linear::new(3, 2, d)?
                .forward(&Tensor::zeros([2, 4], d)?)
                .map(drop)
        }
    ),
    case!(
        "Linear on input on another device",
        DeviceMismatch,
        "Expected all tensors to be on the same device",
        |d| {
            Linear::new(3, 2, d)?
                .forward(&Tensor::zeros([2, 3], other(d))?)
                .map(drop)
        }
    ),
    // --- allocation sizes ------------------------------------------------------------------
    case!(
        "zeros of 2^46 f32",
        OutOfMemory,
        "CUDA out of memory / DefaultCPUAllocator: can't allocate memory",
        |d| { Tensor::zeros([HUGE], d).map(drop) }
    ),
    case!(
        "to_vec of a 2^46 broadcast view",
        OutOfMemory,
        "RuntimeError: can't allocate memory (a MemoryError on the host)",
        |d| { huge(d, HUGE)?.to_vec::<f32>().map(drop) }
    ),
    case!(
        "contiguous of a 2^46 broadcast view",
        OutOfMemory,
        "CUDA out of memory / DefaultCPUAllocator: can't allocate memory",
        |d| { huge(d, HUGE)?.contiguous().map(drop) }
    ),
    case!(
        "to(cpu) and back of a 2^46 broadcast view",
        OutOfMemory,
        "CUDA out of memory / DefaultCPUAllocator: can't allocate memory",
        |d| { huge(d, HUGE)?.to(other(d))?.add(1.0).map(drop) }
    ),
    case!(
        "2^46 view plus one",
        OutOfMemory,
        "CUDA out of memory / DefaultCPUAllocator: can't allocate memory",
        |d| { huge(d, HUGE)?.add(1.0).map(drop) }
    ),
    case!(
        "shape whose element count overflows",
        Shape,
        "Storage size calculation overflowed",
        |d| { Tensor::zeros([usize::MAX / 2, 4], d).map(drop) }
    ),
    // --- environment variables (device discovery's parsing) --------------------------------
    case!(
        "EMBER_CUDA_EMULATOR=abc",
        Device,
        "(PyTorch has no emulator; CUDA_VISIBLE_DEVICES=abc hides every device)",
        |_| { env(Some("abc"), None) }
    ),
    case!("EMBER_CUDA_EMULATOR=-1", Device, "(no emulator)", |_| env(
        Some("-1"),
        None
    )),
    case!(
        "EMBER_CUDA_EMULATOR=100000",
        Device,
        "(no emulator)",
        |_| env(Some("100000"), None)
    ),
    case!("EMBER_CUDA_EMULATOR=1.5", Device, "(no emulator)", |_| env(
        Some("1.5"),
        None
    )),
    case!(
        "EMBER_CUDA_EMULATOR_MEMORY=garbage",
        Device,
        "(no emulator)",
        |_| { env(Some("1"), Some("garbage")) }
    ),
    case!(
        "EMBER_CUDA_EMULATOR_MEMORY=17TiB",
        Device,
        "(no emulator)",
        |_| { env(Some("1"), Some("17TiB")) }
    ),
];

/// Every probe on `device`; the failures, one line each.
fn run_all(device: &Device) -> Vec<String> {
    let mut failures = Vec::new();
    let mut check = |name: String, kind: ErrorKind, torch: &str, f: &dyn Fn() -> Result<()>| {
        match catch_unwind(AssertUnwindSafe(f)) {
            Err(_) => failures.push(format!("{name}: panicked (PyTorch: {torch})")),
            Ok(Ok(())) => failures.push(format!("{name}: accepted (PyTorch: {torch})")),
            Ok(Err(e)) if e.kind() != kind => {
                failures.push(format!("{name}: {:?} instead of {kind:?}: {e}", e.kind()))
            }
            Ok(Err(_)) => {}
        }
    };
    for &(op, kind, f) in BINARY {
        for &(a, b) in BAD_SHAPE_PAIRS {
            check(
                format!("{op} {a:?} {b:?}"),
                kind,
                "The size of tensor a must match the size of tensor b",
                &|| f(&Tensor::ones(a, device)?, &Tensor::ones(b, device)?).map(drop),
            );
        }
        check(
            format!("{op} across devices"),
            ErrorKind::DeviceMismatch,
            "Expected all tensors to be on the same device",
            &|| {
                f(
                    &Tensor::ones([2], device)?,
                    &Tensor::ones([2], other(device))?,
                )
                .map(drop)
            },
        );
    }
    for &(op, f) in DIM_OPS {
        for &dim in BAD_DIMS {
            check(
                format!("{op} dim {dim}"),
                ErrorKind::Index,
                "Dimension out of range (expected to be in range of [-3, 2])",
                &|| f(&Tensor::ones([2, 3, 4], device)?, dim).map(drop),
            );
        }
    }
    for c in CASES {
        check(c.name.to_string(), c.kind, c.torch, &|| (c.run)(device));
    }
    failures
}

fn probe(device: Device) {
    if std::env::var_os("EMBER_GPU_TEST").is_none() {
        cuda::use_emulator(ember::driver::emulator::EmulatorConfig::devices(2)).unwrap();
    }
    let failures = run_all(&device);
    assert!(
        failures.is_empty(),
        "{} probe(s) failed on {device}:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn probes_cpu() {
    probe(Device::Cpu);
}

#[test]
fn probes_cuda() {
    probe(Device::Cuda(0));
}
