//! The op table: each op of Ember declared once (PyTorch's `native_functions.yaml` and
//! `derivatives.yaml` in one place, as declarative macros).
//!
//! Note [The op table]: a row names the op, and from it come
//! - its [`OpInfo`] (a `const` of the op's own name, e.g. `op_table::exp`): PyTorch's name,
//!   which the profiler shows; the autograd node's name; its autocast category, which
//!   `ember-amp`'s policy reads (no list of names anywhere else);
//! - for the elementwise rows, the methods themselves: the tape-less `RawTensor` method
//!   (dtype rule, profiler event, dispatch to the CPU and CUDA kernels of the marker type
//!   the row names in `op.rs`) and the user-facing [`Tensor`] method (autocast, the
//!   forward, and the backward written in the row beside it).
//!
//! So an elementwise op is its row here, its scalar functions in `op.rs` (the CPU kernel:
//! `cpu/elementwise.rs` is generic over them), its line in `kernels/unary.cu` or
//! `kernels/elementwise.cu`, and a test (docs/adding-an-op.md walks through one). Ops whose
//! forward is not one elementwise kernel (products, reductions, losses, views) keep their
//! methods in the other `ops/` files and take their row from [`others`](self#others): the
//! name, node and autocast category are still declared only here.
//!
//! A backward reads the op's saved input(s) and output: `saves(x, y)` (unary) or
//! `saves(a, b, y)` (binary, per input) says which are kept; only those are saved, and the
//! names not saved are bound to the incoming gradient as placeholders.
#![allow(non_upper_case_globals)]

use crate::RawTensor as Raw;
use crate::autograd::error::Result;
use crate::autograd::graph::{BackwardFn, Saved, maybe_record, needs_grad, record};
use crate::autograd::mode::autocast_inputs;
use crate::op::{self, CastPolicy, OpInfo};
use crate::ops::{bw1, zeros_like};
use crate::raw::binary::r#where as select;
use crate::scalar::{Operand, RawOperand};
use crate::tensor::Tensor;

// --- the table's macros (the rows start below them) ----------------------------------------

/// `true` if `$want` is among the listed names (`has!(x; x y)`).
macro_rules! has {
    ($want:ident;) => { false };
    (x; x $($rest:ident)*) => { true };
    (y; y $($rest:ident)*) => { true };
    (a; a $($rest:ident)*) => { true };
    (b; b $($rest:ident)*) => { true };
    ($want:ident; $other:ident $($rest:ident)*) => { has!($want; $($rest)*) };
}

/// The autocast column: `None` or a [`CastPolicy`] variant.
macro_rules! cast {
    (None) => {
        None
    };
    ($policy:ident) => {
        Some(CastPolicy::$policy)
    };
}

/// The name column: the method's name unless the row says `as "name"`.
macro_rules! name_of {
    ($name:ident) => {
        stringify!($name)
    };
    ($name:ident, $as:literal) => {
        $as
    };
}

