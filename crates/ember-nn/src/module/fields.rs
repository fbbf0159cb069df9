//! How `#[derive(Module)]` reads a field: [`ChildModules`] for the fields that hold modules
//! (a module, `Option`, `Vec`, arrays; `Box` and `Arc` are modules), [`TensorField`] for `#[param]` and
//! `#[buffer]` fields; and `Module` for `Box<M>` and `Arc<M>`, so `Box<dyn Module>` and
//! `Arc<dyn Module>` are modules.

use std::sync::Arc;

use super::{Module, ModuleHooks, ModuleParts, ReplicaMemo, TrainingFlag, replicate_arc};
use crate::{Result, Tensor};

/// A field type that holds child modules: what `#[derive(Module)]` registers from a field
/// named `name`. Every [`Module`] is one child (`name`); `Option<C>` adds its content when
/// `Some`; `Vec<C>` and `[C; N]` name their elements `name.0`, `name.1`, ... (PyTorch's
/// `ModuleList`). Implement it for a container of
/// your own to make it a field type the derive accepts (and
/// [`Replicate`](super::Replicate), which the derive's replica asks of every child field).
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a module, so #[derive(Module)] cannot register this field",
    label = "not a `Module` (nor an Option, Vec, array, Box or Arc of modules)",
    note = "mark a field that holds no parameters with #[module(skip)]; a tensor with #[param] or #[buffer]"
)]
pub trait ChildModules: Send + Sync + std::fmt::Debug + 'static {
    /// Appends the children this field holds, named from `name`.
    fn collect_children<'a>(&'a self, name: &str, out: &mut Vec<(String, &'a dyn Module)>);
}

/// A module is one child; a `Box` or an `Arc` is the module it holds (so two fields holding
/// the same `Arc` are one module, listed once by `named_modules()` and `parameters()`, and
/// twice by `state_dict()`, as PyTorch's shared modules are).
impl<M: Module> ChildModules for M {
    fn collect_children<'a>(&'a self, name: &str, out: &mut Vec<(String, &'a dyn Module)>) {
        out.push((name.to_string(), self.as_module()));
    }
}

impl<C: ChildModules> ChildModules for Option<C> {
    fn collect_children<'a>(&'a self, name: &str, out: &mut Vec<(String, &'a dyn Module)>) {
        if let Some(c) = self {
            c.collect_children(name, out);
        }
    }
}

/// A `Vec` of modules is PyTorch's `ModuleList`: a child named `name` (listed by
/// `named_modules()` and printed as `ModuleList`) whose children are the elements, `0`,
/// `1`, ..., so their parameters are `name.0.weight`, ...
impl<C: ChildModules> ChildModules for Vec<C> {
    fn collect_children<'a>(&'a self, name: &str, out: &mut Vec<(String, &'a dyn Module)>) {
        out.push((name.to_string(), ModuleList::from_vec(self)));
    }
}

/// An array of modules is a `ModuleList` too (see the impl for `Vec`).
impl<C: ChildModules, const N: usize> ChildModules for [C; N] {
    fn collect_children<'a>(&'a self, name: &str, out: &mut Vec<(String, &'a dyn Module)>) {
        out.push((name.to_string(), ModuleList::from_array(self)));
    }
}

/// A `Vec` or an array of modules seen as PyTorch's `ModuleList`, in place (a reference to
/// the field, cast). Not callable, as PyTorch's is not.
#[derive(Debug)]
#[repr(transparent)]
struct ModuleList<L: ?Sized>(L);

impl<C> ModuleList<Vec<C>> {
    fn from_vec(v: &Vec<C>) -> &Self {
        // SAFETY: `ModuleList` is `repr(transparent)` over its one field, so it has the
        // layout of `Vec<C>`, and the reference keeps the borrow's lifetime.
        unsafe { &*(v as *const Vec<C> as *const Self) }
    }
}

impl<C, const N: usize> ModuleList<[C; N]> {
    fn from_array(a: &[C; N]) -> &Self {
        // SAFETY: as in `from_vec`: `repr(transparent)` over `[C; N]`.
        unsafe { &*(a as *const [C; N] as *const Self) }
    }
}

