//! Op ranges for the profiler: each op front opens one [`trace::op_range`] named as PyTorch's
//! op without its `aten::` prefix (`add`, `mm`, `_to_copy`), describing its inputs when
//! shapes are recorded. See Note [Zero-cost tracing] in `ember_device::trace`: while no
//! profiler listens this is one relaxed atomic load and nothing else.

use ember_device::trace::{self, RangeGuard};

use crate::dtype::DType;
use crate::raw::RawTensor;
use crate::scalar::RawOperand;

/// One input as the profiler describes it.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Input<'a> {
    /// A tensor: its dims and dtype.
    Tensor(&'a RawTensor),
    /// A Python-style number.
    Scalar,
    /// Anything else (an option, a list of ints).
    Other,
}

impl<'a> From<&'a RawTensor> for Input<'a> {
    fn from(t: &'a RawTensor) -> Self {
        Input::Tensor(t)
    }
}

impl<'a> From<&RawOperand<'a>> for Input<'a> {
    fn from(o: &RawOperand<'a>) -> Self {
        match o {
            RawOperand::Tensor(t) => Input::Tensor(t),
            _ => Input::Scalar,
        }
    }
}

/// Open the range of op `name` over `inputs`.
#[inline]
pub(crate) fn op(name: &'static str, inputs: &[Input<'_>]) -> RangeGuard {
    trace::op_range(name, || describe(inputs))
}

/// Open the range of a one-tensor op.
#[inline]
pub(crate) fn op1(name: &'static str, x: &RawTensor) -> RangeGuard {
    trace::op_range(name, || describe(&[Input::Tensor(x)]))
}

/// How the profiler describes `inputs` (for ranges opened outside this crate, such as the
/// autograd engine's): `{"Input Dims":[[2,3]],"Input type":["float"]}`.
pub(crate) fn describe_inputs(inputs: &[&RawTensor]) -> String {
    let inputs: Vec<Input<'_>> = inputs.iter().map(|t| Input::Tensor(t)).collect();
    describe(&inputs)
}

/// PyTorch's name for a dtype in a trace's `Input type`.
pub fn torch_type_name(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "float",
        DType::F64 => "double",
        DType::F16 => "c10::Half",
        DType::Bf16 => "c10::BFloat16",
        DType::I64 => "long int",
        DType::I32 => "int",
        DType::U8 => "unsigned char",
        DType::Bool => "bool",
    }
}

/// `{"Input Dims":[[2,3],[]],"Input type":["float","Scalar"]}`, the args PyTorch writes.
/// Built in one buffer sized up front, digits written by hand: it runs once per op while
/// shapes are recorded, where `format!` and a second buffer cost more than the op.
fn describe(inputs: &[Input<'_>]) -> String {
    let mut s = String::with_capacity(40 + 24 * inputs.len());
    s.push_str("{\"Input Dims\":[");
    for (i, input) in inputs.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        s.push('[');
        if let Input::Tensor(t) = input {
            for (j, &d) in t.dims().iter().enumerate() {
                if j > 0 {
                    s.push(',');
                }
                push_decimal(&mut s, d);
            }
        }
        s.push(']');
    }
    s.push_str("],\"Input type\":[");
    for (i, input) in inputs.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        s.push('"');
        s.push_str(match input {
            Input::Tensor(t) => torch_type_name(t.dtype()),
            Input::Scalar => "Scalar",
            Input::Other => "",
        });
        s.push('"');
    }
    s.push_str("]}");
    s
}

/// Appends `n` in decimal.
fn push_decimal(s: &mut String, mut n: usize) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for &d in &digits[at..] {
        s.push(char::from(d));
    }
}

impl RawTensor {
    /// This tensor as a profiler input.
    #[inline]
    pub(crate) fn as_input(&self) -> Input<'_> {
        Input::Tensor(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn describes_tensors_scalars_and_others_as_pytorch_does() -> crate::error::Result<()> {
        let a = RawTensor::zeros([2, 3], DType::F32)?;
        let b = RawTensor::zeros([], DType::Bf16)?;
        let s = describe(&[a.as_input(), b.as_input(), Input::Scalar, Input::Other]);
        assert_eq!(
            s,
            r#"{"Input Dims":[[2,3],[],[],[]],"Input type":["float","c10::BFloat16","Scalar",""]}"#
        );
        assert_eq!(describe(&[]), r#"{"Input Dims":[],"Input type":[]}"#);
        let empty = RawTensor::zeros([0, 10, 1_000_007], DType::I64)?;
        assert_eq!(
            describe(&[empty.as_input()]),
            r#"{"Input Dims":[[0,10,1000007]],"Input type":["long int"]}"#
        );
        Ok(())
    }

    #[test]
    fn decimals_match_display() {
        for n in [0, 7, 10, 99, 100, 65_535, 1 << 40, usize::MAX] {
            let mut s = String::from("x");
            push_decimal(&mut s, n);
            assert_eq!(s, format!("x{n}"));
        }
    }
}
