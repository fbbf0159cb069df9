//! `#[derive(Module)]`: PyTorch's attribute registration for Ember models.
//!
//! In PyTorch, assigning a module or an `nn.Parameter` to an attribute in `__init__`
//! registers it, so `parameters()`, `state_dict()`, `to(device)` and the optimizer see it.
//! In Ember a model is a struct, and this derive does the registering: it reads the struct's
//! fields and implements `ember_nn::ModuleParts` — the part of a module that says what it is made
//! of — and `ember_nn::Replicate`, the module's deep copy (see [Replicas](#replicas)). You
//! write only `Module::forward`:
//!
//! ```
//! use ember_nn::layers::{Dropout, Linear, ReLU, Sequential};
//! use ember_nn::{Module, ModuleHooks, Replicate, Result, Tensor, TrainingFlag};
//!
//! #[derive(Clone, Debug)]
//! struct Config {
//!     verbose: bool,
//! }
//!
//! #[derive(Debug, Module)]
//! struct Block {
//!     fc: Linear,
//!     act: ReLU,
//! }
//!
//! impl Module for Block {
//!     fn forward(&self, x: &Tensor) -> Result<Tensor> {
//!         self.act.call(&self.fc.call(x)?)
//!     }
//! }
//!
//! #[derive(Debug, Module)]
//! #[module(name = "Net")] // the default is the struct's name
//! struct MyNet {
//!     stem: Sequential,            // a child: "stem"
//!     blocks: Vec<Block>,          // children "blocks.0", "blocks.1", ...
//!     head: Option<Linear>,        // "head" when Some, absent when None
//!     drop: Box<dyn Module>,       // any module behind a Box (or an Arc)
//!     #[param]
//!     scale: Tensor,               // an own parameter: "scale"
//!     #[buffer]
//!     steps: Tensor,               // an own buffer: "steps" (in state_dict, not trained)
//!     #[module(skip)]
//!     config: Config,              // not registered (cloned into a replica)
//!     width: usize,                // plain data: ignored
//!     training: TrainingFlag,      // this module's own train/eval flag (optional)
//!     hooks: ModuleHooks,          // makes register_forward_hook work (optional)
//! }
//!
//! impl Module for MyNet {
//!     fn forward(&self, x: &Tensor) -> Result<Tensor> {
//!         let mut x = self.stem.call(x)?;
//!         for b in &self.blocks {
//!             x = b.call(&x)?;
//!         }
//!         if let Some(head) = &self.head {
//!             x = head.call(&x)?;
//!         }
//!         Ok(self.drop.call(&x)?.mul(&self.scale)?)
//!     }
//! }
//!
//! # fn main() -> ember_nn::Result<()> {
//! let net = MyNet {
//!     stem: Sequential::new().add(Linear::new(4, 8, ())?).add(ReLU::new()),
//!     blocks: vec![
//!         Block { fc: Linear::new(8, 8, ())?, act: ReLU::new() },
//!         Block { fc: Linear::new(8, 8, ())?, act: ReLU::new() },
//!     ],
//!     head: Some(Linear::new(8, 2, ())?),
//!     drop: Box::new(Dropout::new(0.1)?),
//!     scale: ember_nn::parameter(ember_tensor::Tensor::ones([2], ())?)?,
//!     steps: Tensor::zeros([], ())?,
//!     config: Config { verbose: false },
//!     width: 8,
//!     training: TrainingFlag::default(),
//!     hooks: ModuleHooks::default(),
//! };
//! let names: Vec<String> = net.named_parameters().into_iter().map(|(n, _)| n).collect();
//! assert_eq!(
//!     names,
//!     [
//!         "scale",
//!         "stem.0.weight", "stem.0.bias",
//!         "blocks.0.fc.weight", "blocks.0.fc.bias",
//!         "blocks.1.fc.weight", "blocks.1.fc.bias",
//!         "head.weight", "head.bias",
//!     ]
//! );
//! assert!(net.state_dict()?.contains_key("steps"));
//! let y = net.call(&Tensor::randn([3, 4], ())?)?;
//! assert_eq!(y.dims(), [3, 2]);
//! let copy = net.replicate()?; // the same structure around new tensors
//! assert_eq!(copy.state_dict()?.keys().collect::<Vec<_>>(), net.state_dict()?.keys().collect::<Vec<_>>());
//! assert!(!copy.scale.same(&net.scale));
//! # Ok(()) }
//! ```
//!
//! # The split: `ModuleParts` and `Module`
//!
//! A derive macro writes a whole trait impl, never part of one, so the module interface is
//! two traits:
//!
//! - `ember_nn::ModuleParts` (derived): the module's type name, its own parameters and buffers in
//!   declaration order, its children by name, its training flag and its hook storage — what
//!   `nn.Module.__setattr__` records in PyTorch — and its replica as a `Box<dyn Module>`
//!   (`replicate_boxed_with`, from the derived `Replicate`).
//! - `Module: ModuleParts` (written by you): `forward`, optionally `extra_repr`, and
//!   every provided walk over the tree (`named_parameters`, `state_dict`, `to`, `train`,
//!   `apply`, `named_modules`, hooks, `call`, ...).
//!
//! A model that needs nothing unusual writes `#[derive(Module)]` and `impl Module`; a
//! container with its own naming (as `Sequential`, whose children are `0`, `1`, ...)
//! implements `ModuleParts` by hand.
//!
//! # Fields
//!
//! Fields register in declaration order, as attribute assignments do in PyTorch (a module's
//! own parameters come before its children's, whatever the order of the fields).
//!
//! | field | registers as |
//! |---|---|
//! | `#[param] t: Tensor` / `Option<Tensor>` | own parameter `t` (absent when `None`) |
//! | `#[buffer] t: Tensor` / `Option<Tensor>` | own buffer `t` |
//! | `m: M` where `M: Module` | child `m` |
//! | `m: Option<M>` | child `m` when `Some` |
//! | `m: Vec<M>`, `[M; N]` | children `m.0`, `m.1`, ... (PyTorch's `ModuleList`) |
//! | `m: Box<dyn Module>`, `Box<M>`, `Arc<dyn Module>`, `Arc<M>` | child `m` |
//! | `training: TrainingFlag` | the module's own `train()`/`eval()` flag |
//! | `hooks: ModuleHooks` | storage for forward hooks and pre-hooks |
//! | numbers, `bool`, `String`, `Device`, `DType`, and `Option`/`Vec`/arrays/tuples of them | ignored |
//! | `#[module(skip)]` on any field | ignored |
//!
//! Any other field type must be a module (it implements `ember_nn::ChildModules`, which every
//! `Module` does), and the compiler says so at the field when it is not: a field the derive
//! silently passed over would drop its parameters from `parameters()`, `state_dict()` and
//! `to(device)`, the mistake this derive exists to prevent. Mark configuration structs
//! `#[module(skip)]`. A `Tensor` field needs one of `#[param]`, `#[buffer]` or
//! `#[module(skip)]` for the same reason. Tuple structs name their fields `0`, `1`, ...
//!
//! # Replicas
//!
//! The derive also implements `ember_nn::Replicate`: `net.replicate()?` is PyTorch's
//! `copy.deepcopy(net)`, a module of the same type whose parameters and buffers are new
//! tensors with copies of the values (same shapes, dtypes, devices and `requires_grad`; no
//! gradients), which is what `DataParallel` makes its per-device copies from
//! (Note [Replicas of a module] in `ember-nn`). Field by field:
//!
//! | field | in the replica |
//! |---|---|
//! | `#[param]`, `#[buffer]` | a new tensor (one for a tensor two fields share) |
//! | a child module (and `Option`, `Vec`, arrays, `Box`, `Arc` of them) | the child's replica (its `Replicate`; `Box<dyn Module>` through `replicate_boxed_with`) |
//! | `TrainingFlag`, `ModuleHooks` | copied: the same mode, the same hooks in a table of its own |
//! | plain data and `#[module(skip)]` fields | `Clone::clone` |
//!
//! So every plain and skipped field must be `Clone` (the compiler says so at the field), and
//! every child must implement `Replicate`: every layer in `ember-nn` and every derived
//! module does; a hand-written module implements it itself. A struct that cannot meet this
//! (a field holding a file or a channel) says `#[module(no_replicate)]`: it gets no
//! `Replicate`, and `replicate_boxed()` on it is an error naming it. A generic struct
//! (`S<M>`) has `replicate()` when its type parameters are `Replicate` (or `Clone`, for
//! plain fields). Its boxed replica (what a `Sequential` or `DataParallel` holding it
//! uses) asks nothing more of `M` than `Module`: when the type parameters appear only in
//! child fields (`inner: M`, `Option<M>`, `Vec<M>`, `[M; N]`), those are copied through
//! the children's own boxed replicas (Note [Boxed replicas of generic modules] in
//! `ember-nn`). A type parameter in a plain or tensor field (`S<C> { cfg: C }`), or a
//! lifetime, leaves the struct without a boxed replica: `replicate_boxed()` on it, or on a
//! `Sequential` holding it, is an error naming it.
//!
//! # Attributes on the struct
//!
//! - `#[module(name = "Net")]`: the name `describe()` prints (default: the struct's name).
//!   Any `&'static str` expression works, with `self` in scope:
//!   `#[module(name = self.kind)]`.
//! - `#[module(no_replicate)]`: no `Replicate` impl (see [Replicas](#replicas)).
//! - `#[module(no_display)]`: no `Display` impl. By default the derive writes one that
//!   prints the module tree as PyTorch's `print(model)` does (`Module::describe`), so
//!   `println!("{model}")` works; a struct with its own `Display` opts out.
//! - `#[module(crate = ember::nn)]`: where the generated code finds `ember-nn`. By default
//!   the derive reads the calling package's `Cargo.toml` (through `proc-macro-crate`): a
//!   dependency on `ember-nn` (renamed or not) gives `::ember_nn`, else one on `ember`
//!   gives `::ember::nn`. Set it when the crates are re-exported under another path.
//!
//! Generic structs work: the derive adds `FieldType: ChildModules` (or `TensorField`)
//! bounds for the fields that use a type parameter, as serde's derives do.
//!
//! # Errors at compile time
//!
//! Each of these is refused where it is written: an enum (or a union),
//!
//! ```compile_fail
//! # use ember_nn::{Module, Result, Tensor};
//! #[derive(Debug, Module)]
//! enum Layer { A, B }
//! ```
//!
//! a tensor field that says neither `#[param]`, `#[buffer]` nor `#[module(skip)]`,
//!
//! ```compile_fail
//! # use ember_nn::{Module, Result, Tensor};
//! #[derive(Debug, Module)]
//! struct Scale { factor: Tensor }
//! # impl Module for Scale { fn forward(&self, x: &Tensor) -> Result<Tensor> { Ok(x.clone()) } }
//! ```
//!
//! a field that is neither a module nor plain data (mark it `#[module(skip)]`),
//!
//! ```compile_fail
//! # use ember_nn::{Module, Result, Tensor, layers::Linear};
//! #[derive(Debug)]
//! struct Config { width: usize }
//! #[derive(Debug, Module)]
//! struct Net { fc: Linear, config: Config }
//! # impl Module for Net { fn forward(&self, x: &Tensor) -> Result<Tensor> { Ok(x.clone()) } }
//! ```
//!
//! a plain or skipped field that is not `Clone` (the replica copies it),
//!
//! ```compile_fail
//! # use ember_nn::{Module, Result, Tensor, layers::Linear};
//! #[derive(Debug)]
//! struct Config { width: usize }
//! #[derive(Debug, Module)]
//! struct Net { fc: Linear, #[module(skip)] config: Config }
//! # impl Module for Net { fn forward(&self, x: &Tensor) -> Result<Tensor> { Ok(x.clone()) } }
//! ```
//!
//! and a struct that derives `Module` without implementing it (`forward`):
//!
//! ```compile_fail
//! # use ember_nn::{Module, layers::Linear};
//! #[derive(Debug, Module)]
//! struct Net { fc: Linear }
//! ```
//!
//! The same with the config skipped and `Clone` compiles, and so does a struct without a
//! replica:
//!
//! ```
//! # use ember_nn::{Module, Result, Tensor, layers::Linear};
//! #[derive(Clone, Debug)]
//! struct Config { width: usize }
//! #[derive(Debug, Module)]
//! struct Net { fc: Linear, #[module(skip)] config: Config }
//! # impl Module for Net { fn forward(&self, x: &Tensor) -> Result<Tensor> { Ok(x.clone()) } }
//!
//! #[derive(Debug)]
//! struct Log { file: std::fs::File }
//! #[derive(Debug, Module)]
//! #[module(no_replicate)]
//! struct Logged { fc: Linear, #[module(skip)] log: Log }
//! # impl Module for Logged { fn forward(&self, x: &Tensor) -> Result<Tensor> { Ok(x.clone()) } }
//! ```