macro_rules! module_list {
    ($([$($gen:tt)*] $list:ty;)*) => {
        $(
            impl<C: ChildModules, $($gen)*> ModuleParts for ModuleList<$list> {
                fn name(&self) -> &'static str {
                    "ModuleList"
                }
                fn as_module(&self) -> &dyn Module {
                    self
                }
                fn named_children(&self) -> Vec<(String, &dyn Module)> {
                    let mut out = Vec::new();
                    for (i, c) in self.0.iter().enumerate() {
                        c.collect_children(&i.to_string(), &mut out);
                    }
                    out
                }
            }

            impl<C: ChildModules, $($gen)*> Module for ModuleList<$list> {
                fn forward(&self, _input: &Tensor) -> Result<Tensor> {
                    Err(crate::NnError::invalid(
                        "ModuleList",
                        "a ModuleList is not callable: call its elements in the model's forward",
                    ).into())
                }
            }
        )*
    };
}

module_list! {
    [] Vec<C>;
    [const N: usize] [C; N];
}

/// A field type `#[param]` and `#[buffer]` accept: a [`Tensor`], or an `Option<Tensor>`
/// (registered when `Some`, as PyTorch's `register_parameter(name, None)` registers nothing).
#[diagnostic::on_unimplemented(
    message = "#[param] and #[buffer] take a `Tensor` or an `Option<Tensor>`, not `{Self}`",
    label = "not a tensor field"
)]
pub trait TensorField {
    /// Appends this field's tensor, named `name`, if there is one.
    fn collect_tensors(&self, name: &'static str, out: &mut Vec<(&'static str, Tensor)>);
}

impl TensorField for Tensor {
    fn collect_tensors(&self, name: &'static str, out: &mut Vec<(&'static str, Tensor)>) {
        out.push((name, self.clone()));
    }
}

impl TensorField for Option<Tensor> {
    fn collect_tensors(&self, name: &'static str, out: &mut Vec<(&'static str, Tensor)>) {
        if let Some(t) = self {
            out.push((name, t.clone()));
        }
    }
}

macro_rules! delegate {
    ($($(#[$doc:meta])* $wrapper:ident => |$this:ident, $memo:ident| $replica:expr;)*) => {
        $(
            impl<M: ModuleParts + ?Sized> ModuleParts for $wrapper<M> {
                fn name(&self) -> &'static str {
                    (**self).name()
                }
                fn as_module(&self) -> &dyn Module {
                    (**self).as_module()
                }
                fn local_parameters(&self) -> Vec<(&'static str, Tensor)> {
                    (**self).local_parameters()
                }
                fn local_buffers(&self) -> Vec<(&'static str, Tensor)> {
                    (**self).local_buffers()
                }
                fn named_children(&self) -> Vec<(String, &dyn Module)> {
                    (**self).named_children()
                }
                fn training_flag(&self) -> Option<&TrainingFlag> {
                    (**self).training_flag()
                }
                fn hooks(&self) -> Option<&ModuleHooks> {
                    (**self).hooks()
                }
                fn replicate_boxed_with(&self, memo: &mut ReplicaMemo) -> Result<Box<dyn Module>> {
                    let ($this, $memo) = (self, memo);
                    $replica
                }
            }

            $(#[$doc])*
            impl<M: Module + ?Sized> Module for $wrapper<M> {
                fn forward(&self, input: &Tensor) -> Result<Tensor> {
                    (**self).forward(input)
                }
                fn extra_repr(&self) -> String {
                    (**self).extra_repr()
                }
            }
        )*
    };
}

delegate! {
    /// A boxed module is the module it holds: `Box<dyn Module>` fields, `Sequential`'s layers.
    /// Its replica is the held module's, boxed once.
    Box => |this, memo| (**this).replicate_boxed_with(memo);
    /// A shared module is the module it holds: `Arc<dyn Module>` for [`checkpoint`](crate::checkpoint).
    /// Its replica is an `Arc` of the held module's, made once per allocation (see
    /// Note [Replicas of a module]).
    Arc => |this, memo| Ok(Box::new(replicate_arc(this, memo)?));
}
