//! `kvlayout replay --workload synthetic`: a HiCache workload on a real model config, with the
//! DeepSeek sparse indexer reading index-K keys back from the device pool's bytes.
//!
//! (Length: about 700 lines, over the workspace's 600, because the simulation is one state
//! machine, `Sim`, whose batch, eviction, recompute and decode-check steps share its state;
//! its inputs and report are in `input.rs`.)
//!
//! Workload (deterministic from `seed`): `sessions` multi-turn sessions in `prefix_groups`
//! groups sharing a prefix of `prefix_pages` full pages (a system prompt); each turn appends
//! `user_tokens` prompt tokens and then decodes `decode_tokens` tokens. Sessions run in batches
//! of `concurrency`; the device pool (`device_pages`) is smaller than the working set, so pages
//! of idle sessions are backed up to the host pool (one all-layer backup per eviction batch) and
//! loaded back layer by layer (SGLang's layer-wise load) when their session returns or another
//! session of the group hits the prefix.
//!
//! Every decode step, on every simulated layer, the DSA indexer scores every past token
//! `s` of the session: `I(t, s) = sum_h w(t, h) * ReLU(q(t, h) . k(s))` (DeepSeek-V3.2 paper),
//! with `k(s)` decoded from the index-K bytes *in the device pool* (bf16 with `half`, e4m3 with
//! `float8` times its f32 scale, e2m1 times its ue8m0 scale), keeps the `top_k` best, and reads
//! their latent rows (`kv` buffer) from the device pool. The same session computed without
//! HiCache — keys and rows encoded straight from the generator — is the reference; a session is
//! corrupted when any top-k selection or latent row differs. Models without an indexer (MLA,
//! GQA) compare the `kv` rows of `top_k` past tokens sampled per step and layer.
//!
//! Simplifications, said in the report: only the first `layers` layers are simulated (the
//! geometry — token layouts, page strides, page size — is the model's, and the pairing check
//! runs on the full-depth geometries), fewer indexer heads than the model's, a small top-k and
//! short sequences, so the default run takes seconds.

use std::collections::HashMap;

use kvlayout_models::PoolOptions;
use kvlayout_pool::backend::{Backend, CpuBackend};
use kvlayout_pool::shim::TransferError;
use kvlayout_pool::{HiCache, KvPool, PagePair};

use crate::codec::{self, CodecError};
pub use crate::error::ReplayError;
use crate::error::{Param, workload_err};
use crate::indexer::top_k;
pub use crate::pairing::{HostSource, read_host_geometry};
use crate::pairing::{Sample, pair_pools};
use crate::rng::{mix, unit};

mod input;
pub use input::{Refusal, ReplayInput, ReplayOutcome, ReplayReport, Workload};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Owner {
    Prefix(u64),
    Session(u64),
}

struct Page {
    owner: Owner,
    /// Page index inside the owner's sequence (prefix pages come first in a session).
    index: u64,
    device: Option<u64>,
    host: Option<u64>,
    host_valid: bool,
    tokens: u64,
    last_use: u64,
    pinned: bool,
}

struct Session {
    group: u64,
    len: u64,
    pages: Vec<usize>,
    corrupted: bool,
    loaded: bool,
    /// Reference keys per simulated layer, flat `[len][index_head_dim]`.
    ref_keys: Vec<Vec<f32>>,
}

struct Gen {
    seed: u64,
}

impl Gen {
    fn token_key(&self, owner: Owner, pos: u64) -> u64 {
        let (tag, id) = match owner {
            Owner::Prefix(g) => (1u64, g),
            Owner::Session(s) => (2u64, s),
        };
        mix(self.seed ^ mix((tag << 60) ^ (id << 32) ^ pos))
    }

    fn value(&self, key: u64, layer: u64, buffer: usize, section: usize, elem: u64) -> f32 {
        unit(mix(key
            ^ mix((layer << 48)
                ^ ((buffer as u64) << 40)
                ^ ((section as u64) << 32)
                ^ elem)))
    }

    fn query_key(&self, session: u64, pos: u64) -> u64 {
        mix(self.seed ^ mix((3u64 << 60) ^ (session << 32) ^ pos))
    }
}

struct Sim<'a, B: Backend> {
    w: &'a Workload,
    source: Gen,
    cache: HiCache<B>,
    page_size: u64,
    kv: usize,
    index_k: Option<usize>,
    pages: Vec<Page>,
    prefix: HashMap<u64, Vec<usize>>,
    sessions: Vec<Session>,
    device_free: Vec<u64>,
    host_free: Vec<u64>,
    clock: u64,
    report: ReplayReport,
}

