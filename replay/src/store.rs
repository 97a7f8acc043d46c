//! The bytes behind the trace replay's page schedule: every page the schedule computes is
//! written into the device pool, every backup and load goes through the checked [`HiCache`],
//! and the sparse indexer reads the index-K keys back from the device pool for each request that
//! loaded pages from the host.
//!
//! Page contents are deterministic in (block hash id, page in block): the page takes one of
//! [`TEMPLATES`] pre-encoded template pages (`mix(seed ^ mix(hash_id) ^ page) % TEMPLATES`), so
//! equal prefixes hold equal keys and a page is written with one copy per buffer and layer.
//! Template tokens are encoded with the model's token layouts by [`crate::codec`] (fp8 index-K
//! with DeepSeek's quantizer) and placed by the pool's own accessors.
//!
//! The check, per simulated layer: the request's query is one of [`QUERIES`] fixed queries; every
//! token's index-K bytes are read from the device pool; a key whose bytes equal its template's
//! scores what the template's key scores (a score is a function of the bytes: computed once per
//! template token and query), any other key is decoded and scored. The top-k set is compared
//! with the reference (templates only), and the latent rows (`kv`) of the selected tokens with
//! their template rows. Models without an indexer compare every buffer's rows of `top_k`
//! sampled tokens.

use kvlayout_core::TokenLayout;
use std::collections::HashSet;

use kvlayout_core::PoolGeometry;
use kvlayout_pool::backend::{Backend, Memory};
use kvlayout_pool::{
    BackendError, CopyRun, DevicePool, Direction, HiCache, KvPool, Layers, PagePair, PoolError,
    TransferError, TransferMode, page_copy_runs,
};

use crate::codec::{self, CodecError};
use crate::error::ReplayError;
use crate::indexer::{score, top_k_of_scores};
use crate::rng::{mix, unit};
use crate::schedule::{PageId, PageStore};
use crate::trace::Request;

/// Distinct template pages per buffer and layer.
pub const TEMPLATES: u64 = 16;
/// Distinct indexer queries.
pub const QUERIES: u64 = 4;

/// Indexer parameters of the check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IndexerParams {
    /// Tokens selected per query.
    pub top_k: usize,
    /// Indexer heads simulated.
    pub heads: u64,
    /// Seed of keys and queries.
    pub seed: u64,
}

/// Moves the schedule's pages through a [`HiCache`].
pub struct PoolStore<B: Backend> {
    cache: HiCache<B>,
    params: IndexerParams,
    layers: u64,
    page_size: u64,
    /// `[buffer]` rows in a page (its tokens per page; P / R for a buffer storing one row per
    /// R tokens, geometry v3; 1 for a state slot).
    rows: Vec<u64>,
    /// `[buffer]` tokens per row (R; the page's tokens for a state slot, which keeps one row).
    tokens_per_row: Vec<u64>,
    /// `[buffer][layer][template]` canonical page bytes.
    templates: Vec<Vec<Vec<Vec<u8>>>>,
    index_k: Option<usize>,
    /// The latent buffer, when its bytes move.
    kv: Option<usize>,
    /// `[layer][query][template * page_size + token]` reference scores.
    ref_scores: Vec<Vec<Vec<f32>>>,
    /// `[layer][query]` (q, w).
    queries: Vec<Vec<(Vec<f32>, Vec<f32>)>>,
    /// `[buffer]` token layouts.
    layouts: Vec<TokenLayout>,
    first_refusal: Option<String>,
    /// Loads (one per request that loaded pages, all its layers) with a checksum mismatch.
    checksum_mismatched_loads: u64,
    /// The first checksum mismatch, as the cache names it.
    first_checksum_mismatch: Option<String>,
    scratch: Vec<u8>,
    /// `Some` with overlap on ([`PoolStore::with_overlap`]).
    overlap: Option<Overlap<B>>,
}

