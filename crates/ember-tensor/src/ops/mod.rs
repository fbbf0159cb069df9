//! The ops of the tensor core on autograd tensors: each runs the `ember-tensor` op on the
//! data and, when recording, adds a node whose backward is written with `ember-tensor` ops
//! (so it runs on every device the forward runs on).

pub(crate) mod attention;
mod close;
mod create;
mod elementwise;
mod index;
mod linalg;
mod loss;
mod nn;
mod norm;
mod reduce;
mod select;
pub mod table;
mod triangle;
mod untracked;
mod view;

pub use select::r#where;

use crate::RawTensor as Raw;

use crate::autograd::error::Result;
use crate::autograd::graph::BackwardFn;

/// A backward closure for one input.
pub(crate) fn bw1(f: impl FnMut(&Raw) -> Result<Raw> + Send + 'static) -> BackwardFn {
    let mut f = f;
    Box::new(move |g| Ok(vec![Some(f(g)?)]))
}

/// Zeros shaped, typed and placed like `t`.
pub(crate) fn zeros_like(t: &Raw) -> Result<Raw> {
    Ok(t.zeros_like()?)
}
