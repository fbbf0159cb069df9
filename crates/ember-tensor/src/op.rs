//! The elementwise kernels' scalar side: each elementwise op once, as a marker type with
//! its kernel name, its dtype rule and its per-dtype scalar functions (candle's `op.rs`
//! shape). The CPU kernels are generic over these (so a marker's functions *are* its CPU
//! kernel); a CUDA kernel for op `O` and dtype `d` is the symbol
//! `{O::KERNEL}_{d.short_name()}`. Everything else about an op (its method, backward,
//! autocast category and profiler name) is its entry in the op table, `ops/table.rs`, whose
//! rows are the [`OpInfo`]s declared here.

use half::{bf16, f16};

use crate::dtype::{DType, WithDType};
use crate::error::TensorError;
use crate::math::FastExp;
use crate::scalar::Scalar;

/// What autocast does to an op's eligible inputs (the op table's `autocast` column).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CastPolicy {
    /// Cast to the region's dtype (f16 or bf16): the products.
    LowerPrecision,
    /// Cast to f32: ops whose range or accuracy f16/bf16 would hurt.
    Fp32,
    /// Cast to the widest input dtype: ops that take several tensors.
    Promote,
}

/// One row of the op table (`ember_tensor::op_table`): what the layers above the kernels
/// read about an op. The profiler names its events by `name`; autocast reads `autocast`
/// (Note [Autocast hook]); the autograd graph names the op's node `backward`.
#[derive(Debug, PartialEq, Eq)]
pub struct OpInfo {
    /// PyTorch's name of the op (`aten::` less): the method's and the profiler row's.
    pub name: &'static str,
    /// The autograd node's name (`ExpBackward0`) for the elementwise rows, whose backward
    /// the table holds; `None` for the other rows, whose methods record their own nodes.
    pub backward: Option<&'static str>,
    /// The op's autocast category; `None` runs as given under autocast.
    pub autocast: Option<CastPolicy>,
}

/// Which dtypes a unary op takes, and what it does with the others.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum UnaryKind {
    /// Floating math: integer and bool inputs are first cast to f32 (PyTorch's
    /// `int_to_float` promotion, e.g. `torch.exp(int_tensor)` is float32).
    Float,
    /// Floating activations: other dtypes are an error (as PyTorch's "not implemented for
    /// 'Long'").
    FloatOnly,
    /// Numeric: every dtype but bool keeps its dtype; bool is an error.
    Numeric,
    /// Every dtype keeps its dtype.
    All,
}

/// An elementwise unary op.
pub(crate) trait UnaryOpT: Send + Sync + 'static {
    /// The CUDA kernel's base name: `cuda/ops.rs` launches `{KERNEL}_{dtype}`.
    const KERNEL: &'static str;
    const KIND: UnaryKind;
    fn f32(x: f32) -> f32;
    fn f64(x: f64) -> f64;
    fn i64(x: i64) -> i64 {
        x
    }
    fn i32(x: i32) -> i32 {
        x
    }
    fn u8(x: u8) -> u8 {
        x
    }
    fn bool(x: bool) -> bool {
        x
    }
}

/// An elementwise binary op over two operands of one dtype, giving that dtype.
pub(crate) trait BinaryOpT: Send + Sync + 'static {
    /// The CUDA kernel's base name: `cuda/ops.rs` launches `{KERNEL}_{dtype}`.
    const KERNEL: &'static str;
    /// `false` if the op refuses bool inputs (PyTorch's "Subtraction, the `-` operator,
    /// with two bool tensors is not supported").
    const BOOL_OK: bool;
    /// `true` for ops that always compute in floating point (true division): integer and
    /// bool operands are promoted to f32 first.
    const FLOAT_ONLY: bool = false;
    /// Operands the op refuses before any kernel runs (an integer tensor to a negative
    /// integer power), given the left operand's dtype, the result's, and the right operand
    /// if it is a number: the error, in PyTorch's words.
    fn refuse(
        _op: &'static str,
        _lhs: DType,
        _result: DType,
        _rhs: Option<Scalar>,
    ) -> Option<TensorError> {
        None
    }
    fn f32(a: f32, b: f32) -> f32;
    fn f64(a: f64, b: f64) -> f64;
    fn i64(a: i64, b: i64) -> i64;
    fn i32(a: i32, b: i32) -> i32;
    fn u8(a: u8, b: u8) -> u8;
    fn bool(a: bool, b: bool) -> bool {
        a | b
    }
}

