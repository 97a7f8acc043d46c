//! # kvlayout-replay
//!
//! Workloads driven through the checked pools of `kvlayout-pool`, behind `kvlayout replay`:
//!
//! - [`trace_replay`]: a Mooncake FAST'25 request trace ([`trace`]: streaming JSONL reader) on a
//!   page-accurate model of SGLang's HiCache ([`schedule`]: radix prefix cache over 64-token
//!   pages, LRU eviction, write-back or write-through to the host, loads before prefill); the
//!   bytes of the simulated layers move through [`kvlayout_pool::HiCache`] ([`store`]) and the
//!   DeepSeek sparse indexer ([`indexer`]) reads the index-K keys back for every request that
//!   loaded pages from the host. The conversation trace is embedded
//!   ([`trace_replay::CONVERSATION_TRACE`], Apache-2.0, see `data/SOURCE.md`).
//! - [`synthetic`]: the multi-turn synthetic workload (`--workload synthetic`).
//! - [`codec`]: f32 values to a token layout's bytes and back (fp8 index-K with DeepSeek's
//!   quantizer from `kvlayout-kernels`); [`report`]: what a trace replay prints (the CLI draws
//!   it with `--plot`).
//!
//! Exit codes of the CLI: 0 ran clean, 1 pairing refused, 2 bad input ([`ReplayError`]),
//! 3 requests (or sessions) corrupted.
//!
//! ```
//! use kvlayout_core::MemoryLayout;
//! use kvlayout_models::{IndexK, Model, PoolOptions};
//! use kvlayout_pool::ChecksumMode;
//! use kvlayout_replay::schedule::WritePolicy;
//! use kvlayout_replay::trace_replay::{TraceHost, TraceInput, TraceOutcome, run_trace};
//!
//! // Two requests one second apart sharing their first 512-token block; the second one's
//! // second block is new. A 16-page device pool holds both (8 pages per block).
//! let trace = concat!(
//!     r#"{"timestamp": 0, "input_length": 1024, "output_length": 8, "hash_ids": [7, 8]}"#, "\n",
//!     r#"{"timestamp": 1000, "input_length": 1024, "output_length": 8, "hash_ids": [7, 9]}"#, "\n",
//! );
//! let input = TraceInput {
//!     model: Model::builtin("deepseek-v3.2-exp").unwrap()?,
//!     pool: PoolOptions { index_k: IndexK::Bf16, ..PoolOptions::default() },
//!     device_pages: Some(32),
//!     host: TraceHost::Mirror { pages: Some(64), memory_layout: MemoryLayout::PageFirst },
//!     verify: true,
//!     layers: 1,
//!     buffers: None,
//!     top_k: 16,
//!     indexer_heads: 8,
//!     seed: 2026,
//!     write_policy: WritePolicy::WriteBack,
//!     prefill_tokens_per_s: 20_000,
//!     decode_ms_per_token: 20,
//!     trace_name: "two requests".into(),
//!     checksum: ChecksumMode::Off,
//! };
//! let TraceOutcome::Completed(r) = run_trace(&input, trace.as_bytes(), &mut |_| {})? else {
//!     panic!("a mirrored host pool pairs");
//! };
//! assert_eq!(r.requests, 2);
//! // Block 7 (512 tokens) is still on the device for the second request.
//! assert_eq!(r.device_tokens, 512);
//! assert_eq!(r.recomputed_tokens, 2 * 1024 - 512);
//! assert_eq!(r.corrupted_requests, 0);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![warn(missing_docs)]
#![warn(clippy::missing_errors_doc)]

pub mod codec;
mod error;
pub mod indexer;
pub mod pairing;
pub mod report;
pub mod rng;
pub mod schedule;
pub mod store;
pub mod synthetic;
pub mod trace;
mod trace_line;
pub mod trace_replay;

pub use error::{NOT_FULL_ATTENTION, Param, ReplayError};
pub use pairing::{HostSource, read_host_geometry};
