//! On any error: the errors, and a stub impl so that code using the type (`<T as KvLayout>`,
//! `assert_bytes_per_token!`) does not add a cascade of "trait not implemented" errors.

use proc_macro2::TokenStream;
use quote::quote;
use syn::{DeriveInput, Error, Path};

/// The errors plus a stub `KvLayout` impl (no sections, zero bytes).
pub fn expand(input: &DeriveInput, krate: &Path, error: &Error) -> TokenStream {
    let ident = &input.ident;
    let name = ident.to_string();
    let (impl_generics, ty_generics, where_clause) = input.generics.split_for_impl();
    let error = error.to_compile_error();
    quote! {
        #error

        #[doc(hidden)]
        const _: () = {
            #[automatically_derived]
            impl #impl_generics #krate::__private::Sealed for #ident #ty_generics #where_clause {}

            #[automatically_derived]
            impl #impl_generics #krate::KvLayout for #ident #ty_generics #where_clause {
                const NAME: &'static str = #name;
                const LAYOUT: #krate::TokenLayout =
                    #krate::TokenLayout::new(#krate::Arrangement::TokenMajor, &[]);
                const BYTES_PER_TOKEN: u64 = 0;
                const FINGERPRINT: u64 = 0;
            }
        };
    }
}