/// An element type with the per-dtype dispatch of the op traits (f16/bf16 compute in f32).
pub(crate) trait Elem: WithDType + PartialOrd {
    fn unary<O: UnaryOpT>(self) -> Self;
    fn binary<O: BinaryOpT>(self, rhs: Self) -> Self;
}

macro_rules! elem_native {
    ($t:ty, $f:ident) => {
        impl Elem for $t {
            #[inline(always)]
            fn unary<O: UnaryOpT>(self) -> Self {
                O::$f(self)
            }
            #[inline(always)]
            fn binary<O: BinaryOpT>(self, rhs: Self) -> Self {
                O::$f(self, rhs)
            }
        }
    };
}
elem_native!(f32, f32);
elem_native!(f64, f64);
elem_native!(i64, i64);
elem_native!(i32, i32);
elem_native!(u8, u8);
elem_native!(bool, bool);

macro_rules! elem_half {
    ($t:ty) => {
        impl Elem for $t {
            #[inline(always)]
            fn unary<O: UnaryOpT>(self) -> Self {
                <$t>::from_f32(O::f32(self.to_f32()))
            }
            #[inline(always)]
            fn binary<O: BinaryOpT>(self, rhs: Self) -> Self {
                <$t>::from_f32(O::f32(self.to_f32(), rhs.to_f32()))
            }
        }
    };
}
elem_half!(f16);
elem_half!(bf16);

/// Whether unary op `O` accepts `dtype` as is, needs it cast to f32 first, or refuses it.
pub(crate) fn unary_compute_dtype(kind: UnaryKind, dtype: DType) -> Option<DType> {
    match kind {
        UnaryKind::All => Some(dtype),
        UnaryKind::Numeric => (dtype != DType::Bool).then_some(dtype),
        UnaryKind::FloatOnly => dtype.is_float().then_some(dtype),
        UnaryKind::Float => Some(if dtype.is_float() { dtype } else { DType::F32 }),
    }
}

macro_rules! unary_op {
    ($name:ident, $kernel:literal, $kind:ident, $x:ident => $float:expr
     $(, int: $i:ident => $int:expr)? $(, u8: $u:ident => $uint:expr)? $(, bool: $b:ident => $bexpr:expr)?) => {
        #[doc = concat!("The scalar side of kernel `", $kernel, "`.")]
        #[derive(Clone, Copy, Debug)]
        pub(crate) struct $name;
        impl UnaryOpT for $name {
            const KERNEL: &'static str = $kernel;
            const KIND: UnaryKind = UnaryKind::$kind;
            #[inline(always)]
            fn f32($x: f32) -> f32 {
                $float
            }
            #[inline(always)]
            fn f64($x: f64) -> f64 {
                $float
            }
            $(
            #[inline(always)]
            fn i64($i: i64) -> i64 {
                $int
            }
            #[inline(always)]
            fn i32($i: i32) -> i32 {
                $int
            }
            )?
            $(
            #[inline(always)]
            fn u8($u: u8) -> u8 {
                $uint
            }
            )?
            $(
            #[inline(always)]
            fn bool($b: bool) -> bool {
                $bexpr
            }
            )?
        }
    };
}

unary_op!(Neg, "uneg", Numeric, x => -x, int: x => x.wrapping_neg(), u8: x => x.wrapping_neg());
unary_op!(Abs, "uabs", Numeric, x => x.abs(), int: x => x.wrapping_abs());
unary_op!(Sign, "usign", All,
    x => if x > 0.0 { 1.0 } else if x < 0.0 { -1.0 } else { 0.0 * x },
    int: x => x.signum(), u8: x => (x > 0) as u8);