/// The overlapped store's state: loads and backups are enqueued ([`HiCache::enqueue`]) and
/// waited for only before the device pool's bytes are read or written; computed pages are
/// copied from `staging` in one call per batch.
struct Overlap<B: Backend> {
    /// Every template page, `[buffer][layer][template]` in that order, in host memory of the
    /// pools' backend (pinned under CUDA).
    staging: B::HostMem,
    /// `[buffer][layer]` offset of template 0 in `staging` and the page's length; template
    /// `t` is `t` pages further.
    template_offsets_bytes: Vec<Vec<(u64, u64)>>,
    /// The device geometry (runs are laid without reaching the pools).
    geometry: PoolGeometry,
    /// Runs of computed pages not yet copied, and their device pages.
    runs: Vec<CopyRun>,
    pages: HashSet<u64>,
    /// Transfers are enqueued (a checked pairing; an unverified one has no enqueue).
    enqueue: bool,
    /// Where the checked pages' index-K bytes are read back to, in one call per layer.
    readback: Option<B::HostMem>,
}

fn value(
    seed: u64,
    template: u64,
    layer: u64,
    buffer: usize,
    section: usize,
    token: u64,
    elem: u64,
) -> f32 {
    unit(mix(seed
        ^ mix((template << 40)
            ^ (layer << 28)
            ^ ((buffer as u64) << 24)
            ^ ((section as u64) << 20)
            ^ (token << 12))
        ^ elem))
}

/// The sections of token `t` in a canonical page (each section's runs concatenated).
fn token_sections(
    layout: &TokenLayout,
    page: &[u8],
    t: u64,
    page_size: u64,
) -> Result<Vec<Vec<u8>>, CodecError> {
    let mut out = Vec::with_capacity(layout.sections().len());
    for s in 0..layout.sections().len() {
        let run = layout.run_bytes(s)? as usize;
        let mut bytes = Vec::with_capacity(layout.section_bytes(s)? as usize);
        for r in 0..layout.runs(s)? {
            let off = layout.offset_bytes(s, t, r, page_size)? as usize;
            bytes.extend_from_slice(&page[off..off + run]);
        }
        out.push(bytes);
    }
    Ok(out)
}

impl<B: Backend> PoolStore<B> {
    /// Builds the templates and reference scores for `cache`'s (simulated) device geometry.
    ///
    /// # Errors
    ///
    /// [`ReplayError::Pool`] when the scratch pool cannot be built or written (a geometry whose
    /// sizes overflow); [`ReplayError::Codec`] when a section's dtype has no codec.
    pub fn new(cache: HiCache<B>, params: IndexerParams) -> Result<Self, ReplayError> {
        let geometry = cache.device().geometry().clone();
        let page_size = geometry.page_size_tokens;
        let layers = geometry.buffers.iter().map(|b| b.layers).max().unwrap_or(0);
        // A scratch pool of TEMPLATES pages, written token by token through the pool's own
        // accessors, read back as canonical pages.
        let mut scratch_geometry = geometry.clone();
        scratch_geometry.pages = TEMPLATES;
        scratch_geometry.memory_layout = kvlayout_core::MemoryLayout::LayerFirst;
        let mut scratch = DevicePool::new(scratch_geometry)?;
        let rows = (0..geometry.buffers.len())
            .map(|b| geometry.buffer_page_rows(b))
            .collect::<Result<Vec<u64>, _>>()
            .map_err(PoolError::from)?;
        let tokens_per_row: Vec<u64> = rows.iter().map(|&r| page_size / r.max(1)).collect();
        let mut templates = Vec::new();
        for (b, buf) in geometry.buffers.iter().enumerate() {
            let mut per_layer = Vec::new();
            for l in 0..buf.layers {
                let mut pages = Vec::new();
                for p in 0..TEMPLATES {
                    for t in 0..rows[b] {
                        let bytes = codec::encode_token(&buf.layout, |s, e| {
                            value(params.seed, p, l, b, s, t, e)
                        })?;
                        let slices: Vec<&[u8]> = bytes.iter().map(Vec::as_slice).collect();
                        scratch.write_token(b, l, p, t, &slices)?;
                    }
                    pages.push(scratch.read_page(b, l, p)?);
                }
                per_layer.push(pages);
            }
            templates.push(per_layer);
        }
        let index_k = geometry.buffer_index("index_k");
        let kv = geometry.buffer_index("kv");
        let mut ref_scores = Vec::new();
        let mut queries = Vec::new();
        if let Some(ib) = index_k {
            let layout = &geometry.buffers[ib].layout;
            let dim = layout.section_elems(0).map_err(CodecError::from)? as usize;
            let heads = params.heads as usize;
            for l in 0..geometry.buffers[ib].layers {
                let mut keys = Vec::new();
                for page in &templates[ib][l as usize] {
                    for t in 0..page_size {
                        let sections = token_sections(layout, page, t, page_size)?;
                        let slices: Vec<&[u8]> = sections.iter().map(Vec::as_slice).collect();
                        keys.push(codec::decode_section(layout, 0, &slices)?);
                    }
                }
                let mut per_query = Vec::new();
                let mut scores = Vec::new();
                for qi in 0..QUERIES {
                    let q: Vec<f32> = (0..(heads * dim) as u64)
                        .map(|i| value(params.seed ^ 0x5151, qi, l, 99, 0, 0, i))
                        .collect();
                    let w: Vec<f32> = (0..heads as u64)
                        .map(|h| value(params.seed ^ 0x5151, qi, l, 99, 1, 0, h).abs())
                        .collect();
                    scores.push(keys.iter().map(|k| score(&q, &w, k)).collect());
                    per_query.push((q, w));
                }
                ref_scores.push(scores);
                queries.push(per_query);
            }
        }
        Ok(PoolStore {
            cache,
            params,
            layers,
            page_size,
            rows,
            tokens_per_row,
            templates,
            index_k,
            kv,
            ref_scores,
            queries,
            layouts: geometry.buffers.iter().map(|b| b.layout.clone()).collect(),
            first_refusal: None,
            checksum_mismatched_loads: 0,
            first_checksum_mismatch: None,
            scratch: Vec::new(),
            overlap: None,
        })
    }

