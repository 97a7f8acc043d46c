//! The `#[kv(...)]` attributes: on the struct (arrangement, planes, alignment, stride, crate
//! path) and on a field (the scale relation).

use proc_macro2::Span;
use syn::meta::ParseNestedMeta;
use syn::parse::Parse;
use syn::{Attribute, Error, Expr, Ident, LitStr, Path, Token, bracketed, token};

use crate::ast::Errors;

/// A named arrangement (`#[kv(arrangement = "...")]`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArrangementKind {
    /// `token_major`.
    Token,
    /// `section_major`.
    Section,
    /// `head_major`.
    Head,
}

/// The accepted `arrangement` values, for the error message.
const ARRANGEMENTS: &str = "\"token_major\", \"section_major\" or \"head_major\"";

/// `#[kv(planes = [[a, b], [c]])]`: groups of field names.
pub struct Planes {
    /// The `planes` key, for errors about the whole list.
    pub key: Path,
    /// Each plane: its brackets' span and its field names.
    pub groups: Vec<(Span, Vec<Ident>)>,
}

/// Attributes of the struct.
#[derive(Default)]
pub struct ContainerAttrs {
    /// `arrangement = "..."` and the literal, for spans.
    pub arrangement: Option<(ArrangementKind, LitStr)>,
    /// `planes = [[...], ...]`.
    pub planes: Option<Planes>,
    /// `page_align_bytes = N`.
    pub page_align_bytes: Option<Expr>,
    /// `page_stride_bytes = N`.
    pub page_stride_bytes: Option<Expr>,
    /// `crate = path`.
    pub krate: Option<Path>,
}

/// Attributes of a field.
#[derive(Default)]
pub struct FieldAttrs {
    /// `scales = field`: this field holds the scales of `field`.
    pub scales: Option<Ident>,
    /// `block_elems = N`: elements of the scaled field per scale.
    pub block: Option<Expr>,
    /// The `block` key, for errors about a `block` without `scales`.
    pub block_key: Option<Path>,
    /// An attribute of this field failed to parse (its error is reported; the scale rules are
    /// not checked on a half-parsed relation, to avoid a cascade).
    pub failed: bool,
}

/// An error for a key given twice.
fn duplicate(meta: &ParseNestedMeta) -> Error {
    let key = meta
        .path
        .get_ident()
        .map_or_else(String::new, ToString::to_string);
    Error::new_spanned(&meta.path, format!("duplicate `kv({key})` attribute"))
}

/// Parses every `#[kv(...)]` on the struct, pushing each error to `errors`.
pub fn container(attrs: &[Attribute], errors: &mut Errors) -> ContainerAttrs {
    let mut out = ContainerAttrs::default();
    for attr in attrs.iter().filter(|a| a.path().is_ident("kv")) {
        let result = attr.parse_nested_meta(|meta| {
            if meta.path.is_ident("arrangement") {
                if out.arrangement.is_some() {
                    return Err(duplicate(&meta));
                }
                let lit: LitStr = meta.value()?.parse()?;
                let kind = match lit.value().as_str() {
                    "token_major" => ArrangementKind::Token,
                    "section_major" => ArrangementKind::Section,
                    "head_major" => ArrangementKind::Head,
                    other => {
                        return Err(Error::new_spanned(
                            &lit,
                            format!(
                                "unknown arrangement \"{other}\": expected {ARRANGEMENTS}, or `planes = [[..], ..]` for explicit planes"
                            ),
                        ));
                    }
                };
                out.arrangement = Some((kind, lit));
            } else if meta.path.is_ident("planes") {
                if out.planes.is_some() {
                    return Err(duplicate(&meta));
                }
                let input = meta.value()?;
                let content;
                bracketed!(content in input);
                let mut groups = Vec::new();
                while !content.is_empty() {
                    let inner;
                    let brackets: token::Bracket = bracketed!(inner in content);
                    let names = inner.parse_terminated(Ident::parse, Token![,])?;
                    groups.push((brackets.span.join(), names.into_iter().collect()));
                    if content.is_empty() {
                        break;
                    }
                    content.parse::<Token![,]>()?;
                }
                out.planes = Some(Planes {
                    key: meta.path.clone(),
                    groups,
                });
            } else if meta.path.is_ident("page_align_bytes") {
                if out.page_align_bytes.is_some() {
                    return Err(duplicate(&meta));
                }
                out.page_align_bytes = Some(meta.value()?.parse()?);
            } else if meta.path.is_ident("page_stride_bytes") {
                if out.page_stride_bytes.is_some() {
                    return Err(duplicate(&meta));
                }
                out.page_stride_bytes = Some(meta.value()?.parse()?);
            } else if meta.path.is_ident("crate") {
                if out.krate.is_some() {
                    return Err(duplicate(&meta));
                }
                out.krate = Some(meta.value()?.parse()?);
            } else {
                return Err(unknown(
                    &meta,
                    "on a struct: arrangement, planes, page_align_bytes, page_stride_bytes, crate",
                ));
            }
            Ok(())
        });
        if let Err(e) = result {
            errors.push(e);
        }
    }
    out
}

/// The field attribute naming a scale's block length in elements (`block` before: refused
/// with a hint).
const BLOCK_ELEMS: &str = "block_elems";

/// Parses every `#[kv(...)]` on a field, pushing each error to `errors`.
pub fn field(attrs: &[Attribute], errors: &mut Errors) -> FieldAttrs {
    let mut out = FieldAttrs::default();
    for attr in attrs.iter().filter(|a| a.path().is_ident("kv")) {
        let result = attr.parse_nested_meta(|meta| {
            if meta.path.is_ident("scales") {
                if out.scales.is_some() {
                    return Err(duplicate(&meta));
                }
                out.scales = Some(meta.value()?.parse()?);
            } else if meta.path.is_ident(BLOCK_ELEMS) {
                if out.block.is_some() {
                    return Err(duplicate(&meta));
                }
                out.block = Some(meta.value()?.parse()?);
                out.block_key = Some(meta.path.clone());
            } else if meta.path.is_ident("block") {
                return Err(Error::new_spanned(
                    &meta.path,
                    "`kv(block)` is now `kv(block_elems)` (elements per scale block, as the \
                     geometry file and `ScaleOf::block_elems` say): \
                     `#[kv(scales = values, block_elems = 128)]`",
                ));
            } else {
                return Err(unknown(&meta, "on a field: scales, block_elems"));
            }
            Ok(())
        });
        if let Err(e) = result {
            errors.push(e);
            out.failed = true;
        }
    }
    out
}

/// An error for a key the derive does not know.
fn unknown(meta: &ParseNestedMeta, accepted: &str) -> Error {
    let key = meta
        .path
        .get_ident()
        .map_or_else(|| "?".to_owned(), ToString::to_string);
    Error::new_spanned(
        &meta.path,
        format!("unknown `kv` attribute `{key}`; accepted {accepted}"),
    )
}
