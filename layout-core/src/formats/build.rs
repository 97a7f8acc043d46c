//! Parametric builders of the built-in layouts, for sizes a model config chooses at run time
//! (head counts, head dims, latent ranks, index dims). At the standard sizes each equals the
//! `#[derive(KvLayout)]` descriptor of the same format (tested below), so a model reader and a
//! compile-time token row can never disagree. Section labels are the derive's (the struct's
//! field names). Every builder validates what it builds: a block that does not divide, an odd
//! fp4 count or an overflow is the [`LayoutError`] naming the rule.

use std::borrow::Cow;

use crate::Dtype;
use crate::error::LayoutError;
use crate::layout::{Arrangement, TokenLayout};
use crate::section::Section;

fn built(arrangement: Arrangement, sections: Vec<Section>) -> Result<TokenLayout, LayoutError> {
    let layout = TokenLayout {
        arrangement,
        sections: Cow::Owned(sections),
        page_align_bytes: None,
        page_stride_bytes: None,
    };
    layout.validate()?;
    Ok(layout)
}

/// MHA / GQA K and V, `[kv_heads, head_dim]` each in `dtype`, K plane then V plane
/// (`section_major`; vLLM `[blocks, 2, block, heads, dim]`, SGLang MHA pool):
/// 2 x kv_heads x head_dim x bits / 8 B/token. `mha(8, 128, Bf16)` = [`super::MHA_BF16_8X128`],
/// `mha(8, 128, F8E4M3)` = [`super::MHA_FP8_8X128`].
///
/// # Errors
///
/// A [`LayoutError`] when a dimension is 0 (`ZeroDim`), a sub-byte dtype does not fill whole bytes
/// (`SubByteCount`), or the sizes overflow.
pub fn mha(kv_heads: u64, head_dim: u64, dtype: Dtype) -> Result<TokenLayout, LayoutError> {
    let shape = vec![kv_heads, head_dim];
    built(
        Arrangement::SectionMajor,
        vec![
            Section::owned("k", dtype, shape.clone()),
            Section::owned("v", dtype, shape),
        ],
    )
}

/// MHA MXFP8 (SGLang `pool_host/mha_mxfp8.py`): e4m3 K and V `[kv_heads, head_dim]`, then one
/// ue8m0 scale per 32 elements of each, `[kv_heads, head_dim / 32]`. `mha_mxfp8(8, 128)` =
/// [`super::MHA_MXFP8_8X128`] (2 x 1024 + 2 x 32 = 2112 B/token).
///
/// # Errors
///
/// As [`mha`], plus `head_dim` not a multiple of the 32-element scale block (`BlockDoesNotDivide`).
pub fn mha_mxfp8(kv_heads: u64, head_dim: u64) -> Result<TokenLayout, LayoutError> {
    const BLOCK: u64 = 32;
    let values = vec![kv_heads, head_dim];
    let scales = vec![kv_heads, head_dim / BLOCK.max(1)];
    if !head_dim.is_multiple_of(BLOCK) {
        return Err(LayoutError::BlockDoesNotDivide {
            section: 2,
            target_elems: head_dim,
            block_elems: BLOCK,
        });
    }
    built(
        Arrangement::SectionMajor,
        vec![
            Section::owned("k", Dtype::F8E4M3, values.clone()),
            Section::owned("v", Dtype::F8E4M3, values),
            Section::owned("k_scale", Dtype::Ue8m0, scales.clone()).with_scale(0, BLOCK),
            Section::owned("v_scale", Dtype::Ue8m0, scales).with_scale(1, BLOCK),
        ],
    )
}