    /// Turns the overlap on: loads and backups are enqueued and waited for only before the
    /// device pool's bytes are next read or written (the schedule's bookkeeping and the laying
    /// of computed pages run meanwhile), and computed pages are copied into the device pool from
    /// a staging copy of the templates (host memory of the backend) in one call per batch
    /// instead of one write per page. The outcome (transfers, refusals, what the indexer reads)
    /// is the same as without it.
    ///
    /// # Errors
    ///
    /// [`ReplayError::Pool`] when the staging region cannot be allocated or written.
    pub fn with_overlap(mut self) -> Result<Self, ReplayError> {
        let backend = self.cache.device().backend().clone();
        let geometry = self.cache.device().geometry().clone();
        let mut bytes = Vec::new();
        let mut template_offsets_bytes = Vec::new();
        for per_layer in &self.templates {
            let mut offsets = Vec::new();
            for pages in per_layer {
                let page_bytes = pages.first().map_or(0, |p| p.len() as u64);
                offsets.push((bytes.len() as u64, page_bytes));
                for page in pages {
                    bytes.extend_from_slice(page);
                }
            }
            template_offsets_bytes.push(offsets);
        }
        let mut staging = backend
            .alloc_host(bytes.len() as u64)
            .map_err(PoolError::from)?;
        backend
            .write_host(&mut staging, 0, &bytes)
            .map_err(PoolError::from)?;
        self.overlap = Some(Overlap {
            staging,
            template_offsets_bytes,
            geometry,
            runs: Vec::new(),
            pages: HashSet::new(),
            enqueue: self.cache.mode() == TransferMode::Checked,
            readback: None,
        });
        Ok(self)
    }

