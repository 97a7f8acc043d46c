//! Built-in token layouts of real engines, with their sources and numbers (bytes per token per
//! layer). Each is a `#[derive(KvLayout)]` token-row struct (the descriptor) and a
//! `pub const` [`TokenLayout`] taken from it; every figure below is worked by hand from the
//! source named. The builders (`build.rs`) give the same formats as functions of their sizes (re-exported
//! here: `formats::mha(kv_heads, head_dim, dtype)`, ...), for the sizes a model config picks.

mod build;

pub use build::{dsa_mla_fp8, dsv4_mla_fp8, index_k, mha, mha_mxfp8, mla, single};

use kvlayout_derive::KvLayout;

use crate::TokenLayout;
use crate::elem::{F4E2M1, F8E4M3, Ue8m0, bf16};

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
/// 128 x 1 + 1 x 4 = 132 B/token; a 64-token page is `[64 x 128 = 8192 B][64 x 4 = 256 B]` =
/// 8448 B, token t's scale at byte 8192 + 4t.
#[derive(KvLayout)]
#[kv(crate = crate, arrangement = "section_major")]
pub struct IndexKFp8 {
    /// index_head_dim 128 e4m3 values.
    pub values: [F8E4M3; 128],
    /// One f32 scale per 128 values (amax / 448).
    #[kv(scales = values, block_elems = 128)]
    pub scale: [f32; 1],
}

/// DSA index-K in bf16 (the downstream SGLang variant of the seed bug): 128 x 2 = 256 B/token,
/// no scale; a 64-token page is 64 x 256 = 16384 B.
#[derive(KvLayout)]
#[kv(crate = crate, arrangement = "section_major")]
pub struct IndexKBf16 {
    /// index_head_dim 128 bf16 values.
    pub values: [bf16; 128],
}

/// DeepSeek-V4 / nvfp4 indexer (SGLang DSV4 indexer pool): 128 e2m1 packed two per byte
/// (128 / 2 = 64 B) + 4 ue8m0 scales, one per 32 (128 / 32 = 4 B); values then scales:
/// 64 + 4 = 68 B/token; a 64-token page is 64 x 68 = 4352 B.
#[derive(KvLayout)]
#[kv(crate = crate, arrangement = "section_major")]
pub struct IndexKFp4 {
    /// 128 fp4 e2m1 values, two per byte.
    pub values: [F4E2M1; 128],
    /// One ue8m0 scale per 32 values.
    #[kv(scales = values, block_elems = 32)]
    pub scale: [Ue8m0; 4],
}

/// MLA latent in bf16 (DeepSeek-V3, Kimi-K2; SGLang/vLLM MLA pools): kv_lora_rank 512 +
/// qk_rope_head_dim 64, bf16, one row per token: (512 + 64) x 2 = 1152 B/token.
#[derive(KvLayout)]
#[kv(crate = crate)]
pub struct MlaBf16 {
    /// kv_lora_rank 512 latent elements.
    pub latent: [bf16; 512],
    /// qk_rope_head_dim 64 RoPE elements.
    pub rope: [bf16; 64],
}

/// MLA latent in plain fp8 (SGLang/vLLM `fp8` MLA cache): 512 + 64 e4m3 = 576 B/token.
#[derive(KvLayout)]
#[kv(crate = crate)]
pub struct MlaFp8 {
    /// kv_lora_rank 512 latent elements.
    pub latent: [F8E4M3; 512],
    /// qk_rope_head_dim 64 RoPE elements.
    pub rope: [F8E4M3; 64],
}

/// DeepSeek-V3.2 sparse-attention MLA cache (FlashMLA sparse, vLLM `fp8_ds_mla`): bytes
/// [0,512) e4m3 NoPE, [512,528) 4 f32 scales (one per 128), [528,656) 64 bf16 RoPE; one 656-B
/// row per token (512 + 16 + 128).
#[derive(KvLayout)]
#[kv(crate = crate)]
pub struct DsaMlaFp8 {
    /// kv_lora_rank 512 e4m3 NoPE elements.
    pub nope: [F8E4M3; 512],
    /// One f32 scale per 128 NoPE elements.
    #[kv(scales = nope, block_elems = 128)]
    pub nope_scale: [f32; 4],
    /// qk_rope_head_dim 64 bf16 RoPE elements, unquantized.
    pub rope: [bf16; 64],
}

