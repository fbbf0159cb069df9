//! `Display` for tensors, printing as PyTorch's `repr` does: `tensor([[1., 2.]])`,
//! `tensor([True, False])`, `tensor([1, 2], dtype=torch.int32)`, summarised with `...`
//! above 1000 elements (3 edge items per dim), 80-column lines.

use std::fmt;

use crate::dtype::DType;
use crate::raw::RawTensor;

const THRESHOLD: usize = 1000;
const EDGE: usize = 3;
const LINEWIDTH: usize = 80;
const PRECISION: usize = 4;

#[derive(Clone, Copy)]
enum V {
    F(f64),
    I(i64),
    B(bool),
}

/// PyTorch's `_Formatter`: one number format and width for all printed elements.
struct Formatter {
    float: bool,
    int_mode: bool,
    sci: bool,
    width: usize,
}

/// Python's `f"{v:.{p}e}"`: mantissa, `e`, sign, at least two exponent digits.
fn sci(v: f64, p: usize) -> String {
    if !v.is_finite() {
        return py_special(v);
    }
    let s = format!("{v:.p$e}");
    match s.split_once('e') {
        Some((m, e)) => {
            let (sign, digits) = match e.strip_prefix('-') {
                Some(d) => ('-', d),
                None => ('+', e),
            };
            format!("{m}e{sign}{digits:0>2}")
        }
        None => s,
    }
}

fn py_special(v: f64) -> String {
    if v.is_nan() {
        "nan".into()
    } else if v > 0.0 {
        "inf".into()
    } else {
        "-inf".into()
    }
}

fn fixed(v: f64, p: usize) -> String {
    if v.is_finite() {
        format!("{v:.p$}")
    } else {
        py_special(v)
    }
}

impl Formatter {
    fn new(vals: &[V], float: bool) -> Formatter {
        let mut f = Formatter {
            float,
            int_mode: true,
            sci: false,
            width: 1,
        };
        if !float {
            f.width = vals.iter().map(|&v| raw(v).len()).max().unwrap_or(1).max(1);
            return f;
        }
        let fl: Vec<f64> = vals.iter().map(|&v| as_f64(v)).collect();
        let nz: Vec<f64> = fl
            .iter()
            .copied()
            .filter(|x| x.is_finite() && *x != 0.0)
            .collect();
        if nz.is_empty() {
            return f;
        }
        let (mut lo, mut hi) = (f64::INFINITY, 0f64);
        for x in &nz {
            lo = lo.min(x.abs());
            hi = hi.max(x.abs());
        }
        f.int_mode = nz.iter().all(|x| x.ceil() == *x);
        let ratio_big = hi / lo > 1000.0 || hi > 1.0e8;
        // As PyTorch, the width comes from the non-zero finite values only.
        let width = |g: &dyn Fn(f64) -> usize| nz.iter().map(|&x| g(x)).max().unwrap_or(1);
        if f.int_mode {
            if ratio_big {
                f.sci = true;
                f.width = width(&|x| sci(x, PRECISION).len());
            } else {
                f.width = width(&|x| fixed(x, 0).len() + 1);
            }
        } else if ratio_big || lo < 1.0e-4 {
            f.sci = true;
            f.width = width(&|x| sci(x, PRECISION).len());
        } else {
            f.width = width(&|x| fixed(x, PRECISION).len());
        }
        f
    }

    fn format(&self, v: V) -> String {
        let s = if self.float {
            let x = as_f64(v);
            if self.sci {
                sci(x, PRECISION)
            } else if self.int_mode {
                let mut s = fixed(x, 0);
                if x.is_finite() {
                    s.push('.');
                }
                s
            } else {
                fixed(x, PRECISION)
            }
        } else {
            raw(v)
        };
        format!("{s:>w$}", w = self.width)
    }
}

fn as_f64(v: V) -> f64 {
    match v {
        V::F(x) => x,
        V::I(i) => i as f64,
        V::B(b) => b as u8 as f64,
    }
}

fn raw(v: V) -> String {
    match v {
        V::F(x) => fixed(x, PRECISION),
        V::I(i) => i.to_string(),
        V::B(true) => "True".into(),
        V::B(false) => "False".into(),
    }
}

/// The indices shown along a dim of `size`: all, or the edges when summarising.
fn shown(size: usize, summarize: bool) -> (Vec<usize>, Option<usize>) {
    if summarize && size > 2 * EDGE {
        let mut v: Vec<usize> = (0..EDGE).collect();
        v.extend(size - EDGE..size);
        (v, Some(EDGE))
    } else {
        ((0..size).collect(), None)
    }
}