    /// Overlap on: the canonical pages `pages` of buffer `b`, layer `l` (`page_bytes` each)
    /// read back from the device pool into `readback`, in order, in one call.
    fn read_back(
        &mut self,
        b: usize,
        l: u64,
        pages: &[(PageId, u64)],
        page_bytes: u64,
    ) -> Result<(), ReplayError> {
        let Some(o) = &mut self.overlap else {
            return Ok(());
        };
        let mut runs = Vec::new();
        for (i, &(_, dev)) in pages.iter().enumerate() {
            for r in page_copy_runs(&o.geometry, b, l, dev, i as u64 * page_bytes)? {
                runs.push(CopyRun {
                    src_offset_bytes: r.dst_offset_bytes,
                    dst_offset_bytes: r.src_offset_bytes,
                    len_bytes: r.len_bytes,
                });
            }
        }
        let need_bytes = pages.len() as u64 * page_bytes;
        if o.readback
            .as_ref()
            .is_none_or(|r| r.len_bytes() < need_bytes)
        {
            let backend = self.cache.device().backend().clone();
            o.readback = Some(backend.alloc_host(need_bytes).map_err(PoolError::from)?);
        }
        if let Some(r) = &mut o.readback {
            self.cache
                .read_device_runs(r, &runs)
                .map_err(PoolError::from)?;
        }
        Ok(())
    }

    /// Whether transfers are enqueued rather than waited for.
    fn enqueues(&self) -> bool {
        self.overlap.as_ref().is_some_and(|o| o.enqueue)
    }

    /// Copies the computed pages not yet copied (overlap on), waiting for enqueued transfers
    /// first. Errors: the copy failed, or an enqueued transfer failed while running.
    fn flush_computed(&mut self) -> Result<(), ReplayError> {
        if let Some(o) = &mut self.overlap
            && !o.runs.is_empty()
        {
            self.cache
                .write_device_runs(&o.staging, &o.runs)
                .map_err(PoolError::from)?;
            o.runs.clear();
            o.pages.clear();
        }
        Ok(())
    }

    /// Every computed page copied and every enqueued transfer finished (overlap on; a no-op
    /// otherwise).
    ///
    /// # Errors
    ///
    /// [`ReplayError::Pool`] when copying the computed pages fails, or a transfer failed while
    /// running.
    pub fn finish(&mut self) -> Result<(), ReplayError> {
        self.flush_computed()?;
        self.cache.complete().map_err(copy_failed)
    }

    /// The pools (for the report's counters and geometry).
    pub fn cache(&self) -> &HiCache<B> {
        &self.cache
    }

    /// Why the first refused transfer was refused.
    pub fn first_refusal(&self) -> Option<&str> {
        self.first_refusal.as_deref()
    }

    /// Loads (one per request that loaded pages) in which a page's checksum mismatched
    /// ([`kvlayout_pool::ChecksumMode`]), and the first mismatch.
    pub fn checksum_mismatches(&self) -> (u64, Option<&str>) {
        (
            self.checksum_mismatched_loads,
            self.first_checksum_mismatch.as_deref(),
        )
    }

    /// Whether the indexer runs (the model has an `index_k` buffer).
    pub fn has_indexer(&self) -> bool {
        self.index_k.is_some()
    }

    fn template_of(&self, page: PageId) -> usize {
        (mix(self.params.seed ^ mix(page.hash_id) ^ page.page) % TEMPLATES) as usize
    }

    fn note(&mut self, e: &impl std::fmt::Display) {
        if self.first_refusal.is_none() {
            self.first_refusal = Some(e.to_string());
        }
    }

    /// Whether row `t` of device page `dev` in buffer `b`, layer `l`, equals its template's.
    fn row_matches(
        &mut self,
        b: usize,
        l: u64,
        dev: u64,
        template: usize,
        t: u64,
    ) -> Result<bool, ReplayError> {
        let layout = &self.layouts[b];
        let want = &self.templates[b][l as usize][template];
        for s in 0..layout.sections().len() {
            let run = layout.run_bytes(s).map_err(CodecError::from)? as usize;
            for r in 0..layout.runs(s).map_err(CodecError::from)? {
                let off = layout
                    .offset_bytes(s, t, r, self.rows[b])
                    .map_err(CodecError::from)?;
                self.scratch.resize(run, 0);
                self.cache
                    .device()
                    .read_page_bytes(b, l, dev, off, &mut self.scratch)?;
                if self.scratch[..] != want[off as usize..off as usize + run] {
                    return Ok(false);
                }
            }
        }
        Ok(true)
    }

