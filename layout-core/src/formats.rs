//! Built-in token layouts of real engines, with their sources and numbers (bytes per token per
//! layer). Every figure below is worked by hand from the source named.

use crate::{Arrangement, Dtype, Section, TokenLayout};

/// A named built-in layout.
#[derive(Clone, Debug)]
pub struct Format {
    /// Name used by the CLI (`kvlayout formats`).
    pub name: &'static str,
    /// Where the layout comes from, with its numbers.
    pub source: &'static str,
    /// The descriptor.
    pub layout: TokenLayout,
}

/// DeepSeek-V3.2 indexer cache, fp8 (SGLang `index_buf_accessor.py`, vLLM
/// `DeepseekV32IndexerCache`): 128 e4m3 values + one f32 scale per 128, values then scales.
/// 128 + 4 = 132 B/token; a 64-token page is `[64 x 128 = 8192 B][64 x 4 = 256 B]` = 8448 B.
pub const INDEX_K_FP8: TokenLayout = TokenLayout::new(
    Arrangement::SectionMajor,
    crate::sections![
        Section::new("values", Dtype::F8E4M3, &[128]),
        Section::scale_of("scale", Dtype::F32, &[1], 0, 128),
    ],
);

/// DSA index-K in bf16 (the downstream SGLang variant of the seed bug): 128 x 2 = 256 B/token,
/// no scale; a 64-token page is 16384 B.
pub const INDEX_K_BF16: TokenLayout = TokenLayout::new(
    Arrangement::SectionMajor,
    crate::sections![Section::new("values", Dtype::Bf16, &[128])],
);

/// DeepSeek-V4 / nvfp4 indexer (SGLang DSV4 indexer pool): 128 e2m1 packed two per byte (64 B)
/// + 4 ue8m0 scales, one per 32; values then scales: 68 B/token.
pub const INDEX_K_FP4: TokenLayout = TokenLayout::new(
    Arrangement::SectionMajor,
    crate::sections![
        Section::new("values", Dtype::F4E2M1, &[128]),
        Section::scale_of("scale", Dtype::Ue8m0, &[4], 0, 32),
    ],
);

/// MLA latent in bf16 (DeepSeek-V3, Kimi-K2; SGLang/vLLM MLA pools): kv_lora_rank 512 +
/// qk_rope_head_dim 64, bf16, one row per token: (512 + 64) x 2 = 1152 B/token.
pub const MLA_BF16: TokenLayout = TokenLayout::new(
    Arrangement::TokenMajor,
    crate::sections![
        Section::new("latent", Dtype::Bf16, &[512]),
        Section::new("rope", Dtype::Bf16, &[64]),
    ],
);

/// MLA latent in plain fp8 (SGLang/vLLM `fp8` MLA cache): 512 + 64 e4m3 = 576 B/token.
pub const MLA_FP8: TokenLayout = TokenLayout::new(
    Arrangement::TokenMajor,
    crate::sections![
        Section::new("latent", Dtype::F8E4M3, &[512]),
        Section::new("rope", Dtype::F8E4M3, &[64]),
    ],
);

/// DeepSeek-V3.2 sparse-attention MLA cache (FlashMLA sparse, vLLM `fp8_ds_mla`): bytes
/// [0,512) e4m3 NoPE, [512,528) 4 f32 scales (one per 128), [528,656) 64 bf16 RoPE; one 656-B
/// row per token.
pub const DSA_MLA_FP8: TokenLayout = TokenLayout::new(
    Arrangement::TokenMajor,
    crate::sections![
        Section::new("nope", Dtype::F8E4M3, &[512]),
        Section::scale_of("nope_scale", Dtype::F32, &[4], 0, 128),
        Section::new("rope", Dtype::Bf16, &[64]),
    ],
);

/// DeepSeek-V4 MLA fp8 (SGLang `deepseek_v4_memory_pool.py`): plane 1 per token 448 e4m3 NoPE
/// + 64 bf16 RoPE (576 B), plane 2 per token 7 ue8m0 scales (one per 64) + 1 pad byte (8 B):
/// 584 B/token; a 64-token page is 64 x 584 = 37376 B, padded to a multiple of 576: 37440 B.
pub const DSV4_MLA_FP8: TokenLayout = TokenLayout {
    arrangement: Arrangement::Planes(crate::Cow::Borrowed(&[
        crate::Cow::Borrowed(&[0, 1]),
        crate::Cow::Borrowed(&[2, 3]),
    ])),
    sections: crate::Cow::Borrowed(crate::sections![
        Section::new("nope", Dtype::F8E4M3, &[448]),
        Section::new("rope", Dtype::Bf16, &[64]),
        Section::scale_of("scale", Dtype::Ue8m0, &[7], 0, 64),
        Section::new("pad", Dtype::U8, &[1]),
    ]),
    page_align_bytes: Some(576),
    page_stride_bytes: None,
};