/// MLA latent (DeepSeek-V2/V3, Kimi-K2; SGLang/vLLM MLA pools): one row per token of
/// `kv_lora_rank` latent then `rope_dim` RoPE elements, both in `dtype`
/// (`token_major`): (rank + rope) x bits / 8 B/token. `mla(512, 64, Bf16)` =
/// [`super::MLA_BF16`] (1152 B), `mla(512, 64, F8E4M3)` = [`super::MLA_FP8`] (576 B).
///
/// # Errors
///
/// As [`mha`].
pub fn mla(kv_lora_rank: u64, rope_dim: u64, dtype: Dtype) -> Result<TokenLayout, LayoutError> {
    built(
        Arrangement::TokenMajor,
        vec![
            Section::owned("latent", dtype, vec![kv_lora_rank]),
            Section::owned("rope", dtype, vec![rope_dim]),
        ],
    )
}

/// DeepSeek-V3.2 sparse-attention MLA cache (FlashMLA sparse, vLLM `fp8_ds_mla`): per token
/// `kv_lora_rank` e4m3 NoPE, one f32 scale per 128 of them, `rope_dim` bf16 RoPE, one row:
/// rank + rank / 128 x 4 + rope x 2 B. `dsa_mla_fp8(512, 64)` = [`super::DSA_MLA_FP8`] (656 B).
///
/// # Errors
///
/// As [`mha`], plus `kv_lora_rank` not a multiple of the 128-element scale block
/// (`BlockDoesNotDivide`).
pub fn dsa_mla_fp8(kv_lora_rank: u64, rope_dim: u64) -> Result<TokenLayout, LayoutError> {
    const BLOCK: u64 = 128;
    if !kv_lora_rank.is_multiple_of(BLOCK) {
        return Err(LayoutError::BlockDoesNotDivide {
            section: 1,
            target_elems: kv_lora_rank,
            block_elems: BLOCK,
        });
    }
    built(
        Arrangement::TokenMajor,
        vec![
            Section::owned("nope", Dtype::F8E4M3, vec![kv_lora_rank]),
            Section::owned("nope_scale", Dtype::F32, vec![kv_lora_rank / BLOCK])
                .with_scale(0, BLOCK),
            Section::owned("rope", Dtype::Bf16, vec![rope_dim]),
        ],
    )
}

/// A sparse-attention indexer cache (DeepSeek-V3.2 / V4; SGLang `index_buf_accessor.py`, vLLM
/// `DeepseekV32IndexerCache`): `dim` values in `values`, then, when `scale` is
/// `Some((dtype, block))`, one scale per `block` values; values then scales (`section_major`).
/// `index_k(F8E4M3, 128, Some((F32, 128)))` = [`super::INDEX_K_FP8`] (132 B),
/// `index_k(Bf16, 128, None)` = [`super::INDEX_K_BF16`] (256 B),
/// `index_k(F4E2M1, 128, Some((Ue8m0, 32)))` = [`super::INDEX_K_FP4`] (68 B).
///
/// # Errors
///
/// As [`mha`], plus a scale block that is 0 (`ZeroBlock`) or does not divide `head_dim`
/// (`BlockDoesNotDivide`).
pub fn index_k(
    values: Dtype,
    dim: u64,
    scale: Option<(Dtype, u64)>,
) -> Result<TokenLayout, LayoutError> {
    let mut sections = vec![Section::owned("values", values, vec![dim])];
    if let Some((dtype, block)) = scale {
        if block == 0 {
            return Err(LayoutError::ZeroBlock { section: 1 });
        }
        if !dim.is_multiple_of(block) {
            return Err(LayoutError::BlockDoesNotDivide {
                section: 1,
                target_elems: dim,
                block_elems: block,
            });
        }
        sections.push(Section::owned("scale", dtype, vec![dim / block]).with_scale(0, block));
    }
    built(Arrangement::SectionMajor, sections)
}

