//! Rules checked at macro time: everything knowable from the syntax when array lengths and
//! `block_elems` are integer literals. One `syn::Error` per broken rule, spanned at the offending
//! field or attribute; all of them are reported together. What needs type resolution (lengths
//! given by constants, the dtype of an element type alias) is checked by the const evaluation
//! of `TokenLayout::validate` that the expansion forces.

use std::collections::HashMap;

use syn::Error;

use crate::ast::{Errors, Input, literal_u64, unraw};

/// Checks every rule, pushing one error per problem.
pub fn validate(input: &Input, errors: &mut Errors) {
    check_fields(input, errors);
    check_scales(input, errors);
    check_container(input, errors);
}

fn check_fields(input: &Input, errors: &mut Errors) {
    let mut seen = HashMap::new();
    for field in &input.fields {
        if let Some(first) = seen.insert(field.name.clone(), field.ident) {
            errors.push(Error::new_spanned(
                field.ident,
                format!(
                    "section `{}` is declared twice (first at `{first}`)",
                    field.name
                ),
            ));
        }
        for dim in &field.dims {
            if literal_u64(dim) == Some(0) {
                errors.push(Error::new_spanned(
                    dim,
                    format!(
                        "field `{}` has a zero-length dimension: every dimension of a section is at least 1",
                        field.name
                    ),
                ));
            }
        }
        if field.elem_name().as_deref() == Some("F4E2M1")
            && let Some(elems) = field.literal_elems()
            && elems % 2 != 0
        {
            errors.push(Error::new_spanned(
                field.ty,
                format!(
                    "field `{}` holds {elems} F4E2M1 elements: fp4 stores two elements per byte, so the count must be even",
                    field.name
                ),
            ));
        }
    }
}

fn check_scales(input: &Input, errors: &mut Errors) {
    for (index, field) in input.fields.iter().enumerate() {
        let attrs = &field.attrs;
        if attrs.failed {
            continue;
        }
        let (target_ident, block) = match (&attrs.scales, &attrs.block) {
            (None, None) => continue,
            (Some(target), None) => {
                errors.push(Error::new_spanned(
                    target,
                    format!(
                        "`scales = {target}` needs `block_elems = N`: how many elements of `{target}` one scale of `{}` covers",
                        field.name
                    ),
                ));
                continue;
            }
            (None, Some(_)) => {
                errors.push(Error::new_spanned(
                    attrs.block_key.as_ref(),
                    format!(
                        "`block_elems` without `scales`: name the field `{}` scales, `#[kv(scales = values, block_elems = N)]`",
                        field.name
                    ),
                ));
                continue;
            }
            (Some(target), Some(block)) => (target, block),
        };
        let Some(target_index) = input.position(target_ident) else {
            let names: Vec<&str> = input.fields.iter().map(|f| f.name.as_str()).collect();
            errors.push(Error::new_spanned(
                target_ident,
                format!(
                    "`scales = {}`: `{}` has no field named `{}` (fields: {})",
                    unraw(target_ident),
                    input.ident,
                    unraw(target_ident),
                    names.join(", ")
                ),
            ));
            continue;
        };
        let target = &input.fields[target_index];
        if target_index == index {
            errors.push(Error::new_spanned(
                target_ident,
                format!(
                    "field `{}` cannot scale itself: `scales` names the value field it scales",
                    field.name
                ),
            ));
            continue;
        }
        if target.attrs.scales.is_some() {
            errors.push(Error::new_spanned(
                target_ident,
                format!(
                    "field `{}` scales `{}`, which is itself a scale field: a scale must scale a value field",
                    field.name, target.name
                ),
            ));
            continue;
        }
        let Some(block_elems) = literal_u64(block) else {
            continue;
        };
        if block_elems == 0 {
            errors.push(Error::new_spanned(
                block,
                format!(
                    "`block_elems = 0` on field `{}`: a block covers at least 1 element",
                    field.name
                ),
            ));
            continue;
        }
        let Some(target_elems) = target.literal_elems() else {
            continue;
        };
        if target_elems % block_elems != 0 {
            errors.push(Error::new_spanned(
                block,
                format!(
                    "`block_elems = {block_elems}` does not divide the {target_elems} elements of `{}` (field `{}` scales it)",
                    target.name, field.name
                ),
            ));
            continue;
        }
        let expected = target_elems / block_elems;
        if let Some(scale_elems) = field.literal_elems()
            && scale_elems != expected
        {
            errors.push(Error::new_spanned(
                field.ty,
                format!(
                    "field `{}` holds {scale_elems} scale elements, but `{}` has {target_elems} elements / block {block_elems} = {expected}",
                    field.name, target.name
                ),
            ));
        }
    }
}