    fn check_layer(
        &mut self,
        req: &Request,
        pages: &[(PageId, u64)],
        l: u64,
    ) -> Result<bool, ReplayError> {
        let k = self.params.top_k;
        let templates: Vec<usize> = pages.iter().map(|&(p, _)| self.template_of(p)).collect();
        let selected: Vec<u64> = match self.index_k {
            Some(ib) => {
                let qi = (mix(self.params.seed ^ req.line) % QUERIES) as usize;
                let layout = self.layouts[ib].clone();
                let page_bytes = self.templates[ib][l as usize][0].len();
                let mut got = Vec::with_capacity(pages.len() * self.page_size as usize);
                let mut want = Vec::with_capacity(got.capacity());
                let mut page = vec![0u8; page_bytes];
                self.read_back(ib, l, pages, page_bytes as u64)?;
                for (i, (&(_, dev), &tp)) in pages.iter().zip(&templates).enumerate() {
                    let refs = &self.ref_scores[l as usize][qi];
                    let base = tp * self.page_size as usize;
                    let ref_page = &refs[base..base + self.page_size as usize];
                    want.extend_from_slice(ref_page);
                    match &self.overlap {
                        Some(Overlap {
                            readback: Some(r), ..
                        }) => {
                            let backend = self.cache.device().backend();
                            let at = i as u64 * page_bytes as u64;
                            backend
                                .read_host(r, at, &mut page)
                                .map_err(PoolError::from)?;
                        }
                        _ => {
                            self.cache
                                .device()
                                .read_page_bytes(ib, l, dev, 0, &mut page)?;
                        }
                    }
                    let template = &self.templates[ib][l as usize][tp];
                    if page == *template {
                        got.extend_from_slice(ref_page);
                        continue;
                    }
                    for t in 0..self.page_size {
                        let s = token_sections(&layout, &page, t, self.page_size)?;
                        let r = token_sections(&layout, template, t, self.page_size)?;
                        if s == r {
                            got.push(ref_page[t as usize]);
                        } else {
                            let slices: Vec<&[u8]> = s.iter().map(Vec::as_slice).collect();
                            let key = codec::decode_section(&layout, 0, &slices)?;
                            let (q, w) = &self.queries[l as usize][qi];
                            got.push(score(q, w, &key));
                        }
                    }
                }
                let mut g = top_k_of_scores(&got, k);
                let mut w = top_k_of_scores(&want, k);
                g.sort_unstable();
                w.sort_unstable();
                // Sparse attention reads the selected *set*.
                if g != w {
                    return Ok(true);
                }
                g
            }
            None => {
                let tokens = pages.len() as u64 * self.page_size;
                (0..k as u64)
                    .map(|i| mix(self.params.seed ^ mix(req.line) ^ (l << 32) ^ i) % tokens)
                    .collect()
            }
        };
        let buffers: Vec<usize> = match self.index_k {
            Some(_) => self.kv.into_iter().collect(),
            None => (0..self.templates.len()).collect(),
        };
        for pos in selected {
            let (pi, t) = ((pos / self.page_size) as usize, pos % self.page_size);
            for &b in &buffers {
                // The row holding token t: t / R in a compressed buffer, the slot's one row.
                let row = (t / self.tokens_per_row[b].max(1)).min(self.rows[b] - 1);
                if l < self.cache.device().geometry().buffers[b].layers
                    && !self.row_matches(b, l, pages[pi].1, templates[pi], row)?
                {
                    return Ok(true);
                }
            }
        }
        Ok(false)
    }
}

