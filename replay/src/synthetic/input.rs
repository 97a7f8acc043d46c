//! What a synthetic replay takes ([`Workload`], [`ReplayInput`]) and reports
//! ([`ReplayOutcome`]: [`Refusal`] or [`ReplayReport`]).

use kvlayout_models::{Model, PoolOptions};
use serde::Serialize;

use crate::pairing::HostSource;

/// Workload parameters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Workload {
    /// Concurrent sessions.
    pub sessions: u64,
    /// Generator seed.
    pub seed: u64,
    /// Layers simulated (the first ones of the model).
    pub layers: u64,
    /// Turns per session.
    pub turns: u64,
    /// Groups of sessions sharing a prefix.
    pub prefix_groups: u64,
    /// Full pages of shared prefix per group.
    pub prefix_pages: u64,
    /// Prompt tokens appended per turn.
    pub user_tokens: u64,
    /// Tokens decoded per turn.
    pub decode_tokens: u64,
    /// Tokens the indexer selects per query.
    pub top_k: usize,
    /// Indexer heads simulated.
    pub indexer_heads: u64,
    /// Sessions per batch.
    pub concurrency: u64,
    /// Device pool pages.
    pub device_pages: u64,
}

impl Default for Workload {
    /// The `kvlayout replay` defaults: 80 sessions x 3 turns, 8 groups sharing 3 pages
    /// (192 tokens), 48 prompt + 8 decoded tokens per turn (a session ends at 192 + 3 x 56 =
    /// 360 tokens, 6 pages), 4 layers, top-16 of 8 indexer heads, batches of 16 sessions, and a
    /// device pool of 128 pages for a working set of 8 x 3 + 80 x 3 = 264 pages.
    fn default() -> Self {
        Workload {
            sessions: 80,
            seed: 2026,
            layers: 4,
            turns: 3,
            prefix_groups: 8,
            prefix_pages: 3,
            user_tokens: 48,
            decode_tokens: 8,
            top_k: 16,
            indexer_heads: 8,
            concurrency: 16,
            device_pages: 128,
        }
    }
}

/// Everything a replay needs.
#[derive(Clone, Debug)]
pub struct ReplayInput {
    /// The model.
    pub model: Model,
    /// KV dtype, index-K dtype, page size (the device `pages` come from the workload).
    pub pool: PoolOptions,
    /// Host pool geometry source.
    pub host: HostSource,
    /// Check geometry at pairing and before every transfer (false: `--no-verify`).
    pub verify: bool,
    /// Workload.
    pub workload: Workload,
}

/// Result of a replay.
#[derive(Clone, Debug)]
pub enum ReplayOutcome {
    /// Pairing refused: the host geometry cannot exchange pages with the device's.
    Refused(Refusal),
    /// The workload ran.
    Completed(Box<ReplayReport>),
}

/// A refused pairing.
#[derive(Clone, Debug, Serialize)]
pub struct Refusal {
    /// Model name.
    pub model: String,
    /// Sessions that would have run.
    pub sessions: u64,
    /// Host geometry source.
    pub host_geometry: String,
    /// `refused`.
    pub pairing: &'static str,
    /// `field: device value, host value` lines.
    pub mismatch: Vec<String>,
    /// Always 0: nothing ran.
    pub corrupted_sessions: u64,
    /// Always 0.
    pub refused_transfers: u64,
    /// Always 0.
    pub loaded_bytes: u64,
}

/// What a completed replay measured.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct ReplayReport {
    /// Model name.
    pub model: String,
    /// The model's layers.
    pub model_layers: u64,
    /// Layers simulated (the first ones).
    pub simulated_layers: u64,
    /// Format per buffer (`kv: dsa_mla_fp8`, `index_k: index_k_bf16`).
    pub formats: Vec<String>,
    /// Tokens per page.
    pub page_size_tokens: u64,
    /// Device pages.
    pub device_pages: u64,
    /// Host pages.
    pub host_pages: u64,
    /// Host memory layout.
    pub host_memory_layout: String,
    /// `mirror of the device pool` or the geometry file.
    pub host_geometry: String,
    /// `checked` or `unverified (--no-verify)`.
    pub pairing: String,
    /// Lines where the full-depth geometries differ (empty when compatible).
    pub mismatch: Vec<String>,
    /// Device pool fingerprint.
    pub device_fingerprint: String,
    /// Host pool fingerprint.
    pub host_fingerprint: String,
    /// Sessions.
    pub sessions: u64,
    /// Sessions with any top-k or latent difference from the reference.
    pub corrupted_sessions: u64,
    /// Sessions that had pages loaded back from the host pool at least once.
    pub sessions_with_loaded_pages: u64,
    /// Decode steps (all sessions, turns, tokens).
    pub decode_steps: u64,
    /// (step, layer) selections that differed.
    pub topk_mismatches: u64,
    /// Latent rows read that differed.
    pub latent_mismatches: u64,
    /// Whether the model has the DSA indexer (else sampled `kv` reads are compared).
    pub indexer: bool,
    /// Indexer top-k simulated.
    pub top_k: u64,
    /// Indexer heads simulated.
    pub indexer_heads: u64,
    /// Pages found on the device when their session (or prefix) came back.
    pub device_page_hits: u64,
    /// Pages backed up device -> host.
    pub backed_up_pages: u64,
    /// Pages loaded host -> device.
    pub loaded_pages: u64,
    /// Bytes copied device -> host.
    pub backed_up_bytes: u64,
    /// Bytes copied host -> device.
    pub loaded_bytes: u64,
    /// Backup transfers.
    pub backup_transfers: u64,
    /// Load transfers (one per layer per batch).
    pub load_transfers: u64,
    /// Transfers refused (by the shim, or a backend bound); their pages are recomputed.
    pub refused_transfers: u64,
    /// Pages rewritten from the generator after a refused transfer.
    pub recomputed_pages: u64,
    /// Why the first refused transfer was refused (none refused: `None`).
    pub first_refusal: Option<String>,
}