unary_op!(Relu, "urelu", Numeric, x => if x < 0.0 { 0.0 } else { x }, int: x => x.max(0));
unary_op!(Exp, "uexp", Float, x => x.fast_exp());
unary_op!(Log, "ulog", Float, x => x.ln());
unary_op!(Log1p, "ulog1p", Float, x => x.ln_1p());
unary_op!(Sqrt, "usqrt", Float, x => x.sqrt());
unary_op!(Rsqrt, "ursqrt", Float, x => 1.0 / x.sqrt());
unary_op!(Sin, "usin", Float, x => x.sin());
unary_op!(Cos, "ucos", Float, x => x.cos());
unary_op!(Tanh, "utanh", Float, x => x.tanh());
unary_op!(Sigmoid, "usigmoid", Float, x => 1.0 / (1.0 + (-x).fast_exp()));
unary_op!(Reciprocal, "ureciprocal", Float, x => 1.0 / x);
unary_op!(Silu, "usilu", FloatOnly, x => x / (1.0 + (-x).fast_exp()));
// PyTorch's hardswish: `x · relu6(x + 3) / 6`.
unary_op!(Hardswish, "uhardswish", FloatOnly, x => x * (x + 3.0).clamp(0.0, 6.0) / 6.0);
// PyTorch's softplus with beta = 1, threshold = 20.
unary_op!(Softplus, "usoftplus", FloatOnly, x => if x > 20.0 { x } else { x.fast_exp().ln_1p() });

/// `gelu` with the tanh approximation: `x/2 * (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct GeluTanh;
impl UnaryOpT for GeluTanh {
    const KERNEL: &'static str = "ugelu_tanh";
    const KIND: UnaryKind = UnaryKind::FloatOnly;
    fn f32(x: f32) -> f32 {
        use std::f32::consts::{FRAC_1_SQRT_2, FRAC_2_SQRT_PI};
        let k = FRAC_2_SQRT_PI * FRAC_1_SQRT_2; // sqrt(2/pi)
        0.5 * x * (1.0 + (k * (x + 0.044_715 * x * x * x)).tanh())
    }
    fn f64(x: f64) -> f64 {
        use std::f64::consts::{FRAC_1_SQRT_2, FRAC_2_SQRT_PI};
        let k = FRAC_2_SQRT_PI * FRAC_1_SQRT_2;
        0.5 * x * (1.0 + (k * (x + 0.044_715 * x * x * x)).tanh())
    }
}

/// `gelu` with the exact (erf) form: `x/2 * (1 + erf(x/sqrt 2))`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct GeluErf;
impl UnaryOpT for GeluErf {
    const KERNEL: &'static str = "ugelu_erf";
    const KIND: UnaryKind = UnaryKind::FloatOnly;
    // `x/2 · erfc(-x/√2)`: the same value as `x/2 (1 + erf(x/√2))`, without the
    // cancellation of `1 + erf` for negative `x`; f32 in f32 (libm's `erfcf`, as PyTorch's
    // f32 kernel does not widen).
    fn f32(x: f32) -> f32 {
        0.5 * x * libm::erfcf(-x * std::f32::consts::FRAC_1_SQRT_2)
    }
    fn f64(x: f64) -> f64 {
        0.5 * x * libm::erfc(-x * std::f64::consts::FRAC_1_SQRT_2)
    }
}

macro_rules! binary_op {
    ($name:ident, $kernel:literal, bool_ok: $bok:expr, $a:ident, $b:ident => float: $f:expr,
     int: $int:expr, u8: $u:expr $(, bool: $bexpr:expr)?
     $(, refuse: |$ro:ident, $rl:ident, $rt:ident, $rr:ident| $refuse:expr)?) => {
        #[doc = concat!("The scalar side of kernel `", $kernel, "`.")]
        #[derive(Clone, Copy, Debug)]
        pub(crate) struct $name;
        impl BinaryOpT for $name {
            const KERNEL: &'static str = $kernel;
            const BOOL_OK: bool = $bok;
            #[inline(always)]
            fn f32($a: f32, $b: f32) -> f32 {
                $f
            }
            #[inline(always)]
            fn f64($a: f64, $b: f64) -> f64 {
                $f
            }
            #[inline(always)]
            fn i64($a: i64, $b: i64) -> i64 {
                $int
            }
            #[inline(always)]
            fn i32($a: i32, $b: i32) -> i32 {
                $int
            }
            #[inline(always)]
            fn u8($a: u8, $b: u8) -> u8 {
                $u
            }
            $(
            #[inline(always)]
            fn bool($a: bool, $b: bool) -> bool {
                $bexpr
            }
            )?
            $(
            fn refuse($ro: &'static str, $rl: DType, $rt: DType, $rr: Option<Scalar>) -> Option<TensorError> {
                $refuse
            }
            )?
        }
    };
}