impl<B: Backend> PageStore for PoolStore<B> {
    fn compute(&mut self, page: PageId, device_page: u64) -> Result<(), ReplayError> {
        let tp = self.template_of(page);
        if self.overlap.is_some() {
            // A page computed twice in one batch: the first copy lands first.
            if self
                .overlap
                .as_ref()
                .is_some_and(|o| o.pages.contains(&device_page))
            {
                self.flush_computed()?;
            }
            if let Some(o) = &mut self.overlap {
                for (b, offsets) in o.template_offsets_bytes.iter().enumerate() {
                    for (l, &(base, page_bytes)) in offsets.iter().enumerate() {
                        let src = base + tp as u64 * page_bytes;
                        o.runs
                            .extend(page_copy_runs(&o.geometry, b, l as u64, device_page, src)?);
                    }
                }
                o.pages.insert(device_page);
            }
            return Ok(());
        }
        for (b, per_layer) in self.templates.iter().enumerate() {
            for (l, pages) in per_layer.iter().enumerate() {
                self.cache
                    .write_page(b, l as u64, device_page, &pages[tp])?;
            }
        }
        Ok(())
    }

    fn backup(&mut self, pairs: &[PagePair]) -> Result<bool, ReplayError> {
        self.flush_computed()?;
        let result = match self.enqueues() {
            true => {
                self.cache.copy_failure().map_err(copy_failed)?;
                self.cache.enqueue(Direction::Backup, Layers::All, pairs)
            }
            false => self.cache.backup(pairs),
        };
        match result {
            Ok(_) => Ok(true),
            Err(e) => {
                self.note(&e);
                Ok(false)
            }
        }
    }

    /// Loads `pairs`, layer by layer. A checksum mismatch (checksums on) is counted once per
    /// load; on a checked pairing it refuses the load (a miss: the pages are recomputed), on an
    /// unverified one (`--no-verify`, the engine without kvlayout) the bytes are used as that
    /// engine would use them, so the indexer check still sees what they do.
    fn load(&mut self, pairs: &[PagePair]) -> Result<bool, ReplayError> {
        self.flush_computed()?;
        let mut mismatched = false;
        for l in 0..self.layers {
            let result = match self.enqueues() {
                true => {
                    self.cache.copy_failure().map_err(copy_failed)?;
                    self.cache.enqueue(Direction::Load, Layers::One(l), pairs)
                }
                false => self.cache.load_layer(l, pairs),
            };
            match result {
                Ok(_) => {}
                Err(e @ TransferError::ChecksumMismatch { .. }) => {
                    if !mismatched {
                        mismatched = true;
                        self.checksum_mismatched_loads += 1;
                    }
                    if self.first_checksum_mismatch.is_none() {
                        self.first_checksum_mismatch = Some(match (&e, self.cache.mode()) {
                            // Unchecked (--no-verify): the bytes were used, as an engine without
                            // kvlayout uses them; the mismatch is only counted.
                            (
                                TransferError::ChecksumMismatch { mismatches, .. },
                                TransferMode::Unverified,
                            ) => format!(
                                "{} page payload(s) mismatched, used anyway (unchecked pairing); first: {}",
                                mismatches.len(),
                                mismatches
                                    .first()
                                    .map_or_else(String::new, ToString::to_string)
                            ),
                            _ => e.to_string(),
                        });
                    }
                    if self.cache.mode() == TransferMode::Checked {
                        self.note(&e);
                        return Ok(false);
                    }
                }
                Err(e) => {
                    self.note(&e);
                    return Ok(false);
                }
            }
        }
        Ok(true)
    }

    fn check(&mut self, req: &Request, pages: &[(PageId, u64)]) -> Result<bool, ReplayError> {
        if pages.is_empty() {
            return Ok(false);
        }
        // The loaded bytes are read now: everything enqueued must have landed.
        self.finish()?;
        for l in 0..self.layers {
            if self.check_layer(req, pages, l)? {
                return Ok(true);
            }
        }
        Ok(false)
    }
}

/// A copy that failed while running (overlap on): the replay stops with it as a pool error
/// (exit 2), wherever it is found, instead of charging it to a later transfer as a refusal.
/// (`HiCache::complete` and `copy_failure` fail with `TransferError::Backend` only.)
fn copy_failed(e: TransferError) -> ReplayError {
    let b = match e {
        TransferError::Backend(b) => b,
        e => BackendError::Driver(e.to_string()),
    };
    ReplayError::Pool(PoolError::from(b))
}
