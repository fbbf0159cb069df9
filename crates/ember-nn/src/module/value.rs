//! [`Value`]: the plain entries of a [`StateDict`](super::StateDict) (what PyTorch keeps as
//! a Python number or string: an epoch, a step, a scaler's scale, a config string), how
//! they are written in a file's metadata, and [`FromValue`], reading one back as a Rust
//! type.

use std::fmt;

use ember_tensor::Scalar;

use crate::{Error, NnError, Result, Tensor};

/// A plain (non-tensor) entry of a [`StateDict`](super::StateDict): an integer, a float, a
/// bool or a string. Integers are `i128`, so every `i64` and `u64` (a seed) fits.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// An integer.
    Int(i128),
    /// A float.
    Float(f64),
    /// A bool.
    Bool(bool),
    /// A string.
    Str(String),
}

impl Value {
    /// What kind of value this is, as error messages name it.
    pub fn kind(&self) -> &'static str {
        match self {
            Value::Int(_) => "an integer",
            Value::Float(_) => "a float",
            Value::Bool(_) => "a bool",
            Value::Str(_) => "a string",
        }
    }

    /// The value as a file's metadata holds it: JSON (`3`, `0.001`, `1.0`, `true`, `"mlp"`),
    /// with the non-finite floats as Python's `json` writes them (`NaN`, `Infinity`,
    /// `-Infinity`). `json.loads` reads every one back in Python.
    pub fn to_metadata(&self) -> String {
        match self {
            Value::Int(i) => i.to_string(),
            Value::Float(f) if f.is_nan() => "NaN".into(),
            Value::Float(f) if f.is_infinite() => {
                if *f > 0.0 { "Infinity" } else { "-Infinity" }.into()
            }
            // `{:?}` of an f64 reads back exactly and always has a `.` or an `e`.
            Value::Float(f) => format!("{f:?}"),
            Value::Bool(b) => b.to_string(),
            Value::Str(s) => serde_json::Value::String(s.clone()).to_string(),
        }
    }

    /// Reads a metadata string written by [`Value::to_metadata`]. A string that is not one
    /// of those forms (metadata another tool wrote, such as PyTorch's `"format": "pt"`) is
    /// taken as it is, as a string.
    pub fn from_metadata(text: &str) -> Value {
        match text {
            "NaN" => return Value::Float(f64::NAN),
            "Infinity" => return Value::Float(f64::INFINITY),
            "-Infinity" => return Value::Float(f64::NEG_INFINITY),
            "true" => return Value::Bool(true),
            "false" => return Value::Bool(false),
            _ => {}
        }
        let digits = text.strip_prefix('-').unwrap_or(text);
        if !digits.is_empty()
            && digits.bytes().all(|b| b.is_ascii_digit())
            && let Ok(i) = text.parse::<i128>()
        {
            return Value::Int(i);
        }
        if text.starts_with('"')
            && let Ok(s) = serde_json::from_str::<String>(text)
        {
            return Value::Str(s);
        }
        let numeric = text
            .bytes()
            .all(|b| b.is_ascii_digit() || matches!(b, b'-' | b'+' | b'.' | b'e' | b'E'));
        if numeric
            && text.bytes().any(|b| b.is_ascii_digit())
            && let Ok(f) = text.parse::<f64>()
        {
            return Value::Float(f);
        }
        Value::Str(text.to_string())
    }
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Str(s) => write!(f, "{s:?}"),
            other => f.write_str(&other.to_metadata()),
        }
    }
}

macro_rules! from_int {
    ($($t:ty),*) => {$(
        impl From<$t> for Value {
            fn from(v: $t) -> Value {
                Value::Int(i128::from(v))
            }
        }
    )*};
}
from_int!(i8, i16, i32, i64, u8, u16, u32, u64);

impl From<usize> for Value {
    fn from(v: usize) -> Value {
        // usize is at most 64 bits on every target Rust supports.
        Value::Int(v as i128)
    }
}

impl From<isize> for Value {
    fn from(v: isize) -> Value {
        Value::Int(v as i128)
    }
}

impl From<f64> for Value {
    fn from(v: f64) -> Value {
        Value::Float(v)
    }
}

impl From<f32> for Value {
    fn from(v: f32) -> Value {
        Value::Float(f64::from(v))
    }
}

impl From<bool> for Value {
    fn from(v: bool) -> Value {
        Value::Bool(v)
    }
}

impl From<&str> for Value {
    fn from(v: &str) -> Value {
        Value::Str(v.to_string())
    }
}

impl From<String> for Value {
    fn from(v: String) -> Value {
        Value::Str(v)
    }
}