/// DeepSeek-V4 MLA fp8 (SGLang `deepseek_v4_memory_pool.py`): plane 1 holds per token 448 e4m3
/// NoPE and 64 bf16 RoPE (448 + 128 = 576 B), plane 2 per token 7 ue8m0 scales (one per 64)
/// and 1 pad byte (8 B): 584 B/token; a 64-token page is 64 x 584 = 37376 B, padded to a multiple of 576:
/// 65 x 576 = 37440 B.
#[derive(KvLayout)]
#[kv(crate = crate, planes = [[nope, rope], [scale, pad]], page_align_bytes = 576)]
pub struct Dsv4MlaFp8 {
    /// 448 e4m3 NoPE elements.
    pub nope: [F8E4M3; 448],
    /// 64 bf16 RoPE elements.
    pub rope: [bf16; 64],
    /// One ue8m0 scale per 64 NoPE elements (448 / 64 = 7).
    #[kv(scales = nope, block_elems = 64)]
    pub scale: [Ue8m0; 7],
    /// One pad byte, so a plane-2 row is 8 B.
    pub pad: [u8; 1],
}

/// MHA K and V in bf16, 8 KV heads x 128 (Llama-3.1, Qwen3-8B, GLM-4.5; vLLM
/// `[blocks, 2, block, heads, dim]`: the K plane then the V plane): 2 x 8 x 128 x 2 = 4096 B.
#[derive(KvLayout)]
#[kv(crate = crate, arrangement = "section_major")]
pub struct MhaBf16Heads8x128 {
    /// K, `[heads 8, head_dim 128]`.
    pub k: [[bf16; 128]; 8],
    /// V, `[heads 8, head_dim 128]`.
    pub v: [[bf16; 128]; 8],
}

/// MHA K and V in fp8 e4m3, 8 x 128, no in-cache scales: 2 x 8 x 128 x 1 = 2048 B/token.
#[derive(KvLayout)]
#[kv(crate = crate, arrangement = "section_major")]
pub struct MhaFp8Heads8x128 {
    /// K, `[heads 8, head_dim 128]`.
    pub k: [[F8E4M3; 128]; 8],
    /// V, `[heads 8, head_dim 128]`.
    pub v: [[F8E4M3; 128]; 8],
}

/// MHA MXFP8 (SGLang `pool_host/mha_mxfp8.py`): e4m3 K and V, 8 x 128, one ue8m0 scale per 32
/// elements for each (8 x 128 / 32 = 32 = `[8, 4]`): 2 x 1024 + 2 x 32 = 2112 B/token.
#[derive(KvLayout)]
#[kv(crate = crate, arrangement = "section_major")]
pub struct MhaMxfp8Heads8x128 {
    /// K, `[heads 8, head_dim 128]`.
    pub k: [[F8E4M3; 128]; 8],
    /// V, `[heads 8, head_dim 128]`.
    pub v: [[F8E4M3; 128]; 8],
    /// K scales, `[heads 8, 128 / 32 = 4]`.
    #[kv(scales = k, block_elems = 32)]
    pub k_scale: [[Ue8m0; 4]; 8],
    /// V scales, `[heads 8, 4]`.
    #[kv(scales = v, block_elems = 32)]
    pub v_scale: [[Ue8m0; 4]; 8],
}

/// [`IndexKFp8`]'s layout: 132 B/token, section-major.
pub const INDEX_K_FP8: TokenLayout = <IndexKFp8 as crate::KvLayout>::LAYOUT;
/// [`IndexKBf16`]'s layout: 256 B/token.
pub const INDEX_K_BF16: TokenLayout = <IndexKBf16 as crate::KvLayout>::LAYOUT;
/// [`IndexKFp4`]'s layout: 68 B/token.
pub const INDEX_K_FP4: TokenLayout = <IndexKFp4 as crate::KvLayout>::LAYOUT;
/// [`MlaBf16`]'s layout: 1152 B/token.
pub const MLA_BF16: TokenLayout = <MlaBf16 as crate::KvLayout>::LAYOUT;
/// [`MlaFp8`]'s layout: 576 B/token.
pub const MLA_FP8: TokenLayout = <MlaFp8 as crate::KvLayout>::LAYOUT;
/// [`DsaMlaFp8`]'s layout: 656 B/token.
pub const DSA_MLA_FP8: TokenLayout = <DsaMlaFp8 as crate::KvLayout>::LAYOUT;
/// [`Dsv4MlaFp8`]'s layout: 584 B/token, two planes, pages aligned to 576 B.
pub const DSV4_MLA_FP8: TokenLayout = <Dsv4MlaFp8 as crate::KvLayout>::LAYOUT;
/// [`MhaBf16Heads8x128`]'s layout: 4096 B/token.
pub const MHA_BF16_8X128: TokenLayout = <MhaBf16Heads8x128 as crate::KvLayout>::LAYOUT;
/// [`MhaFp8Heads8x128`]'s layout: 2048 B/token.
pub const MHA_FP8_8X128: TokenLayout = <MhaFp8Heads8x128 as crate::KvLayout>::LAYOUT;
/// [`MhaMxfp8Heads8x128`]'s layout: 2112 B/token.
pub const MHA_MXFP8_8X128: TokenLayout = <MhaMxfp8Heads8x128 as crate::KvLayout>::LAYOUT;

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

