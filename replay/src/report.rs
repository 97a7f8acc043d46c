//! What a trace replay reports (`kvlayout replay --json` prints [`TraceReport`] or
//! [`TraceRefusal`]).

use serde::Serialize;

use crate::schedule::{PageCounts, WritePolicy};

/// One minute of the trace (by arrival time).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Minute {
    /// Minute index from the first request (arrival `timestamp / 60000`).
    pub minute: u64,
    /// Requests that arrived.
    pub requests: u64,
    /// Of those, requests that loaded pages from the host.
    pub requests_with_host_hits: u64,
    /// Of those, requests whose indexer read differed from the reference.
    pub corrupted_requests: u64,
    /// Prompt tokens found on the device.
    pub device_tokens: u64,
    /// Prompt tokens loaded from the host.
    pub host_tokens: u64,
    /// Prompt tokens computed.
    pub recomputed_tokens: u64,
}

/// A completed trace replay.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TraceReport {
    /// Model name.
    pub model: String,
    /// Format per buffer (`kv: dsa_mla_fp8`, `index_k: index_k_bf16`).
    pub formats: Vec<String>,
    /// Trace name (`embedded: Mooncake FAST'25 conversation trace` or the path).
    pub trace: String,
    /// The model's layers.
    pub model_layers: u64,
    /// Layers whose bytes move through the pools (the first ones).
    pub simulated_layers: u64,
    /// Tokens per page.
    pub page_size_tokens: u64,
    /// Device pool pages (the page schedule's capacity).
    pub device_pages: u64,
    /// Where the device capacity comes from.
    pub device_pages_source: String,
    /// Host pool pages.
    pub host_pages: u64,
    /// Where the host capacity comes from.
    pub host_pages_source: String,
    /// Host memory layout.
    pub host_memory_layout: String,
    /// `mirror of the device pool` or the geometry file.
    pub host_geometry: String,
    /// `checked` or `unverified (--no-verify)`.
    pub pairing: String,
    /// Lines where the full-depth geometries differ (empty when compatible).
    pub mismatch: Vec<String>,
    /// Device pool fingerprint (all layers).
    pub device_fingerprint: String,
    /// Host pool fingerprint (all layers).
    pub host_fingerprint: String,
    /// Write policy.
    pub write_policy: WritePolicy,
    /// Prefill speed assumed per request.
    pub prefill_tokens_per_s: u64,
    /// Decode time assumed per output token.
    pub decode_ms_per_token: u64,
    /// What the bytes and the indexer sample, in words.
    pub sampled: String,
    /// Whether the model has the DSA indexer (else sampled rows are compared).
    pub indexer: bool,
    /// Indexer heads simulated.
    pub indexer_heads: u64,
    /// Indexer top-k simulated.
    pub top_k: u64,
    /// Requests replayed.
    pub requests: u64,
    /// Requests that loaded pages from the host.
    pub requests_with_host_hits: u64,
    /// `requests_with_host_hits / requests`.
    pub host_hit_share: f64,
    /// Requests whose indexer read (top-k set or latent rows) differed from the reference.
    pub corrupted_requests: u64,
    /// `corrupted_requests / requests`.
    pub corrupted_share: f64,
    /// Prompt tokens in the trace.
    pub prompt_tokens: u64,
    /// Prompt tokens found on the device.
    pub device_tokens: u64,
    /// Prompt tokens loaded from the host.
    pub host_tokens: u64,
    /// Prompt tokens computed.
    pub recomputed_tokens: u64,
    /// The page schedule's counters.
    pub pages: PageCounts,
    /// Bytes copied device -> host (simulated layers).
    pub backed_up_bytes: u64,
    /// Bytes copied host -> device (simulated layers).
    pub loaded_bytes: u64,
    /// Backup transfers.
    pub backup_transfers: u64,
    /// Load transfers (one per layer).
    pub load_transfers: u64,
    /// Why the first refused transfer was refused.
    pub first_refusal: Option<String>,
    /// Page checksum mode (`off`, `all`, `sampled:N`; `replay --checksum`).
    pub checksum: String,
    /// Page payloads verified against their backup's checksum at load (one per buffer,
    /// simulated layer and page).
    pub checksummed_pages: u64,
    /// Page payloads whose loaded bytes did not match their backup's checksum.
    pub checksum_mismatches: u64,
    /// Loads (one per request that loaded pages) with at least one mismatching page.
    pub checksum_mismatched_loads: u64,
    /// The first mismatch: buffer, layer, pages and both checksums.
    pub first_checksum_mismatch: Option<String>,
    /// Simulated time at which the last request finished, ms.
    pub end_ms: u64,
    /// Per-minute series.
    pub per_minute: Vec<Minute>,
}

/// A trace replay whose pairing was refused: nothing ran.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TraceRefusal {
    /// Model name.
    pub model: String,
    /// Trace name.
    pub trace: String,
    /// Host geometry source.
    pub host_geometry: String,
    /// `refused`.
    pub pairing: &'static str,
    /// `field: device value, host value` lines.
    pub mismatch: Vec<String>,
    /// Device pages asked for.
    pub device_pages: u64,
    /// Host pages of the host geometry.
    pub host_pages: u64,
    /// Always 0: nothing ran.
    pub requests: u64,
    /// Always 0.
    pub requests_with_host_hits: u64,
    /// Always 0.
    pub corrupted_requests: u64,
}

/// `part / whole`, 0 when `whole` is 0.
pub fn share(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
}
