//! The configs under `configs/` (sources in `configs/README.md`), embedded in the binary so
//! `--model NAME` works from any directory. Names are matched case-insensitively, like dtype names.

/// The embedded configs: (name, file name under `configs/`, JSON text).
pub const BUILTIN: &[(&str, &str, &str)] = &[
    (
        "deepseek-v3.2-exp",
        "deepseek-v3.2-exp.json",
        include_str!("../../configs/deepseek-v3.2-exp.json"),
    ),
    (
        "deepseek-v3",
        "deepseek-v3.json",
        include_str!("../../configs/deepseek-v3.json"),
    ),
    (
        "kimi-k2",
        "kimi-k2.json",
        include_str!("../../configs/kimi-k2.json"),
    ),
    (
        "glm-4.5",
        "glm-4.5.json",
        include_str!("../../configs/glm-4.5.json"),
    ),
    (
        "llama-3.1-8b",
        "llama-3.1-8b.json",
        include_str!("../../configs/llama-3.1-8b.json"),
    ),
    (
        "llama-3.1-70b",
        "llama-3.1-70b.json",
        include_str!("../../configs/llama-3.1-70b.json"),
    ),
    (
        "qwen3-8b",
        "qwen3-8b.json",
        include_str!("../../configs/qwen3-8b.json"),
    ),
    (
        "qwen3-235b-a22b",
        "qwen3-235b-a22b.json",
        include_str!("../../configs/qwen3-235b-a22b.json"),
    ),
    (
        "gpt-oss-20b",
        "gpt-oss-20b.json",
        include_str!("../../configs/gpt-oss-20b.json"),
    ),
    (
        "qwen3-coder-next",
        "qwen3-coder-next.json",
        include_str!("../../configs/qwen3-coder-next.json"),
    ),
    (
        "gemma-3-4b-it",
        "gemma-3-4b-it.json",
        include_str!("../../configs/gemma-3-4b-it.json"),
    ),
    (
        "gemma-4-26b-a4b",
        "gemma-4-26b-a4b.json",
        include_str!("../../configs/gemma-4-26b-a4b.json"),
    ),
    (
        "nemotron-nano-9b-v2",
        "nemotron-nano-9b-v2.json",
        include_str!("../../configs/nemotron-nano-9b-v2.json"),
    ),
    (
        "llama-4-scout",
        "llama-4-scout.json",
        include_str!("../../configs/llama-4-scout.json"),
    ),
    (
        "recurrentgemma-2b",
        "recurrentgemma-2b.json",
        include_str!("../../configs/recurrentgemma-2b.json"),
    ),
    (
        "kimi-linear-48b-a3b",
        "kimi-linear-48b-a3b.json",
        include_str!("../../configs/kimi-linear-48b-a3b.json"),
    ),
    (
        "gemma-4-e2b-it",
        "gemma-4-e2b-it.json",
        include_str!("../../configs/gemma-4-e2b-it.json"),
    ),
    (
        "deepseek-v4-flash",
        "deepseek-v4-flash-0731.json",
        include_str!("../../configs/deepseek-v4-flash-0731.json"),
    ),
    (
        "mimo-v2-flash",
        "mimo-v2-flash.json",
        include_str!("../../configs/mimo-v2-flash.json"),
    ),
];

/// The built-in names, comma-separated (for help texts and errors).
pub fn names() -> String {
    BUILTIN
        .iter()
        .map(|(n, _, _)| *n)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The built-in entry named `name` (ASCII case-insensitive).
pub fn find(name: &str) -> Option<&'static (&'static str, &'static str, &'static str)> {
    BUILTIN
        .iter()
        .find(|(n, _, _)| n.eq_ignore_ascii_case(name))
}
