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
//!   quantizer from `kvlayout-kernels`); [`report`] and [`plot`]: what a trace replay prints
//!   and draws.
//!
//! Exit codes of the CLI: 0 ran clean, 1 pairing refused, 2 bad input ([`ReplayError`]),
//! 3 requests (or sessions) corrupted.

#![warn(missing_docs)]

pub mod codec;
mod error;
pub mod indexer;
pub mod pairing;
pub mod plot;
pub mod report;
pub mod rng;
pub mod schedule;
pub mod store;
pub mod synthetic;
pub mod trace;
pub mod trace_replay;

pub use error::ReplayError;
pub use pairing::{HostSource, read_host_geometry};
