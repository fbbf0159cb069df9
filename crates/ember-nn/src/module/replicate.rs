//! Replicas of a module ([`Replicate`]): `copy.deepcopy(model)` for Ember's modules, what
//! `DataParallel` builds its per-device copies from.
//!
//! Note [Replicas of a module]: a module's `Clone` (where it has one) shares its tensors,
//! since a parameter is an `Arc` (Note [Modules move in place]); a replica is the other
//! copy: the same structure (field by field, so the same type, names, children and plain
//! data) around NEW tensors, as PyTorch's `copy.deepcopy(module)`:
//!
//! - every parameter and buffer is a new leaf with its own storage, holding a copy of the
//!   values, with the original's shape, dtype, device and `requires_grad`. Unlike
//!   `deepcopy`, gradients are not copied (the replica's `.grad` is none): a replica is a
//!   fresh module to run or train, and `DataParallel` adds its replicas' gradients into the
//!   original's, which copied gradients would count twice;
//! - sharing inside the module is kept, as `deepcopy`'s memo keeps it: a tensor held by two
//!   fields (tied weights) is one tensor in the replica, and an `Arc` module held twice is
//!   one replica held twice (for `Arc`s of one type: an `Arc<Linear>` and an
//!   `Arc<dyn Module>` of the same module become two replicas that still share their
//!   tensors). So the replica's `named_parameters()` lists the same names as the original's;
//! - the training flag is copied, and so are the forward hooks, into tables of the
//!   replica's own ([`ModuleHooks`](super::ModuleHooks)' `Clone`); plain fields (sizes,
//!   options, names) are `Clone`d, which is why `#[derive(Module)]` asks for `Clone` on
//!   them.
//!
//! The typed form is the [`Replicate`] trait (`let copy = net.replicate()?`), written by
//! `#[derive(Module)]` and implemented by every layer; `Box<dyn Module>` and
//! `Arc<dyn Module>` go through the object-safe
//! [`ModuleParts::replicate_boxed_with`](super::ModuleParts::replicate_boxed_with), which
//! the derive also writes (and `Module::replicate_boxed` calls), so `Sequential`'s boxed
//! layers replicate too. One [`ReplicaMemo`] is threaded through a whole replica: that is
//! where sharing is remembered.

use std::any::Any;
use std::sync::Arc;

use super::{Module, ModuleParts};
use crate::{NnError, Result, Tensor};