#[cfg(test)]
mod tests {
    //! The derive's output against the hand-written descriptors these formats had before the
    //! derive, and against numbers worked by hand from the sources.

    use super::*;
    use crate::{Arrangement, Cow, Dtype, KvLayout, Section};

    /// The pre-derive hand-written descriptors, verbatim: same sections, names, order, dtypes,
    /// shapes, scale relations, arrangement and alignment.
    fn hand_written() -> Vec<(&'static str, TokenLayout)> {
        vec![
            (
                "index_k_fp8",
                TokenLayout::new(
                    Arrangement::SectionMajor,
                    crate::sections![
                        Section::new("values", Dtype::F8E4M3, &[128]),
                        Section::scale_of("scale", Dtype::F32, &[1], 0, 128),
                    ],
                ),
            ),
            (
                "index_k_bf16",
                TokenLayout::new(
                    Arrangement::SectionMajor,
                    crate::sections![Section::new("values", Dtype::Bf16, &[128])],
                ),
            ),
            (
                "index_k_fp4",
                TokenLayout::new(
                    Arrangement::SectionMajor,
                    crate::sections![
                        Section::new("values", Dtype::F4E2M1, &[128]),
                        Section::scale_of("scale", Dtype::Ue8m0, &[4], 0, 32),
                    ],
                ),
            ),
            (
                "mla_bf16",
                TokenLayout::new(
                    Arrangement::TokenMajor,
                    crate::sections![
                        Section::new("latent", Dtype::Bf16, &[512]),
                        Section::new("rope", Dtype::Bf16, &[64]),
                    ],
                ),
            ),
            (
                "mla_fp8",
                TokenLayout::new(
                    Arrangement::TokenMajor,
                    crate::sections![
                        Section::new("latent", Dtype::F8E4M3, &[512]),
                        Section::new("rope", Dtype::F8E4M3, &[64]),
                    ],
                ),
            ),
            (
                "dsa_mla_fp8",
                TokenLayout::new(
                    Arrangement::TokenMajor,
                    crate::sections![
                        Section::new("nope", Dtype::F8E4M3, &[512]),
                        Section::scale_of("nope_scale", Dtype::F32, &[4], 0, 128),
                        Section::new("rope", Dtype::Bf16, &[64]),
                    ],
                ),
            ),
            (
                "dsv4_mla_fp8",
                TokenLayout {
                    arrangement: Arrangement::Planes(Cow::Borrowed(&[
                        Cow::Borrowed(&[0, 1]),
                        Cow::Borrowed(&[2, 3]),
                    ])),
                    sections: Cow::Borrowed(crate::sections![
                        Section::new("nope", Dtype::F8E4M3, &[448]),
                        Section::new("rope", Dtype::Bf16, &[64]),
                        Section::scale_of("scale", Dtype::Ue8m0, &[7], 0, 64),
                        Section::new("pad", Dtype::U8, &[1]),
                    ]),
                    page_align_bytes: Some(576),
                    page_stride_bytes: None,
                },
            ),
            (
                "mha_bf16_8x128",
                TokenLayout::new(
                    Arrangement::SectionMajor,
                    crate::sections![
                        Section::new("k", Dtype::Bf16, &[8, 128]),
                        Section::new("v", Dtype::Bf16, &[8, 128]),
                    ],
                ),
            ),
            (
                "mha_fp8_8x128",
                TokenLayout::new(
                    Arrangement::SectionMajor,
                    crate::sections![
                        Section::new("k", Dtype::F8E4M3, &[8, 128]),
                        Section::new("v", Dtype::F8E4M3, &[8, 128]),
                    ],
                ),
            ),
            (
                "mha_mxfp8_8x128",
                TokenLayout::new(
                    Arrangement::SectionMajor,
                    crate::sections![
                        Section::new("k", Dtype::F8E4M3, &[8, 128]),
                        Section::new("v", Dtype::F8E4M3, &[8, 128]),
                        Section::scale_of("k_scale", Dtype::Ue8m0, &[8, 4], 0, 32),
                        Section::scale_of("v_scale", Dtype::Ue8m0, &[8, 4], 1, 32),
                    ],
                ),
            ),
        ]
    }