#![warn(missing_docs)]

mod fields;

use proc_macro::TokenStream;
use proc_macro2::{Span, TokenStream as TokenStream2};
use quote::{ToTokens, format_ident, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{Data, DeriveInput, Expr, Ident, LitStr};

use fields::{Role, is_phantom, mentions_any, role};

/// Implements `ModuleParts` and `Replicate` for a struct: see the [crate docs](crate) for
/// what each field becomes and the attributes it reads (`#[param]`, `#[buffer]`,
/// `#[module(..)]`).
#[proc_macro_derive(Module, attributes(module, param, buffer))]
pub fn derive_module(input: TokenStream) -> TokenStream {
    let input = syn::parse_macro_input!(input as DeriveInput);
    expand(&input)
        .unwrap_or_else(syn::Error::into_compile_error)
        .into()
}

/// The struct-level options.
struct StructOptions {
    name: Option<Expr>,
    krate: Option<syn::Path>,
    /// `#[module(no_replicate)]`: no `Replicate` impl.
    no_replicate: bool,
    /// `#[module(no_display)]`: no `Display` impl (for a struct that has its own).
    no_display: bool,
}

fn expand(input: &DeriveInput) -> syn::Result<TokenStream2> {
    let fields = match &input.data {
        Data::Struct(s) => &s.fields,
        Data::Enum(e) => {
            return Err(syn::Error::new(
                e.enum_token.span,
                "#[derive(Module)] supports structs only: a module's parameters and children \
                 are its fields (hold the variants' layers in a struct, or implement \
                 `ModuleParts` by hand)",
            ));
        }
        Data::Union(u) => {
            return Err(syn::Error::new(
                u.union_token.span,
                "#[derive(Module)] supports structs only, not unions",
            ));
        }
    };
    let opts = struct_options(input)?;
    let krate = match opts.krate {
        Some(p) => p.into_token_stream(),
        None => default_crate(),
    };
    let rt = quote!(#krate::__derive);

    let type_params: Vec<Ident> = input
        .generics
        .type_params()
        .map(|p| p.ident.clone())
        .collect();

    let mut params = Vec::new();
    let mut buffers = Vec::new();
    let mut children = Vec::new();
    let mut training: Option<TokenStream2> = None;
    let mut hooks: Option<TokenStream2> = None;
    let mut bounds: Vec<TokenStream2> = Vec::new();
    // The replica's field initialisers and the bounds of its generic fields.
    let mut inits: Vec<TokenStream2> = Vec::new();
    let mut replica_bounds: Vec<TokenStream2> = Vec::new();
    // The boxed replica of a generic struct: its field initialisers, the bounds it adds to
    // `ModuleParts`, and whether every field that mentions a type parameter is a child
    // (Note [Boxed replicas of generic modules] in `ember-nn`).
    let mut dyn_inits: Vec<TokenStream2> = Vec::new();
    let mut dyn_bounds: Vec<TokenStream2> = Vec::new();
    let mut dyn_ok = true;

    for (i, field) in fields.iter().enumerate() {
        let (access, name) = match &field.ident {
            Some(id) => (quote!(#id), id.to_string()),
            None => {
                let index = syn::Index::from(i);
                (quote!(#index), i.to_string())
            }
        };
        let ty = &field.ty;
        // A `PhantomData<T>` holds no `T`: a replica makes a new one, with no bound on `T`.
        let phantom = is_phantom(ty);
        let generic = !phantom && mentions_any(ty.to_token_stream(), &type_params);
        let span = ty.span();
        let role = role(field)?;
        let (init, bound) = match role {
            Role::Ignored if phantom => (quote!(::std::marker::PhantomData), quote!()),
            Role::Param | Role::Buffer | Role::Child => (
                quote_spanned! {span=> #rt::Replicate::replicate_with(&self.#access, memo)? },
                quote!(#ty: #rt::Replicate),
            ),
            Role::Training | Role::Hooks => {
                (quote!(::std::clone::Clone::clone(&self.#access)), quote!())
            }
            Role::Ignored => (
                quote_spanned! {span=> #rt::ClonePlainField::clone_plain_field(&self.#access) },
                quote!(#ty: ::std::clone::Clone),
            ),
        };
        if generic && matches!(role, Role::Child) {
            dyn_inits.push(quote_spanned! {span=>
                #access: #rt::DynReplicate::dyn_replicate_with(&self.#access, memo)?
            });
            dyn_bounds.push(quote!(#ty: #rt::DynReplicate));
        } else {
            dyn_ok &= !generic;
            dyn_inits.push(quote!(#access: #init));
        }
        inits.push(quote!(#access: #init));
        if generic && !bound.is_empty() {
            replica_bounds.push(bound);
        }
        match role {
            r @ (Role::Param | Role::Buffer) => {
                let call = quote_spanned! {span=>
                    #rt::TensorField::collect_tensors(&self.#access, #name, &mut out);
                };
                if matches!(r, Role::Param) {
                    params.push(call);
                } else {
                    buffers.push(call);
                }
                if generic {
                    bounds.push(quote!(#ty: #rt::TensorField));
                }
            }
            Role::Child => {
                children.push(quote_spanned! {span=>
                    #rt::ChildModules::collect_children(&self.#access, #name, &mut out);
                });
                if generic {
                    bounds.push(quote!(#ty: #rt::ChildModules));
                }
            }
            Role::Training => {
                if training.is_some() {
                    return Err(syn::Error::new(
                        span,
                        "a module has one training flag: this is the second `TrainingFlag` field \
                         (mark extra ones #[module(skip)])",
                    ));
                }
                training = Some(quote!(&self.#access));
            }
            Role::Hooks => {
                if hooks.is_some() {
                    return Err(syn::Error::new(
                        span,
                        "a module has one hook storage: this is the second `ModuleHooks` field \
                         (mark extra ones #[module(skip)])",
                    ));
                }
                hooks = Some(quote!(&self.#access));
            }
            Role::Ignored => {}
        }
    }

    let ident = &input.ident;
    let name = match opts.name {
        Some(e) => e.into_token_stream(),
        None => LitStr::new(&ident.to_string(), ident.span()).into_token_stream(),
    };
    let (impl_generics, ty_generics, where_clause) = input.generics.split_for_impl();
    let mut predicates: Vec<TokenStream2> = where_clause
        .map(|w| w.predicates.iter().map(ToTokens::to_token_stream).collect())
        .unwrap_or_default();
    let mut replica_predicates = predicates.clone();
    replica_predicates.extend(replica_bounds);
    predicates.extend(bounds);
    // `as_module` returns `self` as a `&dyn Module`: the user's `impl Module` must exist.
    predicates.push(quote!(Self: #rt::Module));
    let replicate = !opts.no_replicate;
    // `replicate_boxed_with` lives in `ModuleParts`, a supertrait of the user's
    // `impl<M: Module> Module for S<M>`, so it may ask of `M` only what `Module` gives: not
    // `Replicate`. A struct whose type parameters appear in child fields alone copies those
    // through the children's boxed replicas (`DynReplicate`, which every module has: Note
    // [Boxed replicas of generic modules] in `ember-nn`); one with a type parameter in a
    // plain or tensor field, or with a lifetime, keeps the default (an error naming it) and
    // has its typed `replicate` only.
    let generic = input.generics.type_params().next().is_some();
    let boxed_replica = replicate && input.generics.lifetimes().next().is_none() && dyn_ok;
    if boxed_replica && generic {
        predicates.extend(dyn_bounds);
    }
    let where_tokens = quote!(where #(#predicates),*);

    let tensors_fn = |fn_name: Ident, calls: &[TokenStream2]| {
        if calls.is_empty() {
            quote!()
        } else {
            quote! {
                fn #fn_name(&self) -> ::std::vec::Vec<(&'static str, #rt::Tensor)> {
                    let mut out = ::std::vec::Vec::new();
                    #(#calls)*
                    out
                }
            }
        }
    };
    let params_fn = tensors_fn(format_ident!("local_parameters"), &params);
    let buffers_fn = tensors_fn(format_ident!("local_buffers"), &buffers);
    let children_fn = if children.is_empty() {
        quote!()
    } else {
        quote! {
            fn named_children(&self) -> ::std::vec::Vec<(::std::string::String, &dyn #rt::Module)> {
                let mut out = ::std::vec::Vec::new();
                #(#children)*
                out
            }
        }
    };
    let training_fn = training.map(|t| {
        quote! {
            fn training_flag(&self) -> ::std::option::Option<&#rt::TrainingFlag> {
                ::std::option::Option::Some(#t)
            }
        }
    });
    let hooks_fn = hooks.map(|h| {
        quote! {
            fn hooks(&self) -> ::std::option::Option<&#rt::ModuleHooks> {
                ::std::option::Option::Some(#h)
            }
        }
    });

    let replicate_fn = boxed_replica.then(|| {
        let replica = if generic {
            quote!(Self { #(#dyn_inits),* })
        } else {
            quote!(<Self as #rt::Replicate>::replicate_with(self, memo)?)
        };
        quote! {
            #[allow(unused_variables)]
            fn replicate_boxed_with(
                &self,
                memo: &mut #rt::ReplicaMemo,
            ) -> #rt::Result<::std::boxed::Box<dyn #rt::Module>> {
                ::std::result::Result::Ok(::std::boxed::Box::new(#replica))
            }
        }
    });
    let replicate_impl = replicate.then(|| {
        let replica_where = quote!(where #(#replica_predicates),*);
        quote! {
            #[automatically_derived]
            impl #impl_generics #rt::Replicate for #ident #ty_generics #replica_where {
                #[allow(unused_variables)]
                fn replicate_with(&self, memo: &mut #rt::ReplicaMemo) -> #rt::Result<Self> {
                    ::std::result::Result::Ok(Self { #(#inits),* })
                }
            }
        }
    });

    let display_impl = (!opts.no_display).then(|| {
        quote! {
            #[automatically_derived]
            impl #impl_generics ::std::fmt::Display for #ident #ty_generics #where_tokens {
                fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                    f.write_str(&#rt::Module::describe(self))
                }
            }
        }
    });

    Ok(quote! {
        #replicate_impl

        #display_impl

        #[automatically_derived]
        impl #impl_generics #rt::ModuleParts for #ident #ty_generics #where_tokens {
            fn name(&self) -> &'static str {
                #name
            }
            fn as_module(&self) -> &dyn #rt::Module {
                self
            }
            #params_fn
            #buffers_fn
            #children_fn
            #training_fn
            #hooks_fn
            #replicate_fn
        }
    })
}

/// Reads `#[module(name = .., crate = ..)]` on the struct.
fn struct_options(input: &DeriveInput) -> syn::Result<StructOptions> {
    let mut opts = StructOptions {
        name: None,
        krate: None,
        no_replicate: false,
        no_display: false,
    };
    for attr in &input.attrs {
        if attr.path().is_ident("param") || attr.path().is_ident("buffer") {
            return Err(syn::Error::new(
                attr.span(),
                "#[param] and #[buffer] go on fields, not on the struct",
            ));
        }
        if !attr.path().is_ident("module") {
            continue;
        }
        attr.parse_nested_meta(|meta| {
            if meta.path.is_ident("name") {
                opts.name = Some(meta.value()?.parse::<Expr>()?);
                Ok(())
            } else if meta.path.is_ident("crate") {
                let value = meta.value()?;
                let path = if value.peek(LitStr) {
                    value.parse::<LitStr>()?.parse::<syn::Path>()?
                } else {
                    syn::Path::parse_mod_style(value)?
                };
                opts.krate = Some(path);
                Ok(())
            } else if meta.path.is_ident("no_replicate") {
                opts.no_replicate = true;
                Ok(())
            } else if meta.path.is_ident("no_display") {
                opts.no_display = true;
                Ok(())
            } else if meta.path.is_ident("skip") {
                Err(meta.error("#[module(skip)] goes on a field, not on the struct"))
            } else {
                Err(meta.error(
                    "unknown #[module(..)] option on a struct: expected `name = ..`, \
                     `crate = ..`, `no_replicate` or `no_display`",
                ))
            }
        })?;
    }
    Ok(opts)
}

/// `::ember_nn` or `::ember::nn`, whichever the calling package depends on (renames
/// included); `::ember_nn` inside `ember-nn` itself, which names itself so with
/// `extern crate self as ember_nn`.
fn default_crate() -> TokenStream2 {
    use proc_macro_crate::{FoundCrate, crate_name};
    match crate_name("ember-nn") {
        Ok(FoundCrate::Itself) => quote!(::ember_nn),
        Ok(FoundCrate::Name(n)) => {
            let id = Ident::new(&n, Span::call_site());
            quote!(::#id)
        }
        Err(_) => match crate_name("ember") {
            Ok(FoundCrate::Name(n)) => {
                let id = Ident::new(&n, Span::call_site());
                quote!(::#id::nn)
            }
            Ok(FoundCrate::Itself) => quote!(crate::nn),
            Err(_) => quote!(::ember_nn),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(input: DeriveInput) -> String {
        match expand(&input) {
            Ok(_) => panic!("expected an error"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn enums_unions_and_unmarked_tensors_are_refused_with_a_reason() {
        let e = error(syn::parse_quote! { enum Layer { A, B } });
        assert!(e.contains("supports structs only"), "{e}");
        let e = error(syn::parse_quote! { union U { a: u32 } });
        assert!(e.contains("not unions"), "{e}");
        let e = error(syn::parse_quote! { struct S { t: ember::Tensor } });
        assert!(e.contains("#[param]"), "{e}");
        let e = error(syn::parse_quote! { struct S { t: Option<Tensor> } });
        assert!(e.contains("#[buffer]"), "{e}");
        let e = error(syn::parse_quote! { struct S { #[param] #[buffer] t: Tensor } });
        assert!(e.contains("not several"), "{e}");
        let e = error(syn::parse_quote! { struct S { #[module(name = "x")] t: Tensor } });
        assert!(e.contains("on the struct"), "{e}");
        let e = error(syn::parse_quote! { #[module(bogus)] struct S; });
        assert!(e.contains("unknown #[module(..)] option"), "{e}");
        let e = error(syn::parse_quote! { struct S { a: TrainingFlag, b: TrainingFlag } });
        assert!(e.contains("one training flag"), "{e}");
    }

    #[test]
    fn fields_are_sorted_into_parameters_buffers_children_and_plain_data() {
        let input: DeriveInput = syn::parse_quote! {
            #[module(name = "Net", crate = ::ember::nn)]
            struct S<M: Module> {
                #[param] w: Tensor,
                #[buffer] b: Option<Tensor>,
                inner: M,
                layers: Vec<Linear>,
                #[module(skip)] cfg: Config,
                width: usize,
                dims: Vec<(usize, f64)>,
                device: Device,
                training: TrainingFlag,
                hooks: ModuleHooks,
            }
        };
        let out = expand(&input).unwrap_or_else(|e| panic!("{e}")).to_string();
        for want in [
            "impl < M : Module > :: ember :: nn :: __derive :: ModuleParts for S < M >",
            "M : :: ember :: nn :: __derive :: ChildModules",
            "\"Net\"",
            "collect_tensors (& self . w , \"w\"",
            "collect_tensors (& self . b , \"b\"",
            "collect_children (& self . inner , \"inner\"",
            "collect_children (& self . layers , \"layers\"",
            "Some (& self . training)",
            "Some (& self . hooks)",
            "Self : :: ember :: nn :: __derive :: Module",
            // The replica: new tensors and children, clones of the rest.
            "impl < M : Module > :: ember :: nn :: __derive :: Replicate for S < M >",
            "where M : :: ember :: nn :: __derive :: Replicate",
            "w : :: ember :: nn :: __derive :: Replicate :: replicate_with (& self . w , memo) ?",
            "inner : :: ember :: nn :: __derive :: Replicate :: replicate_with (& self . inner , memo) ?",
            "cfg : :: ember :: nn :: __derive :: ClonePlainField :: clone_plain_field (& self . cfg)",
            "hooks : :: std :: clone :: Clone :: clone (& self . hooks)",
        ] {
            assert!(out.contains(want), "missing `{want}` in {out}");
        }
        for field in ["cfg", "width", "dims", "device"] {
            for registered in ["collect_tensors", "collect_children"] {
                let absent = format!("{registered} (& self . {field}");
                assert!(!out.contains(&absent), "`{absent}` registered in {out}");
            }
        }
    }

    #[test]
    fn no_replicate_leaves_out_the_replica_and_generic_plain_fields_ask_for_clone() {
        let input: DeriveInput = syn::parse_quote! {
            #[module(no_replicate)]
            struct S { fc: Linear, #[module(skip)] log: File }
        };
        let out = expand(&input).unwrap_or_else(|e| panic!("{e}")).to_string();
        assert!(!out.contains("Replicate"), "{out}");
        let input: DeriveInput = syn::parse_quote! { struct S { fc: Linear } };
        let out = expand(&input).unwrap_or_else(|e| panic!("{e}")).to_string();
        assert!(out.contains("fn replicate_boxed_with"), "{out}");
        let input: DeriveInput = syn::parse_quote! {
            struct T<C> (Linear, #[module(skip)] C);
        };
        let out = expand(&input).unwrap_or_else(|e| panic!("{e}")).to_string();
        assert!(!out.contains("fn replicate_boxed_with"), "{out}");
        // Type parameters in child fields alone: a boxed replica through `DynReplicate`.
        let input: DeriveInput = syn::parse_quote! {
            struct R<M: Module> { inner: M, more: Vec<M>, #[module(skip)] k: f64 }
        };
        let generic = expand(&input).unwrap_or_else(|e| panic!("{e}")).to_string();
        for want in [
            "fn replicate_boxed_with",
            "M : :: ember_nn :: __derive :: DynReplicate",
            "Vec < M > : :: ember_nn :: __derive :: DynReplicate",
            "inner : :: ember_nn :: __derive :: DynReplicate :: dyn_replicate_with (& self . inner , memo) ?",
        ] {
            assert!(generic.contains(want), "missing `{want}` in {generic}");
        }
        for want in [
            "C : :: std :: clone :: Clone",
            "Self { 0 : :: ember_nn",
            "1 : :: ember_nn :: __derive :: ClonePlainField :: clone_plain_field (& self . 1)",
        ] {
            assert!(out.contains(want), "missing `{want}` in {out}");
        }
        let e = error(syn::parse_quote! { struct S { #[module(no_replicate)] a: Linear } });
        assert!(e.contains("go on the struct"), "{e}");
    }
}