/// A module (or a part of one: a tensor, an `Option`, a `Vec`, an array, a `Box`, an `Arc`)
/// that can make a replica of itself: the same structure around new tensors. See
/// Note [Replicas of a module].
///
/// ```
/// use ember_nn::{Module, Replicate, layers::{Linear, ReLU, Sequential}};
/// # fn main() -> ember_nn::Result<()> {
/// let model = Sequential::new().add(Linear::new(4, 2, ())?).add(ReLU::new());
/// let copy = model.replicate()?;
/// let (a, b) = (model.parameters(), copy.parameters());
/// assert_eq!(a[0].to_vec::<f32>()?, b[0].to_vec::<f32>()?); // the same values
/// assert!(!a[0].same(&b[0]));                                // in a new tensor
/// # Ok(()) }
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` has no replica: it does not implement `Replicate`",
    label = "not `Replicate`",
    note = "#[derive(Module)] writes `Replicate` and every layer has it; implement it for a hand-written module; a derived struct whose field this is can opt out with #[module(no_replicate)]"
)]
pub trait Replicate: Sized {
    /// A replica: a new module of the same structure with new tensors holding copies of
    /// the values (Note [Replicas of a module]).
    fn replicate(&self) -> Result<Self> {
        self.replicate_with(&mut ReplicaMemo::new())
    }

    /// [`replicate`](Replicate::replicate) as a part of a larger replica, remembering in
    /// `memo` what was copied so that what is shared stays shared.
    fn replicate_with(&self, memo: &mut ReplicaMemo) -> Result<Self>;
}

/// What one replica has copied so far: each original tensor with its copy, each `Arc` with
/// its replica (`copy.deepcopy`'s `memo`). Start with [`ReplicaMemo::new`] (which
/// [`Replicate::replicate`] does).
#[derive(Default)]
pub struct ReplicaMemo {
    tensors: Vec<(Tensor, Tensor)>,
    /// An `Arc`'s address with its replica (an `Arc<M>` as `dyn Any`).
    shared: Vec<(usize, Box<dyn Any + Send + Sync>)>,
}

impl std::fmt::Debug for ReplicaMemo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplicaMemo")
            .field("tensors", &self.tensors.len())
            .field("shared", &self.shared.len())
            .finish()
    }
}

impl ReplicaMemo {
    /// A memo with nothing copied yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// The replica of the `Arc` at `addr` of type `A`, made by `make` the first time.
    fn shared<A: Clone + Send + Sync + 'static>(
        &mut self,
        addr: usize,
        make: impl FnOnce(&mut Self) -> Result<A>,
    ) -> Result<A> {
        let seen = self
            .shared
            .iter()
            .find_map(|(a, r)| (*a == addr).then(|| r.downcast_ref::<A>()).flatten());
        if let Some(r) = seen {
            return Ok(r.clone());
        }
        let r = make(self)?;
        self.shared.push((addr, Box::new(r.clone())));
        Ok(r)
    }
}

/// A new leaf with a copy of the values (same shape, dtype, device, `requires_grad`; no
/// gradient); the same copy for every field that holds this tensor.
impl Replicate for Tensor {
    fn replicate_with(&self, memo: &mut ReplicaMemo) -> Result<Self> {
        if let Some((_, copy)) = memo.tensors.iter().find(|(t, _)| t.same(self)) {
            return Ok(copy.clone());
        }
        let copy = self.data().copy()?;
        if self.requires_grad() {
            copy.requires_grad_(true)?;
        }
        memo.tensors.push((self.clone(), copy.clone()));
        Ok(copy)
    }
}

impl<T: Replicate> Replicate for Option<T> {
    fn replicate_with(&self, memo: &mut ReplicaMemo) -> Result<Self> {
        self.as_ref().map(|t| t.replicate_with(memo)).transpose()
    }
}

impl<T: Replicate> Replicate for Vec<T> {
    fn replicate_with(&self, memo: &mut ReplicaMemo) -> Result<Self> {
        self.iter().map(|t| t.replicate_with(memo)).collect()
    }
}

impl<T: Replicate, const N: usize> Replicate for [T; N] {
    fn replicate_with(&self, memo: &mut ReplicaMemo) -> Result<Self> {
        let v = self
            .iter()
            .map(|t| t.replicate_with(memo))
            .collect::<Result<Vec<T>>>()?;
        let len = v.len();
        <[T; N]>::try_from(v).map_err(|_| {
            NnError::invalid(
                "replicate",
                format!("an array of {N} modules gave {len} replicas"),
            )
            .into()
        })
    }
}

impl<M: Replicate> Replicate for Box<M> {
    fn replicate_with(&self, memo: &mut ReplicaMemo) -> Result<Self> {
        Ok(Box::new((**self).replicate_with(memo)?))
    }
}

/// A boxed module of any type: through its
/// [`replicate_boxed_with`](super::ModuleParts::replicate_boxed_with).
impl Replicate for Box<dyn Module> {
    fn replicate_with(&self, memo: &mut ReplicaMemo) -> Result<Self> {
        (**self).replicate_boxed_with(memo)
    }
}

/// One replica per shared module: two `Arc`s of one module give two `Arc`s of one replica.
impl<M: Replicate + Send + Sync + 'static> Replicate for Arc<M> {
    fn replicate_with(&self, memo: &mut ReplicaMemo) -> Result<Self> {
        memo.shared(address(self), |memo| {
            Ok(Arc::new((**self).replicate_with(memo)?))
        })
    }
}

/// A shared module of any type, replicated once per allocation (see the impl for `Arc<M>`).
impl Replicate for Arc<dyn Module> {
    fn replicate_with(&self, memo: &mut ReplicaMemo) -> Result<Self> {
        replicate_arc(self, memo)
    }
}

/// The replica of a shared module of any type, as an `Arc` (made once per allocation).
pub(crate) fn replicate_arc<M: ModuleParts + ?Sized>(
    arc: &Arc<M>,
    memo: &mut ReplicaMemo,
) -> Result<Arc<dyn Module>> {
    memo.shared(address(arc), |memo| {
        Ok(Arc::<dyn Module>::from((**arc).replicate_boxed_with(memo)?))
    })
}

/// How the boxed replica of a generic derived module (`S<M>`, `#[derive(Module)]`) copies
/// a field that holds child modules of a type parameter: through the child's own boxed
/// replica ([`replicate_boxed_with`](super::ModuleParts::replicate_boxed_with)), taken back
/// to the field's type. Every [`Module`] has it, so `S<M>`'s boxed replica asks nothing of
/// `M` beyond `Module` (see Note [Boxed replicas of generic modules]); `Option`, `Vec` and
/// arrays of such fields have it too.
///
/// Note [Boxed replicas of generic modules]: a `Sequential` (or `DataParallel`) replicates
/// its layers through `replicate_boxed_with`, an object-safe method of `ModuleParts`. The
/// derive writes it for `S<M>` in the `ModuleParts` impl, which must hold for every `M`
/// the user's `impl<M: Module> Module for S<M>` allows, so it cannot ask `M: Replicate`.
/// It asks `M: DynReplicate`, which every module meets: the child's boxed replica is a
/// `Box<dyn Module>`, and since `Module: Any` it is taken back to `M` by a downcast (for
/// `M = Box<dyn Module>`, whose replica is the held module's, by boxing it once more).
/// A replica whose type is not `M` (an `M = Box<Linear>`, whose boxed replica is the
/// `Linear` itself) is an error naming both types.
#[diagnostic::on_unimplemented(
    message = "`{Self}` holds no modules the boxed replica of a generic module can copy",
    label = "not a `Module` (nor an Option, Vec or array of modules)"
)]
pub trait DynReplicate: Sized {
    /// A replica of the field, through its modules' boxed replicas.
    fn dyn_replicate_with(&self, memo: &mut ReplicaMemo) -> Result<Self>;
}