/// Runs the replay on the CPU backend; `progress(done, total)` is called after each batch
/// (session-turns).
///
/// # Errors
///
/// As [`run_with`].
pub fn run(
    input: &ReplayInput,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<ReplayOutcome, ReplayError> {
    run_with(CpuBackend, input, progress)
}

/// Runs the replay with both pools on `backend` (e.g. the CUDA backend: device pool in GPU
/// memory, host pool pinned); the workload, checks and report are [`run`]'s.
///
/// # Errors
///
/// [`ReplayError::Workload`] naming the parameter (zero sessions, layers, turns, prefix groups or
/// concurrency; sessions that do not fit the device pages; token counts that overflow);
/// [`ReplayError::NotFullAttention`] for a model with a buffer that does not keep every token; the
/// model's, pool's and codec's errors. A pairing refused by the check is
/// `Ok(ReplayOutcome::Refused)`, not an error.
pub fn run_with<B: Backend>(
    backend: B,
    input: &ReplayInput,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<ReplayOutcome, ReplayError> {
    let w = &input.workload;
    for (field, v) in [
        (Param::Sessions, w.sessions),
        (Param::Layers, w.layers),
        (Param::Turns, w.turns),
        (Param::PrefixGroups, w.prefix_groups),
        (Param::Concurrency, w.concurrency),
        (Param::DevicePages, w.device_pages),
        (Param::IndexerHeads, w.indexer_heads),
        (Param::TopK, w.top_k as u64),
    ] {
        if v == 0 {
            return Err(workload_err(field, "must be at least 1, got 0".into()));
        }
    }
    let opts = PoolOptions {
        pages: w.device_pages,
        ..input.pool
    };
    // The synthetic workload keeps every page of every buffer: a sliding-window, chunked or
    // state buffer (DeepSeek-V4's included: only the trace schedule pages them) is refused.
    crate::pairing::require_full_attention(&input.model.name, &input.model.pool(&opts)?.geometry)?;
    let paired = match pair_pools(
        backend,
        &input.model,
        &opts,
        &input.host,
        input.verify,
        &Sample {
            layers: w.layers,
            buffers: None,
        },
    )? {
        Ok(p) => p,
        Err(r) => {
            return Ok(ReplayOutcome::Refused(refusal(
                input,
                r.host_source,
                r.mismatch,
            )));
        }
    };
    let model_layers = input.model.config.num_hidden_layers;
    let sim_layers = w.layers;
    let (cache, facts) = paired.into_parts();
    let geometry = cache.device().geometry();
    let kv = geometry.buffer_index("kv").unwrap_or(0);
    let index_k = geometry.buffer_index("index_k");
    let host_pages = cache.host().geometry().pages;
    let report = ReplayReport {
        model: input.model.name.clone(),
        model_layers,
        simulated_layers: sim_layers,
        formats: facts.formats,
        page_size_tokens: geometry.page_size_tokens,
        device_pages: geometry.pages,
        host_pages,
        host_memory_layout: cache.host().geometry().memory_layout.to_string(),
        host_geometry: facts.host_geometry,
        pairing: facts.pairing,
        mismatch: facts.mismatch,
        device_fingerprint: facts.device_fingerprint,
        host_fingerprint: facts.host_fingerprint,
        sessions: w.sessions,
        corrupted_sessions: 0,
        sessions_with_loaded_pages: 0,
        decode_steps: 0,
        topk_mismatches: 0,
        latent_mismatches: 0,
        indexer: index_k.is_some(),
        top_k: w.top_k as u64,
        indexer_heads: w.indexer_heads,
        device_page_hits: 0,
        backed_up_pages: 0,
        loaded_pages: 0,
        backed_up_bytes: 0,
        loaded_bytes: 0,
        backup_transfers: 0,
        load_transfers: 0,
        refused_transfers: 0,
        recomputed_pages: 0,
        first_refusal: None,
    };
    let page_size = geometry.page_size_tokens;
    let max_tokens = w
        .prefix_pages
        .checked_mul(page_size)
        .and_then(|p| p.checked_add(w.turns.checked_mul(w.user_tokens + w.decode_tokens)?))
        .ok_or_else(|| workload_err(Param::Turns, "token count overflows".into()))?;
    let pages_per_session = max_tokens.div_ceil(page_size);
    let batch = w.concurrency.min(w.sessions);
    let need = pages_per_session.saturating_mul(batch);
    if pages_per_session > w.device_pages {
        return Err(workload_err(
            Param::DevicePages,
            format!(
                "{} pages cannot hold one session of {max_tokens} tokens ({pages_per_session} pages)",
                w.device_pages
            ),
        ));
    }
    if need > w.device_pages {
        return Err(workload_err(
            Param::Concurrency,
            format!(
                "{} sessions at once need {batch} x {pages_per_session} pages = {need}, more than \
                 the device pool's {} pages (--device-pages); at most {} fit",
                w.concurrency,
                w.device_pages,
                w.device_pages / pages_per_session
            ),
        ));
    }
    // The indexer picks from the tokens before the first decoded one: the shared prefix and
    // the first turn's prompt. A larger top-k selects every token and checks nothing.
    let first_context = w.prefix_pages * page_size + w.user_tokens;
    if index_k.is_some() && w.top_k as u64 > first_context {
        return Err(workload_err(
            Param::TopK,
            format!(
                "{} is more than the {first_context} tokens the indexer picks from at the first \
                 decode step ({} prefix + {} prompt tokens)",
                w.top_k,
                w.prefix_pages * page_size,
                w.user_tokens
            ),
        ));
    }
    let mut sim = Sim {
        w,
        source: Gen { seed: w.seed },
        cache,
        page_size,
        kv,
        index_k,
        pages: Vec::new(),
        prefix: HashMap::new(),
        sessions: (0..w.sessions)
            .map(|s| Session {
                group: s % w.prefix_groups,
                len: 0,
                pages: Vec::new(),
                corrupted: false,
                loaded: false,
                ref_keys: vec![Vec::new(); sim_layers as usize],
            })
            .collect(),
        device_free: (0..w.device_pages).rev().collect(),
        host_free: (0..host_pages).rev().collect(),
        clock: 0,
        report,
    };
    let total = w.sessions * w.turns;
    let mut done = 0;
    for turn in 0..w.turns {
        let mut start = 0;
        while start < w.sessions {
            let end = (start + w.concurrency).min(w.sessions);
            sim.run_batch(turn, start..end)?;
            done += end - start;
            progress(done, total);
            start = end;
        }
    }
    let stats = sim.cache.stats();
    let r = &mut sim.report;
    r.corrupted_sessions = sim.sessions.iter().filter(|s| s.corrupted).count() as u64;
    r.sessions_with_loaded_pages = sim.sessions.iter().filter(|s| s.loaded).count() as u64;
    r.backed_up_pages = stats.backed_up_pages;
    r.loaded_pages = stats.loaded_pages;
    r.backed_up_bytes = stats.backed_up_bytes;
    r.loaded_bytes = stats.loaded_bytes;
    r.backup_transfers = stats.backups;
    r.load_transfers = stats.loads;
    r.refused_transfers = stats.refused;
    Ok(ReplayOutcome::Completed(Box::new(sim.report)))
}

fn refusal(input: &ReplayInput, host_geometry: String, mismatch: Vec<String>) -> Refusal {
    Refusal {
        model: input.model.name.clone(),
        sessions: input.workload.sessions,
        host_geometry,
        pairing: "refused",
        mismatch,
        corrupted_sessions: 0,
        refused_transfers: 0,
        loaded_bytes: 0,
    }
}

impl<B: Backend> Sim<'_, B> {
    fn layers(&self) -> u64 {
        self.report.simulated_layers
    }

    fn touch(&mut self, id: usize) {
        self.clock += 1;
        self.pages[id].last_use = self.clock;
    }

    fn owner_of(&self, sid: u64, pos: u64) -> Owner {
        if pos < self.w.prefix_pages * self.page_size {
            Owner::Prefix(self.sessions[sid as usize].group)
        } else {
            Owner::Session(sid)
        }
    }

    /// Frees `n` device slots, backing up dirty victims (least recently used, unpinned) in one
    /// all-layer transfer.
    fn make_room(&mut self, n: usize) -> Result<(), ReplayError> {
        if self.device_free.len() >= n {
            return Ok(());
        }
        let want = n - self.device_free.len();
        let mut candidates: Vec<usize> = (0..self.pages.len())
            .filter(|&i| self.pages[i].device.is_some() && !self.pages[i].pinned)
            .collect();
        candidates.sort_by_key(|&i| self.pages[i].last_use);
        if candidates.len() < want {
            return Err(workload_err(
                Param::DevicePages,
                format!(
                    "{} pages: no unpinned page left to evict",
                    self.w.device_pages
                ),
            ));
        }
        let victims = &candidates[..want];
        let mut pairs = Vec::new();
        let mut backed = Vec::new();
        for &v in victims {
            if self.pages[v].host_valid {
                continue;
            }
            let host = match self.pages[v].host {
                Some(h) => h,
                None => self.host_free.pop().ok_or_else(|| {
                    workload_err(
                        Param::HostPages,
                        format!(
                            "the host pool's {} pages are full (this replay does not evict host pages: raise them, or the host geometry file's pages)",
                            self.report.host_pages
                        ),
                    )
                })?,
            };
            self.pages[v].host = Some(host);
            pairs.push(PagePair::new(self.pages[v].device.unwrap_or(0), host));
            backed.push(v);
        }
        let ok = pairs.is_empty() || {
            let r = self.cache.backup(&pairs);
            self.note_refusal(r.as_ref().err());
            r.is_ok()
        };
        for &v in &backed {
            // A refused backup leaves no valid host copy: the page is lost and will be
            // recomputed when needed.
            self.pages[v].host_valid = ok;
        }
        for &v in victims {
            if let Some(d) = self.pages[v].device.take() {
                self.device_free.push(d);
            }
        }
        Ok(())
    }

    fn alloc_device(&mut self, id: usize) -> Result<u64, ReplayError> {
        self.make_room(1)?;
        let d = self
            .device_free
            .pop()
            .ok_or_else(|| workload_err(Param::DevicePages, "no free page".into()))?;
        self.pages[id].device = Some(d);
        Ok(d)
    }

    fn new_page(&mut self, owner: Owner, index: u64) -> usize {
        self.pages.push(Page {
            owner,
            index,
            device: None,
            host: None,
            host_valid: false,
            tokens: 0,
            last_use: 0,
            pinned: true,
        });
        self.pages.len() - 1
    }

    /// Writes token `pos` (of `owner`) into page `id`, every buffer and simulated layer.
    fn write_token(&mut self, id: usize, owner: Owner, pos: u64) -> Result<(), ReplayError> {
        let key = self.source.token_key(owner, pos);
        let dev = self.pages[id]
            .device
            .ok_or_else(|| workload_err(Param::Pages, "writing a page not on the device".into()))?;
        let slot = pos % self.page_size;
        let buffers = self.cache.device().geometry().buffers.clone();
        for (b, buf) in buffers.iter().enumerate() {
            for l in 0..buf.layers {
                let bytes =
                    codec::encode_token(&buf.layout, |s, e| self.source.value(key, l, b, s, e))?;
                let slices: Vec<&[u8]> = bytes.iter().map(Vec::as_slice).collect();
                self.cache.write_token(b, l, dev, slot, &slices)?;
            }
        }
        let p = &mut self.pages[id];
        p.tokens = p.tokens.max(slot + 1);
        p.host_valid = false;
        Ok(())
    }

    /// Keeps the first refused transfer's reason for the report.
    fn note_refusal(&mut self, e: Option<&TransferError>) {
        if let Some(e) = e
            && self.report.first_refusal.is_none()
        {
            self.report.first_refusal = Some(e.to_string());
        }
    }

    /// Rewrites every token of a page from the generator (after a refused transfer).
    fn recompute(&mut self, id: usize) -> Result<(), ReplayError> {
        let (owner, index, tokens) = (
            self.pages[id].owner,
            self.pages[id].index,
            self.pages[id].tokens,
        );
        for t in 0..tokens {
            self.write_token(id, owner, index * self.page_size + t)?;
        }
        self.report.recomputed_pages += 1;
        Ok(())
    }

    /// The reference (no HiCache) index-K key of a token on a layer.
    fn reference_key(&self, owner: Owner, pos: u64, layer: u64) -> Result<Vec<f32>, ReplayError> {
        let Some(ib) = self.index_k else {
            return Ok(Vec::new());
        };
        let layout = &self.cache.device().geometry().buffers[ib].layout;
        let key = self.source.token_key(owner, pos);
        let bytes = codec::encode_token(layout, |s, e| self.source.value(key, layer, ib, s, e))?;
        let slices: Vec<&[u8]> = bytes.iter().map(Vec::as_slice).collect();
        Ok(codec::decode_section(layout, 0, &slices)?)
    }

    /// Appends token `len` to session `sid`: a new page at a page boundary.
    fn append(&mut self, sid: u64) -> Result<(), ReplayError> {
        let pos = self.sessions[sid as usize].len;
        let owner = self.owner_of(sid, pos);
        let page_index = pos / self.page_size;
        if pos.is_multiple_of(self.page_size) {
            let id = self.new_page(owner, page_index);
            self.alloc_device(id)?;
            self.sessions[sid as usize].pages.push(id);
        }
        let id = self.sessions[sid as usize].pages[page_index as usize];
        self.write_token(id, owner, pos)?;
        self.touch(id);
        for l in 0..self.layers() {
            let k = self.reference_key(owner, pos, l)?;
            self.sessions[sid as usize].ref_keys[l as usize].extend(k);
        }
        self.sessions[sid as usize].len = pos + 1;
        Ok(())
    }

    /// Gives session `sid` (still empty) its group's prefix pages if they exist; the pages
    /// are pinned with the session's.
    fn attach_prefix(&mut self, sid: u64) -> Result<bool, ReplayError> {
        let g = self.sessions[sid as usize].group;
        let Some(ids) = self.prefix.get(&g).cloned() else {
            return Ok(false);
        };
        if self.sessions[sid as usize].len != 0 {
            return Ok(false);
        }
        let len = self.w.prefix_pages * self.page_size;
        let mut ref_keys = Vec::with_capacity(self.layers() as usize);
        for l in 0..self.layers() {
            let mut keys = Vec::new();
            for pos in 0..len {
                keys.extend(self.reference_key(Owner::Prefix(g), pos, l)?);
            }
            ref_keys.push(keys);
        }
        for &id in &ids {
            self.touch(id);
        }
        let s = &mut self.sessions[sid as usize];
        s.pages = ids;
        s.len = len;
        s.ref_keys = ref_keys;
        Ok(true)
    }

    fn run_batch(&mut self, turn: u64, batch: std::ops::Range<u64>) -> Result<(), ReplayError> {
        // Attach shared prefixes made by earlier batches (first turn).
        if turn == 0 {
            for sid in batch.clone() {
                self.attach_prefix(sid)?;
            }
        }
        // Pin every page of the batch; find those to load back.
        let mut needed: Vec<usize> = Vec::new();
        for sid in batch.clone() {
            for &id in &self.sessions[sid as usize].pages {
                if !self.pages[id].pinned {
                    self.pages[id].pinned = true;
                    needed.push(id);
                }
            }
        }
        let missing: Vec<usize> = needed
            .iter()
            .copied()
            .filter(|&id| self.pages[id].device.is_none())
            .collect();
        self.report.device_page_hits += (needed.len() - missing.len()) as u64;
        // Room for the pages to load and, as far as unpinned pages allow, for the pages this
        // turn will append, so that evictions are backed up in one transfer per batch.
        let mut new_pages = 0u64;
        for sid in batch.clone() {
            let len = self.sessions[sid as usize].len;
            let mut add = self.w.user_tokens + self.w.decode_tokens;
            if turn == 0 && len == 0 {
                add += self.w.prefix_pages * self.page_size;
            }
            new_pages += (len + add).div_ceil(self.page_size) - len.div_ceil(self.page_size);
        }
        let evictable = (0..self.pages.len())
            .filter(|&i| self.pages[i].device.is_some() && !self.pages[i].pinned)
            .count();
        let room = (missing.len() + new_pages as usize).min(self.device_free.len() + evictable);
        self.make_room(room.max(missing.len()))?;
        let mut pairs = Vec::new();
        let mut loaded = Vec::new();
        let mut lost = Vec::new();
        for &id in &missing {
            let d = self
                .device_free
                .pop()
                .ok_or_else(|| workload_err(Param::DevicePages, "no free page".into()))?;
            self.pages[id].device = Some(d);
            match (self.pages[id].host, self.pages[id].host_valid) {
                (Some(h), true) => {
                    pairs.push(PagePair::new(d, h));
                    loaded.push(id);
                }
                _ => lost.push(id),
            }
        }
        if !pairs.is_empty() {
            let mut ok = true;
            for l in 0..self.layers() {
                let r = self.cache.load_layer(l, &pairs);
                self.note_refusal(r.as_ref().err());
                ok &= r.is_ok();
            }
            if !ok {
                lost.extend(loaded.iter().copied());
            }
        }
        for id in lost {
            self.recompute(id)?;
        }
        for sid in batch.clone() {
            let s = &self.sessions[sid as usize];
            if s.pages.iter().any(|id| loaded.contains(id)) {
                self.sessions[sid as usize].loaded = true;
            }
        }
        // Prefill: the first session of a group writes its prefix; then the turn's prompt.
        for sid in batch.clone() {
            let s = &self.sessions[sid as usize];
            let g = s.group;
            if turn == 0 && s.len == 0 && !self.attach_prefix(sid)? {
                for _ in 0..self.w.prefix_pages * self.page_size {
                    self.append(sid)?;
                }
                let ids = self.sessions[sid as usize].pages.clone();
                self.prefix.insert(g, ids);
            }
            for _ in 0..self.w.user_tokens {
                self.append(sid)?;
            }
        }
        // Decode, sessions interleaved.
        for _ in 0..self.w.decode_tokens {
            for sid in batch.clone() {
                self.decode_step(sid)?;
                self.append(sid)?;
            }
        }
        for sid in batch {
            for i in 0..self.sessions[sid as usize].pages.len() {
                let id = self.sessions[sid as usize].pages[i];
                self.pages[id].pinned = false;
            }
        }
        Ok(())
    }

    /// One decode step of session `sid` on every simulated layer: indexer top-k from the
    /// device pool vs the reference, then the selected tokens' latent rows.
    fn decode_step(&mut self, sid: u64) -> Result<(), ReplayError> {
        self.report.decode_steps += 1;
        let len = self.sessions[sid as usize].len;
        let qkey = self.source.query_key(sid, len);
        let geometry = self.cache.device().geometry().clone();
        let mut corrupted = false;
        for l in 0..self.layers() {
            let selected: Vec<u64> = match self.index_k {
                Some(ib) => {
                    let layout = &geometry.buffers[ib].layout;
                    let dim = layout.section_elems(0).map_err(CodecError::from)? as usize;
                    let heads = self.w.indexer_heads as usize;
                    let q: Vec<f32> = (0..heads * dim)
                        .map(|i| self.source.value(qkey, l, 99, 0, i as u64))
                        .collect();
                    let wts: Vec<f32> = (0..heads)
                        .map(|h| self.source.value(qkey, l, 99, 1, h as u64).abs())
                        .collect();
                    let mut pool_keys = Vec::with_capacity(len as usize * dim);
                    for &id in &self.sessions[sid as usize].pages {
                        let dev = self.pages[id].device.unwrap_or(0);
                        let page = self.cache.device().read_page(ib, l, dev)?;
                        let tokens = self.pages[id].tokens;
                        for t in 0..tokens {
                            let mut sections = Vec::new();
                            for s in 0..layout.sections().len() {
                                let off = layout
                                    .offset_bytes(s, t, 0, self.page_size)
                                    .map_err(CodecError::from)?
                                    as usize;
                                let n = layout.section_bytes(s).map_err(CodecError::from)? as usize;
                                sections.push(&page[off..off + n]);
                            }
                            pool_keys.extend(codec::decode_section(layout, 0, &sections)?);
                        }
                    }
                    let ref_keys = &self.sessions[sid as usize].ref_keys[l as usize];
                    let got = top_k(&q, &wts, &pool_keys, dim, self.w.top_k);
                    let want = top_k(&q, &wts, ref_keys, dim, self.w.top_k);
                    // Sparse attention reads the selected *set*; an order change inside it
                    // changes nothing the model computes.
                    let (mut got_set, mut want_set) = (got.clone(), want);
                    got_set.sort_unstable();
                    want_set.sort_unstable();
                    if got_set != want_set {
                        self.report.topk_mismatches += 1;
                        corrupted = true;
                    }
                    got
                }
                // No indexer (dense attention reads every token): a deterministic sample of
                // `top_k` past tokens per step and layer is compared, to keep the run short.
                None => (0..self.w.top_k as u64)
                    .map(|i| mix(qkey ^ mix((l << 32) ^ i)) % len)
                    .collect(),
            };
            for pos in selected {
                let page_index = pos / self.page_size;
                let id = self.sessions[sid as usize].pages[page_index as usize];
                let dev = self.pages[id].device.unwrap_or(0);
                let got = self
                    .cache
                    .device()
                    .read_token(self.kv, l, dev, pos % self.page_size)?;
                let owner = self.owner_of(sid, pos);
                let key = self.source.token_key(owner, pos);
                let kv = self.kv;
                let want = codec::encode_token(&geometry.buffers[kv].layout, |s, e| {
                    self.source.value(key, l, kv, s, e)
                })?;
                if got != want {
                    self.report.latent_mismatches += 1;
                    corrupted = true;
                }
            }
        }
        if corrupted {
            self.sessions[sid as usize].corrupted = true;
        }
        Ok(())
    }
}
