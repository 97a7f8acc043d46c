//! The error that stops a replay. A refused pairing is an outcome, not an error.

use kvlayout_models::ModelError;
use kvlayout_pool::PoolError;

use crate::codec::CodecError;
use crate::trace::TraceError;

/// An error that stops a replay (bad input, a pool too small); the CLI exits 2 on it.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// The model config cannot be mapped.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// A pool cannot be built or accessed.
    #[error("pool: {0}")]
    Pool(#[from] PoolError),
    /// Encoding or decoding failed.
    #[error("codec: {0}")]
    Codec(#[from] CodecError),
    /// A trace line is not a valid request.
    #[error(transparent)]
    Trace(#[from] TraceError),
    /// The model's pool has a buffer that does not keep every token (sliding window, chunked
    /// local attention, recurrent state): the page schedule models full-attention pools only.
    #[error("model {model}: {buffers}; {NOT_FULL_ATTENTION}")]
    NotFullAttention {
        /// The model's name.
        model: String,
        /// The buffers that are not full attention, each with what it keeps.
        buffers: String,
    },
    /// A workload parameter is out of range, or the pools it sizes cannot hold the workload.
    #[error("workload: {param}: {problem}{}", defaulted_text(*param, defaulted))]
    Workload {
        /// The parameter.
        param: Param,
        /// What is wrong, with the values.
        problem: String,
        /// Where the parameter's value came from when the caller did not give it (`the
        /// default 1938 pages came from ...`).
        defaulted: Option<String>,
    },
}

/// The tail of [`ReplayError::NotFullAttention`]'s message.
pub const NOT_FULL_ATTENTION: &str = "`kvlayout describe` covers this model, but the replay's \
     page schedule models full-attention pools only (every buffer keeps every token)";

fn defaulted_text(param: Param, defaulted: &Option<String>) -> String {
    match defaulted {
        Some(from) => format!(" ({param} not given: {from})"),
        None => String::new(),
    }
}

/// A workload parameter, in the replay's own terms (a front end maps each to its option: the
/// CLI's `--device-pages` for [`Param::DevicePages`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Param {
    /// Sessions of the synthetic workload.
    Sessions,
    /// Simulated layers.
    Layers,
    /// Turns per session.
    Turns,
    /// Shared-prefix groups of the synthetic workload.
    PrefixGroups,
    /// Sessions in flight.
    Concurrency,
    /// Device pool pages.
    DevicePages,
    /// Host pool pages.
    HostPages,
    /// Heads of the sparse indexer.
    IndexerHeads,
    /// Tokens the sparse indexer keeps.
    TopK,
    /// Buffers moved.
    Buffers,
    /// Tokens per page of the model's pool.
    PageSizeTokens,
    /// Prefill speed of the schedule.
    PrefillTokensPerS,
    /// Decode time per token of the schedule.
    DecodeMsPerToken,
    /// Memory layout of the mirrored host pool.
    HostLayout,
    /// The host pool as paired (its routes).
    HostPool,
    /// A page of the device pool.
    Pages,
    /// The page checksum mode.
    Checksum,
}

impl Param {
    /// The parameter's name (a [`crate::synthetic::Workload`] or
    /// [`crate::trace_replay::TraceInput`] field where there is one).
    pub const fn name(self) -> &'static str {
        match self {
            Param::Sessions => "sessions",
            Param::Layers => "layers",
            Param::Turns => "turns",
            Param::PrefixGroups => "prefix_groups",
            Param::Concurrency => "concurrency",
            Param::DevicePages => "device_pages",
            Param::HostPages => "host_pages",
            Param::IndexerHeads => "indexer_heads",
            Param::TopK => "top_k",
            Param::Buffers => "buffers",
            Param::PageSizeTokens => "page_size_tokens",
            Param::PrefillTokensPerS => "prefill_tokens_per_s",
            Param::DecodeMsPerToken => "decode_ms_per_token",
            Param::HostLayout => "host_layout",
            Param::HostPool => "host_pool",
            Param::Pages => "pages",
            Param::Checksum => "checksum",
        }
    }
}

impl std::fmt::Display for Param {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A [`ReplayError::Workload`] with no default to explain.
pub(crate) fn workload_err(param: Param, problem: String) -> ReplayError {
    ReplayError::Workload {
        param,
        problem,
        defaulted: None,
    }
}
