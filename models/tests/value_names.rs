//! With the feature `clap` the CLI's value enums are these types: every spelling `from_name`
//! takes is taken by clap as well (case-insensitively, as the CLI's `ignore_case` asks), to the
//! same value, and a spelling `from_name` refuses is refused by both.
#![cfg(feature = "clap")]

use clap::ValueEnum;
use kvlayout_models::{IndexK, KvDtype, StateDtype};

/// clap's parse of `s`, ignoring case.
fn clap<T: ValueEnum>(s: &str) -> Option<T> {
    <T as ValueEnum>::from_str(s, true).ok()
}

#[test]
fn kv_dtype_spellings_agree() {
    // bf16 and torch's bfloat16; fp8 e4m3 in the names engines and torch give it.
    for (s, want) in [
        ("bf16", KvDtype::Bf16),
        ("BFloat16", KvDtype::Bf16),
        ("fp8", KvDtype::Fp8),
        ("fp8_e4m3", KvDtype::Fp8),
        ("f8e4m3", KvDtype::Fp8),
        ("float8_e4m3fn", KvDtype::Fp8),
    ] {
        assert_eq!(KvDtype::from_name(s), Some(want), "from_name({s})");
        assert_eq!(clap::<KvDtype>(s), Some(want), "clap {s}");
    }
    for s in ["fp4", "e5m2", ""] {
        assert_eq!(KvDtype::from_name(s), None, "from_name({s})");
        assert_eq!(clap::<KvDtype>(s), None, "clap {s}");
    }
}

#[test]
fn index_k_spellings_agree() {
    for (s, want) in [
        ("fp8", IndexK::Fp8),
        ("float8_e4m3fn", IndexK::Fp8),
        ("bf16", IndexK::Bf16),
        ("bfloat16", IndexK::Bf16),
        ("FP4", IndexK::Fp4),
    ] {
        assert_eq!(IndexK::from_name(s), Some(want), "from_name({s})");
        assert_eq!(clap::<IndexK>(s), Some(want), "clap {s}");
    }
    for s in ["fp16", "e2m1", ""] {
        assert_eq!(IndexK::from_name(s), None, "from_name({s})");
        assert_eq!(clap::<IndexK>(s), None, "clap {s}");
    }
}

#[test]
fn state_dtype_spellings_agree() {
    for (s, want) in [
        ("f32", StateDtype::F32),
        ("float32", StateDtype::F32),
        ("fp32", StateDtype::F32),
        ("bf16", StateDtype::Bf16),
        ("bfloat16", StateDtype::Bf16),
        ("f16", StateDtype::F16),
        ("float16", StateDtype::F16),
        ("FP16", StateDtype::F16),
    ] {
        assert_eq!(StateDtype::from_name(s), Some(want), "from_name({s})");
        assert_eq!(clap::<StateDtype>(s), Some(want), "clap {s}");
    }
    for s in ["fp8", "f64", ""] {
        assert_eq!(StateDtype::from_name(s), None, "from_name({s})");
        assert_eq!(clap::<StateDtype>(s), None, "clap {s}");
    }
}