impl From<&String> for Value {
    fn from(v: &String) -> Value {
        Value::Str(v.clone())
    }
}

impl From<Scalar> for Value {
    fn from(v: Scalar) -> Value {
        match v {
            Scalar::Int(i) => Value::Int(i128::from(i)),
            Scalar::Float(f) => Value::Float(f),
            Scalar::Bool(b) => Value::Bool(b),
        }
    }
}

/// A Rust type a [`StateDict`](super::StateDict) entry reads back as, with
/// [`StateDict::item`](super::StateDict::item): integers (from an integer value, or a
/// one-element integer tensor), floats (from a float or an integer), `bool`, `String` and
/// [`Value`] itself.
pub trait FromValue: Sized {
    /// What the type is, as error messages name it (`an integer of type usize`).
    const EXPECTED: &'static str;

    /// The value as `Self`, or `None` when it is of another kind or out of range.
    fn from_value(v: &Value) -> Option<Self>;
}

macro_rules! int_from_value {
    ($($t:ty),*) => {$(
        impl FromValue for $t {
            const EXPECTED: &'static str = concat!("an integer of type ", stringify!($t));
            fn from_value(v: &Value) -> Option<$t> {
                match v {
                    Value::Int(i) => <$t>::try_from(*i).ok(),
                    _ => None,
                }
            }
        }
    )*};
}
int_from_value!(i8, i16, i32, i64, i128, u8, u16, u32, u64, usize, isize);

impl FromValue for f64 {
    const EXPECTED: &'static str = "a number";
    fn from_value(v: &Value) -> Option<f64> {
        match v {
            Value::Float(f) => Some(*f),
            Value::Int(i) => Some(*i as f64),
            _ => None,
        }
    }
}

impl FromValue for f32 {
    const EXPECTED: &'static str = "a number";
    fn from_value(v: &Value) -> Option<f32> {
        f64::from_value(v).map(|f| f as f32)
    }
}

impl FromValue for bool {
    const EXPECTED: &'static str = "a bool";
    fn from_value(v: &Value) -> Option<bool> {
        match v {
            Value::Bool(b) => Some(*b),
            _ => None,
        }
    }
}

impl FromValue for String {
    const EXPECTED: &'static str = "a string";
    fn from_value(v: &Value) -> Option<String> {
        match v {
            Value::Str(s) => Some(s.clone()),
            _ => None,
        }
    }
}

impl FromValue for Value {
    const EXPECTED: &'static str = "a value";
    fn from_value(v: &Value) -> Option<Value> {
        Some(v.clone())
    }
}

/// The value of a one-element tensor (a 0-dim tensor PyTorch would keep for a number).
pub(super) fn tensor_value(key: &str, t: &Tensor) -> Result<Value> {
    if t.numel() != 1 {
        return Err(wrong(
            key,
            "one value",
            &format!("a tensor of shape {}", t.shape()),
        ));
    }
    Ok(Value::from(t.data().to_scalar()?))
}

/// The error of an entry that is not what the caller asked for.
pub(super) fn wrong(key: &str, expected: &str, found: &str) -> Error {
    NnError::invalid(
        "StateDict",
        format!("{key:?}: expected {expected}, found {found}"),
    )
    .into()
}

#[cfg(test)]
mod tests {
    use super::Value;

    #[test]
    fn metadata_round_trips_every_kind() {
        for v in [
            Value::Int(3),
            Value::Int(-7),
            Value::Int(i128::from(u64::MAX)),
            Value::Float(0.001),
            Value::Float(1.0),
            Value::Float(-2.5e-300),
            Value::Float(f64::INFINITY),
            Value::Float(f64::NEG_INFINITY),
            Value::Bool(true),
            Value::Str("mlp".into()),
            Value::Str("3".into()),
            Value::Str("with \"quotes\"\n".into()),
            Value::Str(String::new()),
        ] {
            let text = v.to_metadata();
            assert_eq!(Value::from_metadata(&text), v, "{text}");
        }
        let nan = Value::from_metadata(&Value::Float(f64::NAN).to_metadata());
        assert!(matches!(nan, Value::Float(f) if f.is_nan()));
        // 1.0 stays a float, "3" (a string) stays a string.
        assert_eq!(Value::Float(1.0).to_metadata(), "1.0");
        assert_eq!(Value::Str("3".into()).to_metadata(), "\"3\"");
        // Other tools' metadata: taken as strings.
        assert_eq!(Value::from_metadata("pt"), Value::Str("pt".into()));
        assert_eq!(Value::from_metadata("1.2.3"), Value::Str("1.2.3".into()));
        assert_eq!(Value::from_metadata("e"), Value::Str("e".into()));
    }
}
