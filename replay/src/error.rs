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
    #[error(
        "--model {model}: {buffers}; `kvlayout describe` covers this model, but the replay's \
         page schedule models full-attention pools only (every buffer keeps every token)"
    )]
    NotFullAttention {
        /// The model's name.
        model: String,
        /// The buffers that are not full attention, each with what it keeps.
        buffers: String,
    },
    /// A workload parameter is out of range.
    #[error("workload: {field}: {problem}")]
    Workload {
        /// Parameter (the CLI option's name where there is one, e.g. `--concurrency`).
        field: &'static str,
        /// What is wrong, with the values.
        problem: String,
    },
}

/// A [`ReplayError::Workload`].
pub(crate) fn workload_err(field: &'static str, problem: String) -> ReplayError {
    ReplayError::Workload { field, problem }
}