/// MHA K and V in bf16, 8 KV heads x 128 (Llama-3.1, Qwen3-8B, GLM-4.5; vLLM
/// `[blocks, 2, block, heads, dim]`: the K plane then the V plane): 2 x 8 x 128 x 2 = 4096 B.
pub const MHA_BF16_8X128: TokenLayout = TokenLayout::new(
    Arrangement::SectionMajor,
    crate::sections![
        Section::new("k", Dtype::Bf16, &[8, 128]),
        Section::new("v", Dtype::Bf16, &[8, 128]),
    ],
);

/// MHA K and V in fp8 e4m3, 8 x 128, no in-cache scales: 2 x 1024 = 2048 B/token.
pub const MHA_FP8_8X128: TokenLayout = TokenLayout::new(
    Arrangement::SectionMajor,
    crate::sections![
        Section::new("k", Dtype::F8E4M3, &[8, 128]),
        Section::new("v", Dtype::F8E4M3, &[8, 128]),
    ],
);

/// MHA MXFP8 (SGLang `pool_host/mha_mxfp8.py`): e4m3 K and V, 8 x 128, one ue8m0 scale per 32
/// elements for each: 2 x 1024 + 2 x 32 = 2112 B/token.
pub const MHA_MXFP8_8X128: TokenLayout = TokenLayout::new(
    Arrangement::SectionMajor,
    crate::sections![
        Section::new("k", Dtype::F8E4M3, &[8, 128]),
        Section::new("v", Dtype::F8E4M3, &[8, 128]),
        Section::scale_of("k_scale", Dtype::Ue8m0, &[8, 4], 0, 32),
        Section::scale_of("v_scale", Dtype::Ue8m0, &[8, 4], 1, 32),
    ],
);

/// Every built-in format, in listing order.
pub fn all() -> Vec<Format> {
    let f = |name, source, layout| Format {
        name,
        source,
        layout,
    };
    vec![
        f(
            "index_k_fp8",
            "DeepSeek-V3.2 indexer cache: 128 e4m3 + f32 per 128, values then scales (SGLang index_buf_accessor.py, vLLM DeepseekV32IndexerCache)",
            INDEX_K_FP8,
        ),
        f(
            "index_k_bf16",
            "DSA index-K in bf16: 128 x 2 B, no scale (downstream SGLang variant)",
            INDEX_K_BF16,
        ),
        f(
            "index_k_fp4",
            "DeepSeek-V4 indexer: 128 e2m1 (64 B) + 4 ue8m0 per 32 (SGLang DSV4 indexer pool)",
            INDEX_K_FP4,
        ),
        f(
            "mla_bf16",
            "MLA latent 512 + rope 64, bf16 (DeepSeek-V3, Kimi-K2; SGLang/vLLM MLA pools)",
            MLA_BF16,
        ),
        f(
            "mla_fp8",
            "MLA latent 512 + rope 64, e4m3 (SGLang/vLLM fp8 MLA cache)",
            MLA_FP8,
        ),
        f(
            "dsa_mla_fp8",
            "DeepSeek-V3.2 sparse MLA: 512 e4m3, 4 f32 per 128, 64 bf16 rope, one 656-B row (FlashMLA sparse, vLLM fp8_ds_mla)",
            DSA_MLA_FP8,
        ),
        f(
            "dsv4_mla_fp8",
            "DeepSeek-V4 MLA: [448 e4m3 + 64 bf16][7 ue8m0 per 64 + pad] planes, pages aligned to 576 B (SGLang deepseek_v4_memory_pool.py)",
            DSV4_MLA_FP8,
        ),
        f(
            "mha_bf16_8x128",
            "MHA K,V bf16 8 heads x 128, K plane then V plane (vLLM FullAttentionSpec, SGLang MHA pool)",
            MHA_BF16_8X128,
        ),
        f(
            "mha_fp8_8x128",
            "MHA K,V e4m3 8 heads x 128, no in-cache scales (vLLM/SGLang fp8 KV)",
            MHA_FP8_8X128,
        ),
        f(
            "mha_mxfp8_8x128",
            "MHA MXFP8: e4m3 K,V 8 x 128 + ue8m0 per 32 (SGLang pool_host/mha_mxfp8.py)",
            MHA_MXFP8_8X128,
        ),
    ]
}

/// The built-in format named `name`.
pub fn by_name(name: &str) -> Option<Format> {
    all().into_iter().find(|f| f.name == name)
}
