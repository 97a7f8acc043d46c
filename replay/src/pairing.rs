//! The device and host pools of a replay: the model's full-depth geometry is compared with the
//! host's (the values `check` and `describe` print), then pools of the simulated layers are
//! built and paired (checked, or unverified for `--no-verify`).

use kvlayout_core::{Attention, MemoryLayout, PoolGeometry, compare, file};
use kvlayout_models::{Model, ModelError, PoolOptions};
use kvlayout_pool::backend::Backend;
use kvlayout_pool::{DevicePool, HiCache, HostPool, PairError, TransferMode, mirror_geometry};

use crate::error::{Param, ReplayError, workload_err};

/// Where the host pool's geometry comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HostSource {
    /// [`HostPool::mirror_of`] the device pool.
    Mirror {
        /// Host pages.
        pages: u64,
        /// Host memory layout.
        memory_layout: MemoryLayout,
    },
    /// A foreign geometry (a geometry file): its own pages and memory layout.
    Foreign {
        /// The geometry.
        geometry: PoolGeometry,
        /// Where it came from (path), for the report.
        source: String,
    },
}

/// Reads a host geometry file for `--host-geometry`.
///
/// # Errors
///
/// The file's path and the reader's message (I/O error, JSON error with its path, or the rule the
/// geometry breaks).
pub fn read_host_geometry(path: &std::path::Path) -> Result<PoolGeometry, String> {
    file::read_path(path).map_err(|e| format!("{}: {e}", path.display()))
}

/// What of the model's pools holds real bytes: the first `layers` layers of the buffers named
/// (all buffers when `buffers` is `None`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sample {
    /// Layers (the first ones).
    pub layers: u64,
    /// Buffer names, or all.
    pub buffers: Option<Vec<String>>,
}

/// The first `layers` layers of every buffer. A hybrid model's buffers name the model layers
/// they serve (`layer_ids`: gpt-oss-20b's `swa` serves 0, 2, .., `full` 1, 3, ..); the sampled
/// pools are addressed by buffer-local layer (the schedule loads layer 0 of every buffer, then
/// layer 1, ..), so the sample drops the ids. The pairing check and the fingerprints the report
/// prints are those of the whole model's pools, ids included.
pub(crate) fn truncate_layers(g: &PoolGeometry, layers: u64) -> PoolGeometry {
    let mut g = g.clone();
    for b in &mut g.buffers {
        b.layers = b.layers.min(layers);
        b.layer_ids = None;
    }
    g
}

/// Refuses a pool with a buffer whose attention is not `full`: the page schedule gives every
/// buffer one page per 64 tokens of a request and keeps them all, which a sliding-window or
/// chunked buffer (at most W / C tokens) or a state buffer (one slot per request, no token
/// axis) does not. The error names each such buffer and what it keeps.
///
/// # Errors
///
/// [`ReplayError::NotFullAttention`] naming `model` and every buffer whose attention is not `full`,
/// with what it keeps.
pub fn require_full_attention(model: &str, g: &PoolGeometry) -> Result<(), ReplayError> {
    let others: Vec<String> = g
        .buffers
        .iter()
        .filter_map(|b| {
            let keeps = match b.attention {
                Attention::Full => return None,
                Attention::SlidingWindow { window_tokens } => format!(
                    "a sliding window: the last {window_tokens} tokens of a request \
                     (attention: sliding_window_tokens {window_tokens})"
                ),
                Attention::Chunked { chunk_tokens } => format!(
                    "chunked local attention: at most {chunk_tokens} tokens of a request \
                     (attention: chunk_tokens {chunk_tokens})"
                ),
                Attention::State => "a recurrent state: one fixed-size slot per request, \
                                     no token axis (attention: state)"
                    .to_string(),
            };
            Some(format!("buffer `{}` keeps {keeps}", b.name()))
        })
        .collect();
    if others.is_empty() {
        return Ok(());
    }
    Err(ReplayError::NotFullAttention {
        model: model.to_string(),
        buffers: others.join("; "),
    })
}