macro_rules! unary_ops {
    ($(
        $(#[$doc:meta])*
        $name:ident $(as $pname:literal)? => $kernel:ty, $bw:literal, autocast: $cast:ident,
            saves($($s:ident),*) |$g:ident, $x:ident, $y:ident| $grad:expr;
    )*) => {
        $(
            #[doc = concat!("The row of `", stringify!($name), "`.")]
            pub const $name: OpInfo = OpInfo {
                name: name_of!($name $(, $pname)?),
                backward: Some($bw),
                autocast: cast!($cast),
            };
        )*
        /// The unary elementwise rows.
        pub const UNARY: &[&OpInfo] = &[$(&$name),*];

        impl Raw {
            $(
                $(#[$doc])*
                pub fn $name(&self) -> crate::error::Result<Raw> {
                    self.unary_op::<$kernel>($name.name)
                }
            )*
        }

        impl Tensor {
            $(
                $(#[$doc])*
                pub fn $name(&self) -> Result<Tensor> {
                    unary_front(
                        &$name,
                        self,
                        Tensor::$name,
                        Raw::$name,
                        (has!(x; $($s)*), has!(y; $($s)*)),
                        |$g, $x, $y| {
                            let _ = (&$x, &$y);
                            $grad
                        },
                    )
                }
            )*
        }
    };
}

macro_rules! binary_ops {
    ($(
        $(#[$doc:meta])*
        $name:ident => $kernel:ty, $bw:literal, autocast: $cast:ident,
            $(#[$ldoc:meta])* lhs: saves($($ls:ident),*) |$g:ident, $a:ident, $b:ident, $y:ident| $lgrad:expr,
            $(#[$rdoc:meta])* rhs: saves($($rs:ident),*) |$g2:ident, $a2:ident, $b2:ident, $y2:ident| $rgrad:expr;
    )*) => {
        $(
            #[doc = concat!("The row of `", stringify!($name), "`.")]
            pub const $name: OpInfo = OpInfo {
                name: stringify!($name),
                backward: Some($bw),
                autocast: cast!($cast),
            };
        )*
        /// The binary elementwise rows.
        pub const BINARY: &[&OpInfo] = &[$(&$name),*];

        impl Raw {
            $(
                $(#[$doc])*
                pub fn $name<'a>(&self, rhs: impl Into<RawOperand<'a>>) -> crate::error::Result<Raw> {
                    self.binary_op::<$kernel>($name.name, rhs.into())
                }
            )*
        }

        impl Tensor {
            $(
                $(#[$doc])*
                pub fn $name<'a>(&self, rhs: impl Into<Operand<'a>>) -> Result<Tensor> {
                    binary_front(
                        &$name,
                        self,
                        rhs.into(),
                        |t, o| t.$name(o),
                        |t, o| t.$name(o),
                        [
                            BinaryGrad {
                                saves: [has!(a; $($ls)*), has!(b; $($ls)*), has!(y; $($ls)*)],
                                f: |$g, $a, $b, $y| {
                                    let _ = (&$a, &$b, &$y);
                                    $lgrad
                                },
                            },
                            BinaryGrad {
                                saves: [has!(a; $($rs)*), has!(b; $($rs)*), has!(y; $($rs)*)],
                                f: |$g2, $a2, $b2, $y2| {
                                    let _ = (&$a2, &$b2, &$y2);
                                    $rgrad
                                },
                            },
                        ],
                    )
                }
            )*
        }
    };
}

macro_rules! others {
    ($($name:ident $(as $pname:literal)?: $cast:ident;)*) => {
        $(
            #[doc = concat!("The row of `", stringify!($name), "`.")]
            pub const $name: OpInfo = OpInfo {
                name: name_of!($name $(, $pname)?),
                backward: None,
                autocast: cast!($cast),
            };
        )*
        /// The rows of ops whose methods live in the other `ops/` files.
        pub const OTHERS: &[&OpInfo] = &[$(&$name),*];
    };
}

/// Every row of the table.
pub fn all() -> impl Iterator<Item = &'static OpInfo> {
    UNARY.iter().chain(BINARY).chain(OTHERS).copied()
}

/// The row of the op PyTorch calls `name`, if Ember has it.
pub fn lookup(name: &str) -> Option<&'static OpInfo> {
    all().find(|o| o.name == name)
}

// --- the unary elementwise ops ------------------------------------------------------------

const SQRT_2_OVER_PI: f64 = 0.797_884_560_802_865_4;
const GELU_C: f64 = 0.044_715;

unary_ops! {
    /// `-x` (not for bool).
    neg => op::Neg, "NegBackward0", autocast: None, saves() |g, x, y| Ok(g.neg()?);
    /// `|x|` (not for bool).
    abs => op::Abs, "AbsBackward0", autocast: None, saves(x) |g, x, y| Ok(g.mul(&x.sign()?)?);
    /// -1, 0 or 1 by the sign of `x` (NaN stays NaN); the gradient is zero.
    sign => op::Sign, "SignBackward0", autocast: None, saves() |g, x, y| zeros_like(g);
    /// `e^x` (integers compute in f32).
    exp => op::Exp, "ExpBackward0", autocast: Fp32, saves(y) |g, x, y| Ok(g.mul(&y)?);
    /// Natural log (integers compute in f32).
    log => op::Log, "LogBackward0", autocast: Fp32, saves(x) |g, x, y| Ok(g.div(&x)?);
    /// `ln(1 + x)`, accurate near 0.
    log1p => op::Log1p, "Log1PBackward0", autocast: Fp32, saves(x)
        |g, x, y| Ok(g.div(&x.add(1.0)?)?);
    /// Square root.
    sqrt => op::Sqrt, "SqrtBackward0", autocast: None, saves(y)
        |g, x, y| Ok(g.div(&y.mul(2.0)?)?);
    /// `1 / sqrt(x)`.
    rsqrt => op::Rsqrt, "RsqrtBackward0", autocast: Fp32, saves(y)
        |g, x, y| Ok(g.mul(&y.pow(3.0)?.mul(-0.5)?)?);
    /// Sine.
    sin => op::Sin, "SinBackward0", autocast: None, saves(x) |g, x, y| Ok(g.mul(&x.cos()?)?);
    /// Cosine.
    cos => op::Cos, "CosBackward0", autocast: None, saves(x)
        |g, x, y| Ok(g.mul(&x.sin()?.neg()?)?);
    /// Hyperbolic tangent.
    tanh => op::Tanh, "TanhBackward0", autocast: None, saves(y)
        |g, x, y| Ok(g.mul(&y.square()?.neg()?.add(1.0)?)?);
    /// Logistic sigmoid, `1 / (1 + e^-x)`.
    sigmoid => op::Sigmoid, "SigmoidBackward0", autocast: None, saves(y)
        |g, x, y| Ok(g.mul(&y.mul(&y.neg()?.add(1.0)?)?)?);
    /// `1 / x`.
    reciprocal => op::Reciprocal, "ReciprocalBackward0", autocast: Fp32, saves(y)
        |g, x, y| Ok(g.mul(&y.square()?.neg()?)?);
    /// `max(x, 0)`; NaN stays NaN.
    relu => op::Relu, "ReluBackward0", autocast: None, saves(y)
        |g, x, y| Ok(g.threshold_backward(&y, 0.0)?);
    /// Exact GELU, `x/2 (1 + erf(x / sqrt 2))`: `gelu(Approximate::None)`.
    #[doc(hidden)]
    gelu_erf as "gelu" => op::GeluErf, "GeluBackward0", autocast: None, saves(x, y) |g, x, y| {
        // Φ(x) = gelu(x) / x (½ at 0); φ(x) = e^(-x²/2) / √(2π).
        let cdf = select(&x.eq(0.0)?, 0.5, &y.div(&x)?)?;
        let pdf = x.square()?.mul(-0.5)?.exp()?.mul(0.398_942_280_401_432_7)?;
        Ok(g.mul(&cdf.add(&x.mul(&pdf)?)?)?)
    };
    /// GELU with the tanh approximation: `gelu(Approximate::Tanh)`.
    #[doc(hidden)]
    gelu_tanh as "gelu" => op::GeluTanh, "GeluBackward0", autocast: None, saves(x) |g, x, y| {
        let x2 = x.square()?;
        let u = x.mul(&x2.mul(GELU_C)?.add(1.0)?)?.mul(SQRT_2_OVER_PI)?;
        let t = u.tanh()?;
        let du = x2.mul(3.0 * GELU_C)?.add(1.0)?.mul(SQRT_2_OVER_PI)?;
        let d = t.add(1.0)?.mul(0.5)?
            .add(&x.mul(0.5)?.mul(&t.square()?.neg()?.add(1.0)?)?.mul(&du)?)?;
        Ok(g.mul(&d)?)
    };
    /// `x * sigmoid(x)` (floating dtypes only).
    silu => op::Silu, "SiluBackward0", autocast: None, saves(x) |g, x, y| {
        let s = x.sigmoid()?;
        Ok(g.mul(&s.mul(&x.mul(&s.neg()?.add(1.0)?)?.add(1.0)?)?)?)
    };
    /// `ln(1 + e^x)`, linear above 20 (PyTorch's defaults `beta=1, threshold=20`).
    softplus => op::Softplus, "SoftplusBackward0", autocast: Fp32, saves(x)
        |g, x, y| Ok(select(&x.gt(20.0)?, g, &g.mul(&x.sigmoid()?)?)?);
    /// `x · relu6(x + 3) / 6` (`torch.nn.functional.hardswish`; floating dtypes only).
    hardswish => op::Hardswish, "HardswishBackward0", autocast: None, saves(x) |g, x, y| {
        // PyTorch's hardswish_backward: 0 up to -3, x/3 + 1/2 below 3, 1 from 3 on.
        let mid = x.div(3.0)?.add(0.5)?;
        let d = select(&x.le(-3.0)?, 0.0, &select(&x.lt(3.0)?, &mid, 1.0)?)?;
        Ok(g.mul(&d)?)
    };
}

// --- the binary elementwise ops -----------------------------------------------------------

binary_ops! {
    /// `self + rhs` with broadcasting and type promotion.
    ///
    /// ```
    /// use ember_tensor::{DType, Tensor};
    /// let a = Tensor::arange(0, 3, ())?;          // i64
    /// let b = Tensor::ones([2, 1], DType::F16)?;
    /// let c = a.add(&b)?;                          // broadcast to [2, 3], promoted to f16
    /// assert_eq!((c.dims(), c.dtype()), (vec![2usize, 3], DType::F16));
    /// assert_eq!(a.add(0.5)?.dtype(), DType::F32);  // int tensor + float scalar
    /// # Ok::<(), ember_tensor::Error>(())
    /// ```
    add => op::Add, "AddBackward0", autocast: Promote,
        lhs: saves() |g, a, b, y| Ok(g.clone()),
        rhs: saves() |g, a, b, y| Ok(g.clone());
    /// `self - rhs` (not for two bool tensors).
    sub => op::Sub, "SubBackward0", autocast: Promote,
        lhs: saves() |g, a, b, y| Ok(g.clone()),
        rhs: saves() |g, a, b, y| Ok(g.neg()?);
    /// `self * rhs`.
    mul => op::Mul, "MulBackward0", autocast: Promote,
        lhs: saves(b) |g, a, b, y| Ok(g.mul(b)?),
        rhs: saves(a) |g, a, b, y| Ok(g.mul(a)?);
    /// True division `self / rhs`: integer operands give f32, as PyTorch.
    div => op::Div, "DivBackward0", autocast: Promote,
        lhs: saves(b) |g, a, b, y| Ok(g.div(b)?),
        rhs: saves(a, b) |g, a, b, y| Ok(g.neg()?.mul(a)?.div(&b.mul(b)?)?);
    /// `self ** rhs` (integer powers of integers stay integers). An integer tensor to a
    /// negative integer number is an error, as in PyTorch ("Integers to negative integer
    /// powers are not allowed."); negative elements of an integer exponent *tensor* give 0
    /// except for bases 1 and -1, as PyTorch's kernel.
    pow => op::Pow, "PowBackward0", autocast: Fp32,
        // b·a^(b-1), 0 where b == 0.
        lhs: saves(a, b) |g, a, b, y| {
            let d = b.mul(&a.pow(&b.sub(1.0)?)?)?;
            Ok(g.mul(&select(&b.eq(0.0)?, 0.0, &d)?)?)
        },
        // a^b·ln a, 0 where a == 0 (PyTorch's convention).
        rhs: saves(a, y) |g, a, b, y| {
            let d = y.mul(&a.log()?)?;
            Ok(g.mul(&select(&a.eq(0.0)?, 0.0, &d)?)?)
        };
    /// Elementwise maximum (NaN propagates); the larger input takes the gradient, ties
    /// split it, as PyTorch.
    maximum => op::Maximum, "MaximumBackward0", autocast: Promote,
        lhs: saves(a, b) |g, a, b, y| winner_grad(g, &a.gt(b)?, &a.eq(b)?),
        rhs: saves(a, b) |g, a, b, y| winner_grad(g, &b.gt(a)?, &a.eq(b)?);
    /// Elementwise minimum (NaN propagates); gradients as [`Tensor::maximum`]'s.
    minimum => op::Minimum, "MinimumBackward0", autocast: Promote,
        lhs: saves(a, b) |g, a, b, y| winner_grad(g, &a.lt(b)?, &a.eq(b)?),
        rhs: saves(a, b) |g, a, b, y| winner_grad(g, &b.lt(a)?, &a.eq(b)?);
    /// `log(e^self + e^rhs)` without overflow (`torch.logaddexp`; floating dtypes only).
    logaddexp => op::LogAddExp, "LogaddexpBackward0", autocast: None,
        // PyTorch's derivatives.yaml: grad / (1 + exp(other - self)), and symmetrically.
        lhs: saves(a, b) |g, a, b, y| Ok(g.div(&b.sub(a)?.exp()?.add(1.0)?)?),
        rhs: saves(a, b) |g, a, b, y| Ok(g.div(&a.sub(b)?.exp()?.add(1.0)?)?);
}

/// The gradient of `maximum`/`minimum` for one input: all of `g` where it won, half where
/// the inputs tie, zero elsewhere.
fn winner_grad(g: &Raw, won: &Raw, tie: &Raw) -> Result<Raw> {
    Ok(select(won, g, &select(tie, &g.mul(0.5)?, 0.0)?)?)
}

// --- the other ops: methods (and their nodes) in the other `ops/` files, rows here --------

others! {
    // products
    matmul: LowerPrecision;
    mm: LowerPrecision;
    bmm: LowerPrecision;
    addmm: LowerPrecision;
    linear: LowerPrecision;
    conv2d: LowerPrecision;
    scaled_dot_product_attention: LowerPrecision;
    // reductions and normalisations
    sum: Fp32;
    prod: Fp32;
    logsumexp: Fp32;
    norm: Fp32;
    softmax: Fp32;
    log_softmax: Fp32;
    layer_norm: Fp32;
    // losses
    cross_entropy: Fp32;
    nll_loss: Fp32;
    mse_loss: Fp32;
    l1_loss: Fp32;
    binary_cross_entropy_with_logits: Fp32;
    // several tensors in
    r#where as "where": Promote;
    cat: Promote;
    stack: Promote;
    scatter_add: Promote;
}

// --- the fronts the rows' methods share ---------------------------------------------------

/// The user-facing form of a unary row: autocast, the forward on the data, and the node
/// whose backward is `grad(g, x, y)` over what `(save_x, save_y)` keeps.
fn unary_front(
    info: &'static OpInfo,
    x: &Tensor,
    rerun: fn(&Tensor) -> Result<Tensor>,
    forward: fn(&Raw) -> crate::error::Result<Raw>,
    (save_x, save_y): (bool, bool),
    grad: fn(&Raw, Raw, Raw) -> Result<Raw>,
) -> Result<Tensor> {
    if info.autocast.is_some()
        && let Some(c) = autocast_inputs(info, [x])?
    {
        return rerun(&c[0]);
    }
    let bw = info.backward.unwrap_or(info.name);
    let y = forward(&x.raw())?;
    maybe_record(bw, y.clone(), &[x], || {
        let sx = if save_x {
            Some(Saved::of(bw, x)?)
        } else {
            None
        };
        let sy = if save_y {
            Some(Saved::new(bw, &y))
        } else {
            None
        };
        Ok(bw1(move |g: &Raw| {
            let x = match &sx {
                Some(s) => s.get()?.to_dtype(g.dtype())?,
                None => g.clone(),
            };
            let y = match &sy {
                Some(s) => s.get()?,
                None => g.clone(),
            };
            grad(g, x, y)
        }))
    })
}

/// One input's gradient of a binary row: which of `(a, b, y)` it reads, and the formula.
struct BinaryGrad {
    saves: [bool; 3],
    f: fn(&Raw, &Raw, &Raw, &Raw) -> Result<Raw>,
}

impl BinaryGrad {
    /// The gradient from `g` and the values of `(a, b, y)` (the incoming gradient stands in
    /// for those not kept).
    fn run(&self, g: &Raw, vals: &[Option<Raw>; 3]) -> Result<Raw> {
        let v = |i: usize| vals[i].clone().unwrap_or_else(|| g.clone());
        (self.f)(g, &v(0), &v(1), &v(2))
    }
}

/// The saved `(a, b, y)` of a binary node, the inputs cast to the result's dtype `dt`.
fn fetch(saved: &[Option<Saved>; 3], dt: crate::DType) -> Result<[Option<Raw>; 3]> {
    let get = |i: usize| -> Result<Option<Raw>> {
        match &saved[i] {
            Some(s) if i < 2 => Ok(Some(s.get()?.to_dtype(dt)?)),
            Some(s) => Ok(Some(s.get()?)),
            None => Ok(None),
        }
    };
    Ok([get(0)?, get(1)?, get(2)?])
}

/// The user-facing form of a binary row: autocast, the forward on the data, and the node
/// whose backward runs the gradient of each input that needs one. A number operand joins
/// the backward as a 0-dim tensor of the result's dtype, made only if a formula reads it.
fn binary_front(
    info: &'static OpInfo,
    x: &Tensor,
    rhs: Operand<'_>,
    rerun: fn(&Tensor, Operand<'_>) -> Result<Tensor>,
    forward: fn(&Raw, RawOperand<'_>) -> crate::error::Result<Raw>,
    [lhs, rhs_grad]: [BinaryGrad; 2],
) -> Result<Tensor> {
    if info.autocast.is_some() {
        let cast = match rhs {
            Operand::Tensor(rt) => autocast_inputs(info, [x, rt])?,
            Operand::Scalar(_) => autocast_inputs(info, [x])?,
        };
        if let Some(c) = cast {
            let rhs = match rhs {
                Operand::Tensor(_) => Operand::Tensor(&c[1]),
                s => s,
            };
            return rerun(&c[0], rhs);
        }
    }
    let bw = info.backward.unwrap_or(info.name);
    let a = x.raw();
    match rhs {
        Operand::Scalar(s) => {
            let y = forward(&a, s.into())?;
            maybe_record(bw, y.clone(), &[x], || {
                let dt = y.dtype();
                let sa = if lhs.saves[0] {
                    Some(Saved::of(bw, x)?)
                } else {
                    None
                };
                let sy = lhs.saves[2].then(|| Saved::new(bw, &y));
                let saved = [sa, None, sy];
                Ok(bw1(move |g| {
                    let [a, _, y] = fetch(&saved, dt)?;
                    let b = if lhs.saves[1] {
                        Some(Raw::full([], s, (g.device(), dt))?)
                    } else {
                        None
                    };
                    lhs.run(g, &[a, b, y])
                }))
            })
        }
        Operand::Tensor(rt) => {
            let b = rt.raw();
            let y = forward(&a, (&b).into())?;
            if !needs_grad(&[x, rt]) {
                return Ok(Tensor::wrap(y));
            }
            let (need_a, need_b) = (x.requires_grad(), rt.requires_grad());
            let keep = |i: usize| (need_a && lhs.saves[i]) || (need_b && rhs_grad.saves[i]);
            let saved = [
                if keep(0) {
                    Some(Saved::of(bw, x)?)
                } else {
                    None
                },
                if keep(1) {
                    Some(Saved::of(bw, rt)?)
                } else {
                    None
                },
                keep(2).then(|| Saved::new(bw, &y)),
            ];
            let dt = y.dtype();
            let f: BackwardFn = Box::new(move |g| {
                let vals = fetch(&saved, dt)?;
                let ga = if need_a {
                    Some(lhs.run(g, &vals)?)
                } else {
                    None
                };
                let gb = if need_b {
                    Some(rhs_grad.run(g, &vals)?)
                } else {
                    None
                };
                Ok(vec![ga, gb])
            });
            Ok(record(bw, y, &[x, rt], f))
        }
    }
}
