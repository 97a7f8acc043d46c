//! Generation: the `KvLayout` impl (and the sealed marker) of a validated input, wrapped in
//! `const _: () = { ... };`, plus a forced evaluation of `BYTES_PER_TOKEN` so that a layout
//! broken in a way only the type system knows (a constant length, an element type alias)
//! fails to compile even if nothing uses it.

use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{DeriveInput, Expr, LitInt, Path, parse_quote};

use crate::ast::{Errors, Field, Input, literal_u64};
use crate::attr::ArrangementKind;
use crate::{fallback, valid};

/// The whole derive: parse, validate, then expand or fall back.
pub fn derive(input: &DeriveInput) -> TokenStream {
    let mut errors = Errors::default();
    let parsed = Input::from_syn(input, &mut errors);
    valid::validate(&parsed, &mut errors);
    let krate: Path = parsed
        .attrs
        .krate
        .clone()
        .unwrap_or_else(|| parse_quote!(::kvlayout));
    match errors.finish() {
        Some(error) => fallback::expand(input, &krate, &error),
        None => impl_layout(&parsed, &krate),
    }
}

/// `expr` as a `u64` constant expression: an integer literal re-typed as `u64`, anything else
/// cast (array lengths are `usize`).
fn as_u64(expr: &Expr) -> TokenStream {
    match literal_u64(expr) {
        Some(value) => {
            let lit = LitInt::new(&format!("{value}u64"), expr.span());
            quote!(#lit)
        }
        None => quote_spanned!(expr.span()=> ((#expr) as u64)),
    }
}

/// An attribute's number (`block`, `page_stride_bytes`, `page_align_bytes`) as a `u64`
/// constant expression: an integer literal re-typed as `u64`; anything else must already be a
/// `u64` (a float, a bool or a `u128` is a type error at the attribute, never truncated by a
/// cast).
fn attr_u64(expr: &Expr, krate: &Path) -> TokenStream {
    match literal_u64(expr) {
        Some(_) => as_u64(expr),
        None => quote_spanned!(expr.span()=> #krate::__private::attr_u64(#expr)),
    }
}

/// One `Section` constructor.
fn section(input: &Input, field: &Field, krate: &Path) -> TokenStream {
    let label = &field.name;
    let elem = field.elem;
    let dtype = quote_spanned!(elem.span()=> <#elem as #krate::Element>::DTYPE);
    let dims = field.dims.iter().map(|d| as_u64(d));
    let shape = quote!(&[#(#dims),*]);
    match (&field.attrs.scales, &field.attrs.block) {
        (Some(target), Some(block)) => {
            let target = input
                .position(target)
                .expect("validated: the scale target exists");
            let block = attr_u64(block, krate);
            quote!(#krate::Section::scale_of(#label, #dtype, #shape, #target, #block))
        }
        _ => quote!(#krate::Section::new(#label, #dtype, #shape)),
    }
}

fn impl_layout(input: &Input, krate: &Path) -> TokenStream {
    let ident = input.ident;
    let name = ident.to_string();
    let sections = input.fields.iter().map(|f| section(input, f, krate));
    let attrs = &input.attrs;
    let (planes_item, arrangement) = match &attrs.planes {
        Some(planes) => {
            let groups = planes.groups.iter().map(|(_, names)| {
                let indices = names
                    .iter()
                    .map(|n| input.position(n).expect("validated: plane names a field"));
                quote!(#krate::Cow::Borrowed(&[#(#indices),*]))
            });
            (
                quote! {
                    const __PLANES: &[#krate::Cow<'static, [usize]>] = &[#(#groups),*];
                },
                quote!(#krate::Arrangement::Planes(#krate::Cow::Borrowed(__PLANES))),
            )
        }
        None => {
            let variant = match attrs.arrangement.as_ref().map(|(kind, _)| *kind) {
                None | Some(ArrangementKind::Token) => quote!(TokenMajor),
                Some(ArrangementKind::Section) => quote!(SectionMajor),
                Some(ArrangementKind::Head) => quote!(HeadMajor),
            };
            (TokenStream::new(), quote!(#krate::Arrangement::#variant))
        }
    };
    let option = |expr: &Option<Expr>| match expr {
        Some(e) => {
            let v = attr_u64(e, krate);
            quote!(::core::option::Option::Some(#v))
        }
        None => quote!(::core::option::Option::None),
    };
    let align = option(&attrs.page_align_bytes);
    let stride = option(&attrs.page_stride_bytes);
    // Spanned at the struct name: a layout that fails const evaluation is reported there.
    let force = quote_spanned! {ident.span()=>
        const _: () = {
            let _: u64 = <#ident as #krate::KvLayout>::BYTES_PER_TOKEN;
        };
    };
    // A descriptor struct is never built: its fields exist to be read by the macro. Reading
    // them here keeps `dead_code` quiet about "fields never read".
    let field_idents = input.fields.iter().map(|f| f.ident);
    let read_fields = quote! {
        const _: fn(&#ident) = |row| {
            let _ = (#(&row.#field_idents,)*);
        };
    };
    let span = Span::call_site();
    quote_spanned! {span=>
        #[doc(hidden)]
        #[allow(non_upper_case_globals, unused_qualifications, clippy::all)]
        const _: () = {
            const __SECTIONS: &[#krate::Section] = &[#(#sections),*];
            #planes_item
            const __LAYOUT: #krate::TokenLayout = #krate::TokenLayout {
                arrangement: #arrangement,
                sections: #krate::Cow::Borrowed(__SECTIONS),
                page_align_bytes: #align,
                page_stride_bytes: #stride,
            };

            #[automatically_derived]
            impl #krate::__private::Sealed for #ident {}

            #[automatically_derived]
            impl #krate::KvLayout for #ident {
                const NAME: &'static str = #name;
                const LAYOUT: #krate::TokenLayout = __LAYOUT;
                const BYTES_PER_TOKEN: u64 = #krate::__private::bytes_per_token_or_panic(&__LAYOUT);
                const FINGERPRINT: u64 = __LAYOUT.fingerprint();
            }

            #force

            #read_fields
        };
    }
}
