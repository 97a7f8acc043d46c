//! The parsed input: a struct with named fields, each an (optionally nested) array of an
//! element type, with its `#[kv(...)]` attributes.

use syn::{Data, DeriveInput, Error, Expr, Fields, Ident, Lit, Type};

use crate::attr::{self, ContainerAttrs, FieldAttrs};

/// Errors collected while parsing and validating, reported all at once.
#[derive(Default)]
pub struct Errors {
    combined: Option<Error>,
}

impl Errors {
    /// Adds one error.
    pub fn push(&mut self, error: Error) {
        match &mut self.combined {
            Some(all) => all.combine(error),
            None => self.combined = Some(error),
        }
    }

    /// The combined error, if any was pushed.
    pub fn finish(self) -> Option<Error> {
        self.combined
    }
}

/// The derive input, parsed.
pub struct Input<'a> {
    /// The struct's name.
    pub ident: &'a Ident,
    /// Struct-level attributes.
    pub attrs: ContainerAttrs,
    /// The fields in declaration order: the sections in byte order.
    pub fields: Vec<Field<'a>>,
}

/// One field: one section.
pub struct Field<'a> {
    /// The field name (the section label, `r#` stripped).
    pub ident: &'a Ident,
    /// The label as text.
    pub name: String,
    /// The whole field type, for spans.
    pub ty: &'a Type,
    /// The element type under all array levels.
    pub elem: &'a Type,
    /// Array lengths, outermost first: the per-token shape.
    pub dims: Vec<&'a Expr>,
    /// Field attributes.
    pub attrs: FieldAttrs,
}

impl<'a> Input<'a> {
    /// Parses `input`; every problem found goes to `errors` (the result is then only good for
    /// more validation, not for expansion).
    pub fn from_syn(input: &'a DeriveInput, errors: &mut Errors) -> Input<'a> {
        let attrs = attr::container(&input.attrs, errors);
        if !input.generics.params.is_empty() {
            errors.push(Error::new_spanned(
                &input.generics,
                "#[derive(KvLayout)] does not take generic parameters: a layout is one concrete token row",
            ));
        }
        let mut fields = Vec::new();
        match &input.data {
            Data::Struct(data) => match &data.fields {
                Fields::Named(named) => {
                    for field in &named.named {
                        if let Some(f) = Field::from_syn(field, errors) {
                            fields.push(f);
                        }
                    }
                    if named.named.is_empty() {
                        errors.push(empty(input));
                    }
                }
                Fields::Unnamed(unnamed) => errors.push(Error::new_spanned(
                    unnamed,
                    "#[derive(KvLayout)] needs named fields (the field names are the section names): write `struct Name { values: [T; N], .. }`",
                )),
                Fields::Unit => errors.push(empty(input)),
            },
            Data::Enum(data) => errors.push(Error::new_spanned(
                data.enum_token,
                "#[derive(KvLayout)] applies to a struct with named fields, not an enum",
            )),
            Data::Union(data) => errors.push(Error::new_spanned(
                data.union_token,
                "#[derive(KvLayout)] applies to a struct with named fields, not a union",
            )),
        }
        Input {
            ident: &input.ident,
            attrs,
            fields,
        }
    }

    /// The index of the field named `name`.
    pub fn position(&self, name: &Ident) -> Option<usize> {
        let name = unraw(name);
        self.fields.iter().position(|f| f.name == name)
    }
}

/// The error for a struct without fields.
fn empty(input: &DeriveInput) -> Error {
    Error::new_spanned(
        &input.ident,
        format!(
            "`{}` has no fields: a token layout needs at least one section (a field such as `values: [F8E4M3; 128]`)",
            input.ident
        ),
    )
}

impl<'a> Field<'a> {
    fn from_syn(field: &'a syn::Field, errors: &mut Errors) -> Option<Field<'a>> {
        let ident = field.ident.as_ref()?;
        let attrs = attr::field(&field.attrs, errors);
        let mut dims = Vec::new();
        let mut ty = &field.ty;
        loop {
            match ty {
                Type::Array(array) => {
                    dims.push(&array.len);
                    ty = &array.elem;
                }
                Type::Paren(paren) => ty = &paren.elem,
                Type::Group(group) => ty = &group.elem,
                _ => break,
            }
        }
        if dims.is_empty() {
            errors.push(Error::new_spanned(
                &field.ty,
                format!(
                    "field `{ident}` must be an array of elements, `[T; N]` or nested `[[T; N]; M]` (write `[{}; 1]` for a single element)",
                    quote::ToTokens::to_token_stream(&field.ty)
                ),
            ));
            return None;
        }
        Some(Field {
            ident,
            name: unraw(ident),
            ty: &field.ty,
            elem: ty,
            dims,
            attrs,
        })
    }

    /// The dimensions, when every one is an integer literal.
    pub fn literal_dims(&self) -> Option<Vec<u64>> {
        self.dims.iter().map(|d| literal_u64(d)).collect()
    }

    /// The element count, when every dimension is an integer literal (`None` on overflow too:
    /// the const evaluation reports it).
    pub fn literal_elems(&self) -> Option<u64> {
        self.literal_dims()?
            .into_iter()
            .try_fold(1u64, u64::checked_mul)
    }

    /// The element type's last path segment, as spelled (`F4E2M1` for `kvlayout::F4E2M1`).
    pub fn elem_name(&self) -> Option<String> {
        match self.elem {
            Type::Path(p) if p.qself.is_none() => {
                p.path.segments.last().map(|s| s.ident.to_string())
            }
            _ => None,
        }
    }
}

/// An integer literal's value (through parentheses and invisible groups).
pub fn literal_u64(expr: &Expr) -> Option<u64> {
    match expr {
        Expr::Lit(lit) => match &lit.lit {
            Lit::Int(int) => int.base10_parse().ok(),
            _ => None,
        },
        Expr::Paren(p) => literal_u64(&p.expr),
        Expr::Group(g) => literal_u64(&g.expr),
        _ => None,
    }
}

/// The identifier as text without `r#`.
pub fn unraw(ident: &Ident) -> String {
    let s = ident.to_string();
    s.strip_prefix("r#")
        .map_or_else(|| s.clone(), str::to_owned)
}