/// `g` cut down to `sample`; a buffer name the geometry lacks is an error naming it.
fn sampled(g: &PoolGeometry, sample: &Sample) -> Result<PoolGeometry, ReplayError> {
    let mut g = truncate_layers(g, sample.layers);
    if let Some(names) = &sample.buffers {
        for (i, n) in names.iter().enumerate() {
            if names[..i].contains(n) {
                return Err(workload_err(
                    Param::Buffers,
                    format!("{n} is named twice (each buffer at most once)"),
                ));
            }
            if g.buffer_index(n).is_none() {
                return Err(workload_err(
                    Param::Buffers,
                    format!(
                        "{n}: no such buffer in {} (buffers: {})",
                        g.name,
                        g.buffers
                            .iter()
                            .map(|b| b.name().to_string())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                ));
            }
        }
        g.buffers.retain(|b| names.iter().any(|n| n == b.name()));
    }
    Ok(g)
}

/// What a replay report says about a pairing, whatever the workload: the report fields
/// `formats`, `host_geometry`, `pairing`, `mismatch` and the two fingerprints.
pub(crate) struct PairingFacts {
    /// Each buffer's storage format, `"name: format"`, in the model pool's buffer order.
    pub formats: Vec<String>,
    /// Where the host geometry came from: `"mirror of the device pool"` or the file's path.
    pub host_geometry: String,
    /// `"checked"` or `"unverified (--no-verify)"`.
    pub pairing: String,
    /// The fields in which the full-depth device and host geometries differ (empty when they
    /// pair).
    pub mismatch: Vec<String>,
    /// The full-depth device pool's fingerprint, `{:#018x}`.
    pub device_fingerprint: String,
    /// The full-depth host pool's fingerprint, `{:#018x}`.
    pub host_fingerprint: String,
}

/// Paired pools and what the report says about them.
pub(crate) struct Paired<B: Backend> {
    cache: HiCache<B>,
    facts: PairingFacts,
}

impl<B: Backend> Paired<B> {
    /// The paired pools, to run the workload on, and what the report says about them.
    pub(crate) fn into_parts(self) -> (HiCache<B>, PairingFacts) {
        (self.cache, self.facts)
    }
}

/// Pairing refused: the host geometry source and the differing fields.
pub(crate) struct Refused {
    pub host_source: String,
    pub mismatch: Vec<String>,
}

/// Builds and pairs the pools: `opts.pages` device pages, `layers` simulated layers.
pub(crate) fn pair_pools<B: Backend>(
    backend: B,
    model: &Model,
    opts: &PoolOptions,
    host: &HostSource,
    verify: bool,
    sample: &Sample,
) -> Result<Result<Paired<B>, Refused>, ReplayError> {
    let layers = sample.layers;
    let model_pool = model
        .pool(opts)
        .map_err(|e| device_pages_err(model, opts, e))?;
    // DeepSeek-V4's buffers are paged whole by the trace schedule (trace_replay module docs);
    // the synthetic workload refuses them before pairing.
    if model.attention() != kvlayout_models::Attention::Dsv4 {
        require_full_attention(&model.name, &model_pool.geometry)?;
    }
    let full_device = model_pool.geometry.clone();
    let (full_host, host_source) = match host {
        HostSource::Mirror {
            pages,
            memory_layout,
        } => (
            mirror_geometry(&full_device, *pages, *memory_layout),
            "mirror of the device pool".to_string(),
        ),
        HostSource::Foreign { geometry, source } => (geometry.clone(), source.clone()),
    };
    if let HostSource::Mirror {
        pages,
        memory_layout,
    } = host
    {
        check_mirror(&full_host, *pages, *memory_layout)?;
    }
    let mismatch: Vec<String> = match compare(&full_device, &full_host) {
        Ok(()) => Vec::new(),
        Err(m) => m.diffs.iter().map(|d| d.to_string()).collect(),
    };
    if verify && !mismatch.is_empty() {
        return Ok(Err(Refused {
            host_source,
            mismatch,
        }));
    }
    let model_layers = model.config.num_hidden_layers;
    if layers > model_layers {
        return Err(workload_err(
            Param::Layers,
            format!("{layers} simulated layers, but the model has {model_layers}"),
        ));
    }
    let device =
        DevicePool::new_in(backend.clone(), sampled(&full_device, sample)?).map_err(|e| {
            workload_err(
                Param::DevicePages,
                format!(
                    "{} pages x {layers} simulated layers: pool: {e}",
                    opts.pages
                ),
            )
        })?;
    let host_pool = match host {
        // The full-depth mirror passed `check_mirror`: what fails here is the allocation.
        HostSource::Mirror {
            pages,
            memory_layout,
        } => HostPool::mirror_of(&device, *pages, *memory_layout).map_err(|e| {
            workload_err(
                Param::HostPages,
                format!("{pages} pages x {layers} simulated layers: pool: {e}"),
            )
        })?,
        HostSource::Foreign { .. } => {
            HostPool::from_geometry_in(backend, sampled(&full_host, sample)?)?
        }
    };
    // The fingerprints of the pools as the model and the host file declare them (all layers),
    // the values a storage key or handshake would carry; the simulated pools hold a prefix of
    // the layers.
    let fingerprint = |g: &PoolGeometry| format!("{:#018x}", g.fingerprint().unwrap_or_default());
    let (device_fingerprint, host_fingerprint) =
        (fingerprint(&full_device), fingerprint(&full_host));
    let cache = if verify {
        match HiCache::pair(device, host_pool) {
            Ok(c) => c,
            Err(PairError::Mismatch(m)) => {
                return Ok(Err(Refused {
                    host_source,
                    mismatch: m.diffs.iter().map(|d| d.to_string()).collect(),
                }));
            }
            Err(e @ PairError::Route(_)) => {
                return Err(workload_err(Param::HostPool, e.to_string()));
            }
        }
    } else {
        HiCache::pair_unverified(device, host_pool)
    };
    let pairing = match cache.mode() {
        TransferMode::Checked => "checked".into(),
        TransferMode::Unverified => "unverified (--no-verify)".into(),
    };
    let formats = model_pool
        .geometry
        .buffers
        .iter()
        .zip(&model_pool.formats)
        .map(|(b, f)| format!("{}: {f}", b.name()))
        .collect();
    Ok(Ok(Paired {
        cache,
        facts: PairingFacts {
            formats,
            host_geometry: host_source,
            pairing,
            mismatch,
            device_fingerprint,
            host_fingerprint,
        },
    }))
}

/// The model's pool refused with `opts`: when the same pool of one page builds, the device page
/// count is what it refused (`x pages does not fit in 64 bits`), named as `--device-pages`;
/// otherwise the model's error as it is.
fn device_pages_err(model: &Model, opts: &PoolOptions, e: ModelError) -> ReplayError {
    let one_page = PoolOptions { pages: 1, ..*opts };
    if model.pool(&one_page).is_ok() {
        workload_err(Param::DevicePages, format!("{} pages: {e}", opts.pages))
    } else {
        e.into()
    }
}

/// Checks the full-depth host mirror (`g`, of `pages` pages in `memory_layout`) as the model
/// checks the device pool: a rule its memory layout breaks (`page_head` over MLA's latent) is
/// named as `--host-layout`, any other (zero pages, bytes that overflow) as `--host-pages`.
fn check_mirror(
    g: &PoolGeometry,
    pages: u64,
    memory_layout: MemoryLayout,
) -> Result<(), ReplayError> {
    let checked = g.validate().and_then(|()| g.total_bytes().map(|_| ()));
    match checked {
        Ok(()) => Ok(()),
        Err(e) if e.field == "memory_layout" => Err(workload_err(
            Param::HostLayout,
            format!("{memory_layout}: host pool geometry: {e}"),
        )),
        Err(e) => Err(workload_err(
            Param::HostPages,
            format!("{pages} pages: host pool geometry: {e}"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geometry(model: &str) -> PoolGeometry {
        let m = Model::load(model).unwrap();
        m.pool(&PoolOptions::default()).unwrap().geometry
    }

    /// llama-4-scout: 36 chunked layers (config.json `attention_chunk_size` 8192) in buffer
    /// `chunked`, 12 full ones in `full`: refused, naming `chunked` and its chunk; llama-3.1-8b
    /// (every layer full) passes.
    #[test]
    fn only_full_attention_pools_pass() {
        let e = require_full_attention("llama-4-scout", &geometry("llama-4-scout"))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with(
                "model llama-4-scout: buffer `chunked` keeps chunked local attention: at most \
                 8192 tokens of a request (attention: chunk_tokens 8192); `kvlayout describe` \
                 covers this model"
            ),
            "{e}"
        );
        assert!(!e.contains("`full`"), "{e}");
        require_full_attention("llama-3.1-8b", &geometry("llama-3.1-8b")).unwrap();
    }
}
