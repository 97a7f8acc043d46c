//! The crate's errors, one enum per operation: building or accessing a pool ([`PoolError`]),
//! pairing two pools ([`PairError`]), a transfer ([`TransferError`]). Every variant names the
//! field, page or pair and both values; a refused transfer moved no byte.

use kvlayout_core::{GeometryError, LayoutError, MemoryLayout, Mismatch};

use crate::backend::BackendError;
use crate::checksum::{PageMismatch, refused_pairs};
use crate::plan::{PagePair, Transferred};

/// An error building or accessing a pool.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PoolError {
    /// The geometry breaks a rule, or an index is out of range (the message names the field
    /// and both values).
    #[error("geometry: {0}")]
    Geometry(#[from] GeometryError),
    /// A device pool must be `layer_first`.
    #[error("device pool memory_layout: expected layer_first, got {got}")]
    DeviceLayout {
        /// The layout asked for.
        got: MemoryLayout,
    },
    /// A device page is claimed by a transfer in flight ([`crate::ConcurrentHiCache`]): retry
    /// once the transfer ends.
    #[error("device page {page} is in use by a transfer (retry when it ends)")]
    PageBusy {
        /// The device page.
        page: u64,
    },
    /// The geometry's pool fingerprint cannot be computed.
    #[error("fingerprint: {0}")]
    Fingerprint(LayoutError),
    /// `write_token` got the wrong number of sections, or a section of the wrong length.
    #[error("{buffer}.{field}: expected {expected}, got {got}")]
    TokenShape {
        /// Buffer name.
        buffer: String,
        /// `sections` or `sections[i] (name) bytes`.
        field: String,
        /// What the layout says.
        expected: u64,
        /// What was passed.
        got: u64,
    },
    /// A byte range that does not fit the page.
    #[error("{buffer}: bytes [{start_bytes}, {end_bytes}) outside the {page_bytes}-byte page")]
    PageRange {
        /// Buffer name.
        buffer: String,
        /// First byte inside the page.
        start_bytes: u64,
        /// One past the last byte.
        end_bytes: u64,
        /// Page payload bytes.
        page_bytes: u64,
    },
    /// The memory backend refused.
    #[error("backend: {0}")]
    Backend(#[from] BackendError),
}

/// Why a pairing was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PairError {
    /// The host pool's geometry cannot exchange pages with the device pool's: every differing
    /// field, `field: device value, host value`.
    #[error("host pool does not match the device pool:\n{0}")]
    Mismatch(Mismatch),
    /// The geometries compare equal but a page route could not be laid (a page past a
    /// region, an offset overflow); names the buffer and the values.
    #[error("page route: {0}")]
    Route(TransferError),
}