    #[test]
    fn derived_layouts_equal_the_hand_written_ones() {
        let derived = all();
        let hand = hand_written();
        assert_eq!(derived.len(), 10);
        for (format, (name, layout)) in derived.iter().zip(&hand) {
            assert_eq!(format.name, *name);
            assert_eq!(&format.layout, layout, "format {name}");
            assert_eq!(
                format.layout.fingerprint(),
                layout.fingerprint(),
                "format {name}"
            );
        }
    }

    /// Bytes per token and the stride of a 64-token page, each worked by hand.
    #[test]
    fn bytes_per_token_and_page_stride_by_hand() {
        let expected: [(&str, u64, u64); 10] = [
            // 128 e4m3 x 1 B + 1 f32 x 4 B = 132; 64 x 132 = 8448.
            ("index_k_fp8", 132, 8448),
            // 128 bf16 x 2 B = 256; 64 x 256 = 16384.
            ("index_k_bf16", 256, 16384),
            // 128 e2m1 x 4 bit / 8 = 64 B + 4 ue8m0 x 1 B = 68; 64 x 68 = 4352.
            ("index_k_fp4", 68, 4352),
            // (512 + 64) bf16 x 2 B = 1152; 64 x 1152 = 73728.
            ("mla_bf16", 1152, 73728),
            // (512 + 64) e4m3 x 1 B = 576; 64 x 576 = 36864.
            ("mla_fp8", 576, 36864),
            // 512 x 1 + 4 x 4 + 64 x 2 = 512 + 16 + 128 = 656; 64 x 656 = 41984.
            ("dsa_mla_fp8", 656, 41984),
            // 448 x 1 + 64 x 2 + 7 x 1 + 1 x 1 = 448 + 128 + 7 + 1 = 584;
            // 64 x 584 = 37376, rounded up to a multiple of 576: 37376 / 576 = 64.89 -> 65 x 576 = 37440.
            ("dsv4_mla_fp8", 584, 37440),
            // 2 x 8 x 128 x 2 B = 4096; 64 x 4096 = 262144.
            ("mha_bf16_8x128", 4096, 262144),
            // 2 x 8 x 128 x 1 B = 2048; 64 x 2048 = 131072.
            ("mha_fp8_8x128", 2048, 131072),
            // 2 x 1024 + 2 x (8 x 4) x 1 B = 2048 + 64 = 2112; 64 x 2112 = 135168.
            ("mha_mxfp8_8x128", 2112, 135168),
        ];
        for (name, bytes, stride) in expected {
            let f = by_name(name).expect("built-in format");
            assert_eq!(f.layout.bytes_per_token(), Ok(bytes), "{name}");
            assert_eq!(f.layout.page_stride_bytes(64), Ok(stride), "{name}");
        }
    }

    /// The associated constants agree with the layout (BYTES_PER_TOKEN evaluated at compile
    /// time) and NAME is the struct name.
    #[test]
    fn associated_constants() {
        const FP8: u64 = IndexKFp8::BYTES_PER_TOKEN;
        assert_eq!(FP8, 132);
        assert_eq!(IndexKBf16::BYTES_PER_TOKEN, 256);
        assert_eq!(IndexKFp4::BYTES_PER_TOKEN, 68);
        assert_eq!(Dsv4MlaFp8::BYTES_PER_TOKEN, 584);
        assert_eq!(MhaMxfp8Heads8x128::BYTES_PER_TOKEN, 2112);
        assert_eq!(IndexKFp8::NAME, "IndexKFp8");
        assert_eq!(IndexKFp8::FINGERPRINT, INDEX_K_FP8.fingerprint());
        assert_ne!(IndexKFp8::FINGERPRINT, IndexKBf16::FINGERPRINT);
        crate::assert_bytes_per_token!(DsaMlaFp8, 656);
    }
}
