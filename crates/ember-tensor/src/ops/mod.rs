//! Op fronts, one file per family. Each front checks devices, infers dtype and shape,
//! broadcasts and casts the inputs, and calls the storage's kernel (See Note [Dispatch]).

pub(crate) mod amp;
pub(crate) mod binary;
pub(crate) mod conv;
pub(crate) mod conv_grad;
pub(crate) mod index;
pub(crate) mod inplace;
pub(crate) mod loss;
pub(crate) mod matmul;
pub(crate) mod norm;
pub(crate) mod optim;
pub(crate) mod pool;
pub(crate) mod reduce;
pub(crate) mod unary;