fn check_container(input: &Input, errors: &mut Errors) {
    let attrs = &input.attrs;
    if let (Some((_, lit)), Some(_)) = (&attrs.arrangement, &attrs.planes) {
        errors.push(Error::new_spanned(
            lit,
            "give either `arrangement` or `planes`, not both (explicit planes are their own arrangement)",
        ));
    }
    if let Some(planes) = &attrs.planes {
        if planes.groups.is_empty() {
            errors.push(Error::new_spanned(
                &planes.key,
                "`planes` needs at least one plane, e.g. `planes = [[nope, rope], [scale, pad]]`",
            ));
        }
        let mut placed: HashMap<String, &syn::Ident> = HashMap::new();
        for (span, names) in &planes.groups {
            if names.is_empty() {
                errors.push(Error::new(*span, "a plane needs at least one field"));
            }
            for name in names {
                if input.position(name).is_none() {
                    errors.push(Error::new_spanned(
                        name,
                        format!(
                            "`planes` names `{}`, but `{}` has no such field",
                            unraw(name),
                            input.ident
                        ),
                    ));
                } else if placed.insert(unraw(name), name).is_some() {
                    errors.push(Error::new_spanned(
                        name,
                        format!(
                            "field `{}` is in `planes` twice: each field goes in exactly one plane",
                            unraw(name)
                        ),
                    ));
                }
            }
        }
        for field in &input.fields {
            if !placed.contains_key(&field.name) {
                errors.push(Error::new_spanned(
                    field.ident,
                    format!(
                        "field `{}` is in no plane: `planes` must place every field exactly once",
                        field.name
                    ),
                ));
            }
        }
    }
    if let (Some(align_expr), Some(stride_expr)) =
        (&attrs.page_align_bytes, &attrs.page_stride_bytes)
        && let (Some(align), Some(stride)) = (literal_u64(align_expr), literal_u64(stride_expr))
        && align != 0
        && stride % align != 0
    {
        errors.push(Error::new_spanned(
            stride_expr,
            format!(
                "`page_stride_bytes = {stride}` is not a multiple of `page_align_bytes = {align}`"
            ),
        ));
    }
    for (key, expr) in [
        ("page_align_bytes", &attrs.page_align_bytes),
        ("page_stride_bytes", &attrs.page_stride_bytes),
    ] {
        if let Some(expr) = expr
            && literal_u64(expr) == Some(0)
        {
            errors.push(Error::new_spanned(
                expr,
                format!("`{key} = 0`: must be at least 1"),
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use syn::{DeriveInput, parse_quote};

    use crate::ast::{Errors, Input};

    /// Every message, in the order reported.
    fn messages(input: &DeriveInput) -> Vec<String> {
        let mut errors = Errors::default();
        let parsed = Input::from_syn(input, &mut errors);
        super::validate(&parsed, &mut errors);
        errors
            .finish()
            .map(|e| e.into_iter().map(|e| e.to_string()).collect())
            .unwrap_or_default()
    }

    #[test]
    fn a_valid_row_has_no_error_and_nested_shapes_are_outermost_first() {
        let input: DeriveInput = parse_quote! {
            #[kv(arrangement = "section_major")]
            struct Mxfp8 {
                k: [[F8E4M3; 128]; 8],
                #[kv(scales = k, block_elems = 32)]
                k_scale: [[Ue8m0; 4]; 8],
            }
        };
        assert_eq!(messages(&input), Vec::<String>::new());
        let mut errors = Errors::default();
        let parsed = Input::from_syn(&input, &mut errors);
        assert_eq!(parsed.fields[0].literal_dims(), Some(vec![8, 128]));
        // 8 x 4 = 32 scales = 8 x 128 / 32.
        assert_eq!(parsed.fields[1].literal_elems(), Some(32));
        assert_eq!(parsed.position(&parse_quote!(k_scale)), Some(1));
    }

    #[test]
    fn every_problem_is_reported_once() {
        let input: DeriveInput = parse_quote! {
            struct Broken {
                values: [F8E4M3; 128],
                #[kv(scales = values, block_elems = 100)]
                scale: [f32; 1],
                #[kv(scales = values, block_elems = 64)]
                scale2: [f32; 3],
                packed: [kvlayout::F4E2M1; 3],
                #[kv(scales = scale, block_elems = 1)]
                scale_of_scale: [f32; 1],
            }
        };
        assert_eq!(
            messages(&input),
            vec![
                "field `packed` holds 3 F4E2M1 elements: fp4 stores two elements per byte, so the count must be even",
                "`block_elems = 100` does not divide the 128 elements of `values` (field `scale` scales it)",
                // 128 / 64 = 2 scales expected.
                "field `scale2` holds 3 scale elements, but `values` has 128 elements / block 64 = 2",
                "field `scale_of_scale` scales `scale`, which is itself a scale field: a scale must scale a value field",
            ]
        );
    }

    #[test]
    fn constant_lengths_are_left_to_const_evaluation() {
        // N is only known after type resolution: no macro-time error, the const eval decides.
        let input: DeriveInput = parse_quote! {
            struct IndexK {
                values: [F8E4M3; N],
                #[kv(scales = values, block_elems = 100)]
                scale: [f32; 1],
            }
        };
        assert_eq!(messages(&input), Vec::<String>::new());
    }

    #[test]
    fn planes_must_place_every_field_once() {
        let input: DeriveInput = parse_quote! {
            #[kv(planes = [[a, b], [b]])]
            struct P { a: [u8; 1], b: [u8; 1], c: [u8; 1] }
        };
        assert_eq!(
            messages(&input),
            vec![
                "field `b` is in `planes` twice: each field goes in exactly one plane",
                "field `c` is in no plane: `planes` must place every field exactly once",
            ]
        );
    }
}