/// DeepSeek-V4 MLA fp8 (SGLang `deepseek_v4_memory_pool.py`): plane 1 per token `nope_dim`
/// e4m3 NoPE and `rope_dim` bf16 RoPE, plane 2 per token one ue8m0 scale per 64 NoPE elements
/// padded with u8 to a multiple of 8 bytes; pages aligned to 576 B.
/// `dsv4_mla_fp8(448, 64)` = [`super::DSV4_MLA_FP8`] (584 B/token, 37440 B per 64-token page).
///
/// # Errors
///
/// As [`mha`], plus `nope_dim` not a multiple of the 64-element scale block (`BlockDoesNotDivide`).
pub fn dsv4_mla_fp8(nope_dim: u64, rope_dim: u64) -> Result<TokenLayout, LayoutError> {
    const BLOCK: u64 = 64;
    const ROW: u64 = 8;
    const ALIGN: u64 = 576;
    if !nope_dim.is_multiple_of(BLOCK) {
        return Err(LayoutError::BlockDoesNotDivide {
            section: 2,
            target_elems: nope_dim,
            block_elems: BLOCK,
        });
    }
    let scales = nope_dim / BLOCK;
    let pad = (ROW - scales % ROW) % ROW;
    let mut sections = vec![
        Section::owned("nope", Dtype::F8E4M3, vec![nope_dim]),
        Section::owned("rope", Dtype::Bf16, vec![rope_dim]),
        Section::owned("scale", Dtype::Ue8m0, vec![scales]).with_scale(0, BLOCK),
    ];
    let mut second: Vec<usize> = vec![2];
    if pad > 0 {
        sections.push(Section::owned("pad", Dtype::U8, vec![pad]));
        second.push(3);
    }
    let mut layout = built(
        Arrangement::Planes(Cow::Owned(vec![Cow::Owned(vec![0, 1]), Cow::Owned(second)])),
        sections,
    )?;
    layout.page_align_bytes = Some(ALIGN);
    layout.validate()?;
    Ok(layout)
}

/// A layout of one section `name`, `shape` in `dtype` (`token_major`): a state slot's part
/// (Qwen3-Next / Mamba conv state `[conv_dim, kernel - 1]`, recurrent state `[heads, k_dim,
/// v_dim]`, SGLang `MambaPool`) or any single-tensor buffer.
///
/// # Errors
///
/// As [`mha`]; an empty `shape` is `LayoutError::EmptyShape`.
pub fn single(name: &str, dtype: Dtype, shape: Vec<u64>) -> Result<TokenLayout, LayoutError> {
    built(
        Arrangement::TokenMajor,
        vec![Section::owned(name, dtype, shape)],
    )
}

#[cfg(test)]
mod tests {
    //! Each builder at the standard sizes equals the derived descriptor (sections, labels,
    //! dtypes, shapes, scale relations, arrangement, alignment: `TokenLayout`'s `==`) and its
    //! fingerprint; other sizes give the bytes worked by hand.

    use super::*;
    use crate::formats::{
        DSA_MLA_FP8, DSV4_MLA_FP8, INDEX_K_BF16, INDEX_K_FP4, INDEX_K_FP8, MHA_BF16_8X128,
        MHA_FP8_8X128, MHA_MXFP8_8X128, MLA_BF16, MLA_FP8,
    };

    #[test]
    fn builders_at_the_standard_sizes_equal_the_derived_descriptors() {
        let pairs = [
            (mha(8, 128, Dtype::Bf16), MHA_BF16_8X128),
            (mha(8, 128, Dtype::F8E4M3), MHA_FP8_8X128),
            (mha_mxfp8(8, 128), MHA_MXFP8_8X128),
            (mla(512, 64, Dtype::Bf16), MLA_BF16),
            (mla(512, 64, Dtype::F8E4M3), MLA_FP8),
            (dsa_mla_fp8(512, 64), DSA_MLA_FP8),
            (
                index_k(Dtype::F8E4M3, 128, Some((Dtype::F32, 128))),
                INDEX_K_FP8,
            ),
            (index_k(Dtype::Bf16, 128, None), INDEX_K_BF16),
            (
                index_k(Dtype::F4E2M1, 128, Some((Dtype::Ue8m0, 32))),
                INDEX_K_FP4,
            ),
            (dsv4_mla_fp8(448, 64), DSV4_MLA_FP8),
        ];
        for (i, (got, want)) in pairs.into_iter().enumerate() {
            let got = got.unwrap_or_else(|e| panic!("builder {i}: {e}"));
            // Built, not borrowed from the constant.
            assert!(matches!(got.sections, Cow::Owned(_)), "builder {i}");
            assert_eq!(got, want, "builder {i}");
            assert_eq!(got.fingerprint(), want.fingerprint(), "builder {i}");
        }
    }

