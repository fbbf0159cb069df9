//! `#[derive(Module)]`: PyTorch's attribute registration for Ember models.
//!
//! In PyTorch, assigning a module or an `nn.Parameter` to an attribute in `__init__`
//! registers it, so `parameters()`, `state_dict()`, `to(device)` and the optimizer see it.
//! In Ember a model is a struct, and this derive does the registering: it reads the struct's
//! fields and implements `ember_nn::ModuleParts` — the part of a module that says what it is made
//! of. You write only `Module::forward`:
//!
//! ```
//! use ember_nn::layers::{Dropout, Linear, ReLU, Sequential};
//! use ember_nn::{Module, ModuleHooks, Result, Tensor, TrainingFlag};
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
//!     cache: Vec<Linear>,          // not registered
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
//!     cache: Vec::new(),
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
//! assert!(net.state_dict().contains_key("steps"));
//! let y = net.call(&Tensor::randn([3, 4], ())?)?;
//! assert_eq!(y.dims(), [3, 2]);
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
//!   `nn.Module.__setattr__` records in PyTorch.
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
//! # Attributes on the struct
//!
//! - `#[module(name = "Net")]`: the name `describe()` prints (default: the struct's name).
//!   Any `&'static str` expression works, with `self` in scope:
//!   `#[module(name = self.kind)]`.
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
//! and a struct that derives `Module` without implementing it (`forward`):
//!
//! ```compile_fail
//! # use ember_nn::{Module, layers::Linear};
//! #[derive(Debug, Module)]
//! struct Net { fc: Linear }
//! ```
//!
//! The same with the config skipped compiles:
//!
//! ```
//! # use ember_nn::{Module, Result, Tensor, layers::Linear};
//! #[derive(Debug)]
//! struct Config { width: usize }
//! #[derive(Debug, Module)]
//! struct Net { fc: Linear, #[module(skip)] config: Config }
//! # impl Module for Net { fn forward(&self, x: &Tensor) -> Result<Tensor> { Ok(x.clone()) } }
//! ```

#![warn(missing_docs)]