binary_op!(Add, "badd", bool_ok: true, a, b => float: a + b,
    int: a.wrapping_add(b), u8: a.wrapping_add(b), bool: a | b);
binary_op!(Sub, "bsub", bool_ok: false, a, b => float: a - b,
    int: a.wrapping_sub(b), u8: a.wrapping_sub(b));
binary_op!(Mul, "bmul", bool_ok: true, a, b => float: a * b,
    int: a.wrapping_mul(b), u8: a.wrapping_mul(b), bool: a & b);
binary_op!(Pow, "bpow", bool_ok: false, a, b => float: a.powf(b),
int: int_pow(a as i64, b as i64) as _, u8: int_pow(a as i64, b as i64) as u8,
refuse: |op, lhs, _result, rhs| match rhs {
    Some(Scalar::Int(e)) if e < 0 && !lhs.is_float() => Some(TensorError::invalid(op, format!(
        "Integers to negative integer powers are not allowed (a {lhs} tensor to the power {e})"
    ))),
    _ => None,
});
// PyTorch's logaddexp: `max + log1p(exp(-|a - b|))`, and `a` itself where both are the same
// infinity (so `logaddexp(-inf, -inf)` is `-inf`, not NaN). Floating dtypes only.
binary_op!(LogAddExp, "blogaddexp", bool_ok: false, a, b =>
    float: if a.is_infinite() && a == b { a } else { a.max(b) + (-(a - b).abs()).fast_exp().ln_1p() },
    int: a.max(b), u8: a.max(b),
    refuse: |op, _lhs, result, _rhs| (!result.is_float())
        .then_some(TensorError::UnsupportedDType { op, dtype: result, hint: "" }));
binary_op!(Maximum, "bmaximum", bool_ok: true, a, b =>
    float: if a.is_nan() { a } else if b.is_nan() || b > a { b } else { a }, int: a.max(b), u8: a.max(b), bool: a | b);
binary_op!(Minimum, "bminimum", bool_ok: true, a, b =>
    float: if a.is_nan() { a } else if b.is_nan() || b < a { b } else { a }, int: a.min(b), u8: a.min(b), bool: a & b);
binary_op!(LogicalAnd, "bland", bool_ok: true, a, b => float: a * b,
    int: a & b, u8: a & b, bool: a & b);
binary_op!(LogicalOr, "blor", bool_ok: true, a, b => float: a + b,
    int: a | b, u8: a | b, bool: a | b);
binary_op!(LogicalXor, "blxor", bool_ok: true, a, b => float: a - b,
    int: a ^ b, u8: a ^ b, bool: a ^ b);

/// True division (`/`): always floating point.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Div;
impl BinaryOpT for Div {
    const KERNEL: &'static str = "bdiv";
    const BOOL_OK: bool = true;
    const FLOAT_ONLY: bool = true;
    fn f32(a: f32, b: f32) -> f32 {
        a / b
    }
    fn f64(a: f64, b: f64) -> f64 {
        a / b
    }
    // Never called: integer operands are promoted to f32 by the front.
    fn i64(a: i64, b: i64) -> i64 {
        a.checked_div(b).unwrap_or(0)
    }
    fn i32(a: i32, b: i32) -> i32 {
        a.checked_div(b).unwrap_or(0)
    }
    fn u8(a: u8, b: u8) -> u8 {
        a.checked_div(b).unwrap_or(0)
    }
}

