//! How a field reads: its [`Role`] from its attributes and type, and the type tests
//! behind it (plain data, a mention of `Tensor` or of a type parameter).

use proc_macro2::{Span, TokenStream as TokenStream2, TokenTree};
use quote::ToTokens;
use syn::spanned::Spanned;
use syn::{GenericArgument, Ident, PathArguments, Type};

/// What a field is to the module.
pub(crate) enum Role {
    Param,
    Buffer,
    Child,
    Training,
    Hooks,
    Ignored,
}

/// What a field's attributes and type make it.
pub(crate) fn role(field: &syn::Field) -> syn::Result<Role> {
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
                } else if ["name", "crate", "no_replicate"]
                    .iter()
                    .any(|o| meta.path.is_ident(o))
                {
                    Err(meta.error(
                        "`name`, `crate` and `no_replicate` go on the struct's #[module(..)]",
                    ))
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

/// Whether the type is `PhantomData<..>` (a marker that holds nothing: a replica makes a new
/// one, whatever type parameter it names).
pub(crate) fn is_phantom(ty: &Type) -> bool {
    matches!(ty, Type::Path(p) if p.qself.is_none()
        && p.path.segments.last().is_some_and(|s| s.ident == "PhantomData"))
}

/// Whether the type's tokens name one of the struct's type parameters.
pub(crate) fn mentions_any(tokens: TokenStream2, params: &[Ident]) -> bool {
    !params.is_empty()
        && tokens.into_iter().any(|t| match t {
            TokenTree::Ident(i) => params.contains(&i),
            TokenTree::Group(g) => mentions_any(g.stream(), params),
            _ => false,
        })
}