impl<M: Module> DynReplicate for M {
    fn dyn_replicate_with(&self, memo: &mut ReplicaMemo) -> Result<Self> {
        let boxed = self.replicate_boxed_with(memo)?;
        let seen: &dyn Any = &*boxed;
        let any: Box<dyn Any> = if seen.is::<M>() {
            boxed
        } else {
            // `M` a `Box<dyn Module>`: the replica is the held module's.
            Box::new(boxed)
        };
        any.downcast::<M>().map(|m| *m).map_err(|_| {
            NnError::invalid(
                "replicate",
                format!(
                    "the replica of `{}` is not a `{}` (a generic module's boxed replica takes its \
                     children's replicas back to their types)",
                    self.name(),
                    std::any::type_name::<M>()
                ),
            )
            .into()
        })
    }
}

impl<C: DynReplicate> DynReplicate for Option<C> {
    fn dyn_replicate_with(&self, memo: &mut ReplicaMemo) -> Result<Self> {
        self.as_ref()
            .map(|c| c.dyn_replicate_with(memo))
            .transpose()
    }
}

impl<C: DynReplicate> DynReplicate for Vec<C> {
    fn dyn_replicate_with(&self, memo: &mut ReplicaMemo) -> Result<Self> {
        self.iter().map(|c| c.dyn_replicate_with(memo)).collect()
    }
}

impl<C: DynReplicate, const N: usize> DynReplicate for [C; N] {
    fn dyn_replicate_with(&self, memo: &mut ReplicaMemo) -> Result<Self> {
        let v = self
            .iter()
            .map(|c| c.dyn_replicate_with(memo))
            .collect::<Result<Vec<C>>>()?;
        let len = v.len();
        <[C; N]>::try_from(v).map_err(|_| {
            NnError::invalid(
                "replicate",
                format!("an array of {N} modules gave {len} replicas"),
            )
            .into()
        })
    }
}

/// Where an `Arc`'s module lives (its identity while the original is borrowed).
fn address<M: ?Sized>(arc: &Arc<M>) -> usize {
    Arc::as_ptr(arc) as *const () as usize
}

/// How `#[derive(Module)]` copies a plain field (numbers, options, names, and
/// `#[module(skip)]` fields) into a replica: with `Clone`.
#[diagnostic::on_unimplemented(
    message = "#[derive(Module)] copies the plain field of type `{Self}` into a replica with `Clone`, and `{Self}` is not `Clone`",
    label = "not `Clone`",
    note = "derive or implement `Clone` for it, or mark the struct #[module(no_replicate)] (then it has no replica, and DataParallel cannot take it)"
)]
pub trait ClonePlainField {
    /// The copy.
    fn clone_plain_field(&self) -> Self;
}

impl<T: Clone> ClonePlainField for T {
    fn clone_plain_field(&self) -> Self {
        self.clone()
    }
}