/// Integer power as PyTorch's CPU kernel: wrapping; a negative exponent gives 0 unless the
/// base is 1 or -1.
fn int_pow(mut base: i64, exp: i64) -> i64 {
    if exp < 0 {
        return match base {
            1 => 1,
            -1 => {
                if exp % 2 == 0 {
                    1
                } else {
                    -1
                }
            }
            _ => 0,
        };
    }
    let (mut e, mut acc) = (exp as u64, 1i64);
    while e > 0 {
        if e & 1 == 1 {
            acc = acc.wrapping_mul(base);
        }
        base = base.wrapping_mul(base);
        e >>= 1;
    }
    acc
}

/// The optimizers' in-place pointwise ops that fuse several passes into one, each with its
/// scalar: `self += v·t1·t2`, `self += v·t1/t2`, `self = lerp(self, end, w)`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum FusedOp {
    Addcmul(f64),
    Addcdiv(f64),
    Lerp(f64),
}

/// Comparison ops, giving bool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CmpOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

impl CmpOp {
    pub(crate) fn name(self) -> &'static str {
        match self {
            CmpOp::Eq => "eq",
            CmpOp::Ne => "ne",
            CmpOp::Lt => "lt",
            CmpOp::Le => "le",
            CmpOp::Gt => "gt",
            CmpOp::Ge => "ge",
        }
    }
}

/// Reductions that have kernels; the others (mean, var, logsumexp, norm, softmax) are
/// composed from these and elementwise ops.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ReduceOp {
    Sum,
    Prod,
    Max,
    Min,
    ArgMax,
    ArgMin,
}

impl ReduceOp {
    pub(crate) fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
            ReduceOp::ArgMax => "argmax",
            ReduceOp::ArgMin => "argmin",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The exact GELU against Python's `0.5·x·math.erfc(-x/√2)` in f64, to a relative error
    /// (also in the far negative tail, where `1 + erf` would cancel) of 1e-13 in f64 (the
    /// tail magnifies the rounding of `x/√2` tenfold) and 4 f32 ulps (times the tail's
    /// condition number) in f32.
    #[test]
    fn gelu_erf_matches_known_values() {
        let known = [
            (-8.0, -4.976_768_459_417_455_5e-15),
            (-5.0, -1.433_257_859_395_973_1e-6),
            (-3.0, -0.004_049_694_094_890_287),
            (-1.0, -0.158_655_253_931_457_07),
            (-0.5, -0.154_268_769_362_993_44),
            (0.0, 0.0),
            (0.5, 0.345_731_230_637_006_56),
            (1.0, 0.841_344_746_068_542_9),
            (3.0, 2.995_950_305_905_11),
        ];
        for (x, e) in known {
            let rel = |got: f64| {
                if e == 0.0 {
                    got.abs()
                } else {
                    ((got - e) / e).abs()
                }
            };
            let g64 = GeluErf::f64(x);
            assert!(rel(g64) < 1e-13, "gelu({x}) = {g64} in f64, expected {e}");
            let g32 = GeluErf::f32(x as f32) as f64;
            // The tail's condition number is about x² (d ln erfc(z)/dz ≈ -2z): the rounding
            // of x/√2 to f32 alone moves the result by that many ulps.
            let tol = 4.0 * f32::EPSILON as f64 * (x * x).max(1.0);
            assert!(rel(g32) < tol, "gelu({x}) = {g32} in f32, expected {e}");
        }
        assert!(GeluErf::f64(f64::NAN).is_nan());
        assert_eq!(GeluErf::f32(f32::INFINITY), f32::INFINITY);
        // -inf · 0, as PyTorch's `x/2 (1 + erf(x/√2))` gives.
        assert!(GeluErf::f32(f32::NEG_INFINITY).is_nan());
    }

    #[test]
    fn int_pow_as_pytorch() {
        assert_eq!(int_pow(2, 10), 1024);
        assert_eq!(int_pow(-1, -3), -1);
        assert_eq!(int_pow(2, -1), 0);
        assert_eq!(int_pow(3, 64), 3i64.wrapping_pow(64));
    }
}