    #[test]
    fn other_sizes_by_hand() {
        // Llama-3.1-8B at TP 2: 4 KV heads x 128, bf16: 2 x 4 x 128 x 2 = 2048 B/token.
        assert_eq!(
            mha(4, 128, Dtype::Bf16).unwrap().bytes_per_token(),
            Ok(2 * 4 * 128 * 2)
        );
        // gpt-oss-20b: 8 KV heads x 64, bf16: 2 x 8 x 64 x 2 = 2048.
        assert_eq!(
            mha(8, 64, Dtype::Bf16).unwrap().bytes_per_token(),
            Ok(2 * 8 * 64 * 2)
        );
        // MXFP8 4 x 64: 2 x 256 + 2 x 4 x 2 = 528.
        assert_eq!(
            mha_mxfp8(4, 64).unwrap().bytes_per_token(),
            Ok(2 * 256 + 2 * 4 * 2)
        );
        // DSA MLA 256 + 32: 256 + 2 x 4 + 32 x 2 = 328.
        assert_eq!(
            dsa_mla_fp8(256, 32).unwrap().bytes_per_token(),
            Ok(256 + 2 * 4 + 32 * 2)
        );
        // Index-K fp8 64: 64 + 4 (block 64).
        assert_eq!(
            index_k(Dtype::F8E4M3, 64, Some((Dtype::F32, 64)))
                .unwrap()
                .bytes_per_token(),
            Ok(64 + 4)
        );
        // DSV4 512 + 64: 512 + 128 + 8 scales (no pad) = 648; 64 x 648 = 41472 = 72 x 576.
        let v4 = dsv4_mla_fp8(512, 64).unwrap();
        assert_eq!(v4.sections().len(), 3);
        assert_eq!(v4.bytes_per_token(), Ok(512 + 128 + 8));
        assert_eq!(v4.page_stride_bytes(64), Ok(72 * 576));
        // Qwen3-Next-style recurrent state slot, 32 heads x 128 x 128 f32 = 2 MiB.
        assert_eq!(
            single("ssm", Dtype::F32, vec![32, 128, 128])
                .unwrap()
                .bytes_per_token(),
            Ok(32 * 128 * 128 * 4)
        );
    }

    #[test]
    fn bad_sizes_name_the_rule() {
        assert!(matches!(
            dsa_mla_fp8(500, 64),
            Err(LayoutError::BlockDoesNotDivide {
                target_elems: 500,
                block_elems: 128,
                ..
            })
        ));
        assert!(matches!(
            index_k(Dtype::F8E4M3, 100, Some((Dtype::F32, 128))),
            Err(LayoutError::BlockDoesNotDivide { .. })
        ));
        assert_eq!(
            index_k(Dtype::F8E4M3, 128, Some((Dtype::F32, 0))),
            Err(LayoutError::ZeroBlock { section: 1 })
        );
        assert!(matches!(
            mha(0, 128, Dtype::Bf16),
            Err(LayoutError::ZeroDim { .. })
        ));
        assert!(matches!(
            mla(3, 1, Dtype::F4E2M1),
            Err(LayoutError::SubByteCount { .. })
        ));
        assert!(matches!(
            mha_mxfp8(8, 100),
            Err(LayoutError::BlockDoesNotDivide { .. })
        ));
        assert!(matches!(
            dsv4_mla_fp8(100, 64),
            Err(LayoutError::BlockDoesNotDivide { .. })
        ));
        assert!(matches!(
            mha(u64::MAX, 2, Dtype::Bf16),
            Err(LayoutError::Overflow { .. })
        ));
    }
}