use proc_macro::TokenStream;
use proc_macro2::{Span, TokenStream as TokenStream2, TokenTree};
use quote::{ToTokens, format_ident, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{Data, DeriveInput, Expr, GenericArgument, Ident, LitStr, PathArguments, Type};

/// Implements `ModuleParts` for a struct: see the [crate docs](crate) for what each field
/// becomes and the attributes it reads (`#[param]`, `#[buffer]`, `#[module(..)]`).
#[proc_macro_derive(Module, attributes(module, param, buffer))]
pub fn derive_module(input: TokenStream) -> TokenStream {
    let input = syn::parse_macro_input!(input as DeriveInput);
    expand(&input)
        .unwrap_or_else(syn::Error::into_compile_error)
        .into()
}

/// What a field is to the module.
enum Role {
    Param,
    Buffer,
    Child,
    Training,
    Hooks,
    Ignored,
}

/// The struct-level options.
struct StructOptions {
    name: Option<Expr>,
    krate: Option<syn::Path>,
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

    for (i, field) in fields.iter().enumerate() {
        let (access, name) = match &field.ident {
            Some(id) => (quote!(#id), id.to_string()),
            None => {
                let index = syn::Index::from(i);
                (quote!(#index), i.to_string())
            }
        };
        let ty = &field.ty;
        let generic = mentions_any(ty.to_token_stream(), &type_params);
        let span = ty.span();
        match role(field)? {
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
    predicates.extend(bounds);
    // `as_module` returns `self` as a `&dyn Module`: the user's `impl Module` must exist.
    predicates.push(quote!(Self: #rt::Module));
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

    Ok(quote! {
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
        }
    })
}

/// Reads `#[module(name = .., crate = ..)]` on the struct.
fn struct_options(input: &DeriveInput) -> syn::Result<StructOptions> {
    let mut opts = StructOptions {
        name: None,
        krate: None,
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
            } else if meta.path.is_ident("skip") {
                Err(meta.error("#[module(skip)] goes on a field, not on the struct"))
            } else {
                Err(meta.error(
                    "unknown #[module(..)] option on a struct: expected `name = ..` or `crate = ..`",
                ))
            }
        })?;
    }
    Ok(opts)
}

/// What a field's attributes and type make it.
fn role(field: &syn::Field) -> syn::Result<Role> {
    let mut chosen: Option<(Role, Span)> = None;
    let mut choose = |r: Role, span: Span| -> syn::Result<()> {
        if let Some((_, first)) = &chosen {
            let mut e = syn::Error::new(
                span,
                "a field is one of #[param], #[buffer] or #[module(skip)], not several",
            );
            e.combine(syn::Error::new(*first, "first marked here"));
            return Err(e);
        }
        chosen = Some((r, span));
        Ok(())
    };
    for attr in &field.attrs {
        let path = attr.path();
        if path.is_ident("param") || path.is_ident("buffer") {
            attr.meta.require_path_only()?;
            let r = if path.is_ident("param") {
                Role::Param
            } else {
                Role::Buffer
            };
            choose(r, attr.span())?;
        } else if path.is_ident("module") {
            let mut skip = false;
            attr.parse_nested_meta(|meta| {
                if meta.path.is_ident("skip") {
                    skip = true;
                    Ok(())
                } else if meta.path.is_ident("name") || meta.path.is_ident("crate") {
                    Err(meta.error("`name` and `crate` go on the struct's #[module(..)]"))
                } else {
                    Err(meta.error("unknown #[module(..)] option on a field: expected `skip`"))
                }
            })?;
            if skip {
                choose(Role::Ignored, attr.span())?;
            }
        }
    }
    if let Some((r, _)) = chosen {
        return Ok(r);
    }
    let ty = &field.ty;
    match last_ident(ty).as_deref() {
        Some("TrainingFlag") => return Ok(Role::Training),
        Some("ModuleHooks") => return Ok(Role::Hooks),
        _ => {}
    }
    if is_plain_data(ty) {
        return Ok(Role::Ignored);
    }
    if mentions_tensor(ty.to_token_stream()) {
        return Err(syn::Error::new(
            ty.span(),
            "a tensor field must say what it is: #[param] (trained, in parameters() and \
             state_dict()), #[buffer] (in state_dict(), not trained) or #[module(skip)] \
             (not registered)",
        ));
    }
    Ok(Role::Child)
}

/// The last path segment's name (`Tensor` of `ember::Tensor`).
fn last_ident(ty: &Type) -> Option<String> {
    match ty {
        Type::Path(p) if p.qself.is_none() => p.path.segments.last().map(|s| s.ident.to_string()),
        Type::Group(g) => last_ident(&g.elem),
        Type::Paren(p) => last_ident(&p.elem),
        _ => None,
    }
}

/// Types that hold no parameters and are ignored without an attribute: numbers, `bool`,
/// `char`, strings, `Device`, `DType`, `PhantomData`, and `Option`/`Vec`/`Box`/arrays/
/// slices/tuples/references of those.
fn is_plain_data(ty: &Type) -> bool {
    match ty {
        Type::Path(p) if p.qself.is_none() => {
            let Some(seg) = p.path.segments.last() else {
                return false;
            };
            let name = seg.ident.to_string();
            match &seg.arguments {
                PathArguments::None => matches!(
                    name.as_str(),
                    "bool"
                        | "char"
                        | "u8"
                        | "u16"
                        | "u32"
                        | "u64"
                        | "u128"
                        | "usize"
                        | "i8"
                        | "i16"
                        | "i32"
                        | "i64"
                        | "i128"
                        | "isize"
                        | "f32"
                        | "f64"
                        | "String"
                        | "str"
                        | "Device"
                        | "DType"
                        | "Duration"
                        | "PathBuf"
                ),
                PathArguments::AngleBracketed(args) => {
                    if name == "PhantomData" {
                        return true;
                    }
                    matches!(name.as_str(), "Option" | "Vec" | "Box" | "VecDeque")
                        && args.args.iter().all(|a| match a {
                            GenericArgument::Type(t) => is_plain_data(t),
                            _ => false,
                        })
                }
                PathArguments::Parenthesized(_) => false,
            }
        }
        Type::Tuple(t) => t.elems.iter().all(is_plain_data),
        Type::Array(a) => is_plain_data(&a.elem),
        Type::Slice(s) => is_plain_data(&s.elem),
        Type::Reference(r) => is_plain_data(&r.elem),
        Type::Group(g) => is_plain_data(&g.elem),
        Type::Paren(p) => is_plain_data(&p.elem),
        _ => false,
    }
}

/// Whether the type's tokens name `Tensor` anywhere (`Tensor`, `Option<Tensor>`,
/// `Vec<ember::Tensor>`).
fn mentions_tensor(tokens: TokenStream2) -> bool {
    tokens.into_iter().any(|t| match t {
        TokenTree::Ident(i) => i == "Tensor",
        TokenTree::Group(g) => mentions_tensor(g.stream()),
        _ => false,
    })
}

/// Whether the type's tokens name one of the struct's type parameters.
fn mentions_any(tokens: TokenStream2, params: &[Ident]) -> bool {
    !params.is_empty()
        && tokens.into_iter().any(|t| match t {
            TokenTree::Ident(i) => params.contains(&i),
            TokenTree::Group(g) => mentions_any(g.stream(), params),
            _ => false,
        })
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
        ] {
            assert!(out.contains(want), "missing `{want}` in {out}");
        }
        for absent in ["self . cfg", "self . width", "self . dims", "self . device"] {
            assert!(!out.contains(absent), "`{absent}` registered in {out}");
        }
    }
}