/// Visits the shown elements in order (for the formatter's width).
fn collect(
    vals: &[V],
    dims: &[usize],
    strides: &[usize],
    base: usize,
    summarize: bool,
    out: &mut Vec<V>,
) {
    match dims.split_first() {
        None => out.extend(vals.get(base).copied()),
        Some((&d, rest)) => {
            for i in shown(d, summarize).0 {
                collect(
                    vals,
                    rest,
                    &strides[1..],
                    base + i * strides[0],
                    summarize,
                    out,
                );
            }
        }
    }
}

struct Printer<'a> {
    vals: &'a [V],
    fmt: Formatter,
    summarize: bool,
}

impl Printer<'_> {
    fn tensor_str(&self, dims: &[usize], strides: &[usize], base: usize, indent: usize) -> String {
        let Some((&d, rest)) = dims.split_first() else {
            return self
                .fmt
                .format(self.vals.get(base).copied().unwrap_or(V::I(0)));
        };
        let (idx, gap) = shown(d, self.summarize);
        if rest.is_empty() {
            let mut elems: Vec<String> = idx
                .iter()
                .map(|&i| {
                    self.fmt.format(
                        self.vals
                            .get(base + i * strides[0])
                            .copied()
                            .unwrap_or(V::I(0)),
                    )
                })
                .collect();
            if let Some(g) = gap {
                elems.insert(g, " ...".into());
            }
            let per_line = (LINEWIDTH.saturating_sub(indent) / (self.fmt.width + 2)).max(1);
            let lines: Vec<String> = elems.chunks(per_line).map(|c| c.join(", ")).collect();
            return format!(
                "[{}]",
                lines.join(&format!(",\n{}", " ".repeat(indent + 1)))
            );
        }
        let mut slices: Vec<String> = idx
            .iter()
            .map(|&i| self.tensor_str(rest, &strides[1..], base + i * strides[0], indent + 1))
            .collect();
        if let Some(g) = gap {
            slices.insert(g, "...".into());
        }
        let sep = format!(",{}{}", "\n".repeat(dims.len() - 1), " ".repeat(indent + 1));
        format!("[{}]", slices.join(&sep))
    }
}

impl fmt::Display for RawTensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let dtype = self.dtype();
        let vals: Option<Vec<V>> = match dtype {
            DType::Bool => self
                .to_vec::<bool>()
                .ok()
                .map(|v| v.into_iter().map(V::B).collect()),
            d if d.is_int() => self
                .to_dtype(DType::I64)
                .and_then(|t| t.to_vec::<i64>())
                .ok()
                .map(|v| v.into_iter().map(V::I).collect()),
            _ => self
                .to_dtype(DType::F64)
                .and_then(|t| t.to_vec::<f64>())
                .ok()
                .map(|v| v.into_iter().map(V::F).collect()),
        };
        let Some(vals) = vals else {
            return write!(f, "tensor(<unreadable: {:?}>)", self);
        };
        let mut suffixes = Vec::new();
        if self.device().is_cuda() {
            suffixes.push(format!("device='{}'", self.device()));
        }
        let body = if self.numel() == 0 {
            if self.rank() != 1 {
                let d: Vec<String> = self.dims().iter().map(|d| d.to_string()).collect();
                suffixes.push(format!("size=({})", d.join(", ")));
            }
            if dtype != DType::F32 {
                suffixes.push(format!("dtype={dtype}"));
            }
            "[]".to_string()
        } else {
            if !matches!(dtype, DType::F32 | DType::I64 | DType::Bool) {
                suffixes.push(format!("dtype={dtype}"));
            }
            let summarize = self.numel() > THRESHOLD;
            let strides = crate::shape::Shape::from(self.dims()).contiguous_strides();
            let mut shown_vals = Vec::new();
            collect(&vals, self.dims(), &strides, 0, summarize, &mut shown_vals);
            let p = Printer {
                vals: &vals,
                fmt: Formatter::new(&shown_vals, dtype.is_float()),
                summarize,
            };
            p.tensor_str(self.dims(), &strides, 0, "tensor(".len())
        };
        write!(f, "tensor({body}")?;
        for s in suffixes {
            write!(f, ", {s}")?;
        }
        write!(f, ")")
    }
}