/// Why the shim refused a transfer. Every variant names the field or pages and both values.
/// A refused transfer moved no byte.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TransferError {
    /// The geometries differ (the inspection path re-runs the pairing's comparison): every
    /// differing field, `field: device value, host value`.
    #[error("geometries differ:\n{0}")]
    Mismatch(Mismatch),
    /// A field differs between the sides (`mode` of a cache to share, a buffer missing on the
    /// host, `{buffer}.layers`).
    #[error("{field}: device {device}, host {host}")]
    Field {
        /// Field path.
        field: String,
        /// Device value.
        device: String,
        /// Host value.
        host: String,
    },
    /// A request these pools cannot serve yet, naming the geometry field that prevents it.
    #[error("{field}: {reason}")]
    Unsupported {
        /// The field (`kv.layer_ids`).
        field: String,
        /// Why, and what works instead.
        reason: &'static str,
    },
    /// The layer asked for is past every buffer's layer count.
    #[error("layer {layer} out of range (the deepest buffer has {layers} layers)")]
    Layer {
        /// Requested layer.
        layer: u64,
        /// Largest layer count.
        layers: u64,
    },
    /// A model layer id no buffer serves (the buffers give `layer_ids`).
    #[error(
        "layer {layer}: no buffer serves model layer {layer} (the buffers' layer_ids cover {served} layers, {first}..={last})"
    )]
    ModelLayer {
        /// Requested model layer id.
        layer: u64,
        /// Model layers served by some buffer.
        served: u64,
        /// Smallest served.
        first: u64,
        /// Largest served.
        last: u64,
    },
    /// A page index past the end of one side.
    #[error("pairs[{pair}]: {side} page {page} out of range ({side} pool has {pages} pages)")]
    PageOutOfRange {
        /// Index in the pair list.
        pair: usize,
        /// `device` or `host`.
        side: &'static str,
        /// The page asked for.
        page: u64,
        /// Pages of that pool.
        pages: u64,
    },
    /// Two pairs write the same destination page.
    #[error("pairs[{pair}]: {side} page {page} is already the destination of pairs[{first}]")]
    DuplicateDestination {
        /// Index of the second pair.
        pair: usize,
        /// Index of the first pair.
        first: usize,
        /// `device` or `host`.
        side: &'static str,
        /// The page.
        page: u64,
    },
    /// A run reaches outside one region.
    #[error("{buffer} run {run}: {source}")]
    Range {
        /// Buffer name.
        buffer: String,
        /// Index of the run in the buffer's plan.
        run: usize,
        /// The range and the region.
        #[source]
        source: BackendError,
    },
    /// Offsets could not be computed (overflow, index out of range).
    #[error("geometry: {0}")]
    Geometry(#[from] GeometryError),
    /// The backend failed executing a checked plan; no byte moved.
    #[error("backend: {0}")]
    Backend(BackendError),
    /// More pairs than the destination pool has pages: some destination page would be named
    /// twice. Refused before any work proportional to the list.
    #[error(
        "{pairs} pairs for a {side} pool of {pages} pages: a destination page would be named twice"
    )]
    TooManyPairs {
        /// Pairs in the list.
        pairs: u64,
        /// The destination side, `device` or `host`.
        side: &'static str,
        /// Pages of the destination pool.
        pages: u64,
    },
    /// The backend failed part way through a checked transfer. Runs execute pair by pair
    /// (every buffer and layer of a pair, then the next pair), so `moved_pairs` (a prefix of
    /// the list) were copied in full, `torn_pair` (the next one, if any) in part — its
    /// destination page holds old and new bytes and must not be trusted — and every later
    /// pair's destination page is untouched.
    #[error(
        "interrupted after {} pair(s) moved in full{}: {source}",
        moved_pairs.len(),
        torn_pair.map_or_else(String::new, |p| format!(
            ", pair (device {}, host {}) torn", p.device_page, p.host_page
        ))
    )]
    Interrupted {
        /// Pairs copied in full, in list order (a prefix of the list).
        moved_pairs: Vec<PagePair>,
        /// The pair being copied when the backend failed, if the failure fell inside a pair.
        torn_pair: Option<PagePair>,
        /// Runs copied in full.
        moved_runs: u64,
        /// The backend's error.
        #[source]
        source: BackendError,
    },
    /// A pool of a checked pairing is not the pool it was at pairing (its fingerprint, page
    /// count or region length differs): the pools or the pairing were changed after pairing.
    #[error("{side} pool {fact}: {} at pairing, {} now", fact.show(*paired), fact.show(*actual))]
    PoolChanged {
        /// `device` or `host`.
        side: &'static str,
        /// Which fact differs.
        fact: PoolFact,
        /// The value recorded at pairing.
        paired: u64,
        /// The pool's value now.
        actual: u64,
    },
    /// A pair's runs of one buffer reach past one region (the routes or the pools changed
    /// after pairing).
    #[error("pairs[{pair}] {buffer}: {source}")]
    PairRange {
        /// Index in the pair list.
        pair: usize,
        /// Buffer name.
        buffer: String,
        /// The range and the region.
        #[source]
        source: BackendError,
    },
    /// A load's pages do not match the checksums recorded at their backup
    /// ([`crate::ChecksumMode`]): the copy ran (`transferred`), but these pages must not be
    /// used: the caller treats them as a miss and recomputes them. Every other page of the load
    /// verified (or was not sampled).
    #[error(
        "checksum mismatch on {} page payload(s) in {} pair(s), refused (treat them as a miss); first: {}",
        mismatches.len(),
        refused_pairs(mismatches).len(),
        mismatches.first().map_or_else(String::new, ToString::to_string)
    )]
    ChecksumMismatch {
        /// What the load moved.
        transferred: Transferred,
        /// Page payloads verified (one per buffer, layer and page), the mismatches included.
        checksummed_pages: u64,
        /// Every mismatching page, in (pair, buffer, layer) order.
        mismatches: Vec<PageMismatch>,
    },
    /// A concurrent transfer holds a page this one needs (a destination page is being read or
    /// written, or a source page is being written, by another transfer). Nothing moved.
    #[error("pairs[{pair}]: {side} page {page} is in use by another transfer")]
    Busy {
        /// Index in the pair list.
        pair: usize,
        /// `device` or `host`.
        side: &'static str,
        /// The page.
        page: u64,
    },
}

/// A fact of a pool that a checked pairing records and every transfer compares
/// ([`TransferError::PoolChanged`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PoolFact {
    /// [`kvlayout_core::PoolGeometry::fingerprint`].
    Fingerprint,
    /// [`kvlayout_core::PoolGeometry::pages`].
    Pages,
    /// Length of the memory region in bytes.
    LenBytes,
}

impl PoolFact {
    fn show(self, v: u64) -> String {
        match self {
            PoolFact::Fingerprint => format!("{v:#018x}"),
            PoolFact::Pages | PoolFact::LenBytes => v.to_string(),
        }
    }
}

impl std::fmt::Display for PoolFact {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PoolFact::Fingerprint => "fingerprint",
            PoolFact::Pages => "pages",
            PoolFact::LenBytes => "len_bytes",
        })
    }
}
