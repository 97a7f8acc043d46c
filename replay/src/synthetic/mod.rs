//! `kvlayout replay --workload synthetic`: a HiCache workload on a real model config, with the
//! DeepSeek sparse indexer reading index-K keys back from the device pool's bytes.
//!
//! (Length: about 880 lines, over the workspace's 600, because the simulation is one state
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
use std::ops::Range;

use kvlayout_models::PoolOptions;
use kvlayout_pool::backend::{Backend, CpuBackend};
use kvlayout_pool::shim::TransferError;
use kvlayout_pool::{HiCache, KvPool, PagePair};

use crate::codec::{self, CodecError};
pub use crate::error::ReplayError;
use crate::error::{Param, workload_err};
use crate::indexer::top_k;
pub use crate::pairing::{HostSource, read_host_geometry};
use crate::pairing::{PairingFacts, Sample, pair_pools};
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
    page_size_tokens: u64,
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
/// concurrency; sessions that do not fit the device pages, or the device and host pages
/// together; token counts that overflow; device or host pages, or a host layout, the pools
/// cannot be built with);
/// [`ReplayError::NotFullAttention`] for a model with a buffer that does not keep every token; the
/// model's, pool's and codec's errors. A pairing refused by the check is
/// `Ok(ReplayOutcome::Refused)`, not an error.
pub fn run_with<B: Backend>(
    backend: B,
    input: &ReplayInput,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<ReplayOutcome, ReplayError> {
    let w = &input.workload;
    check_counts(w)?;
    let opts = PoolOptions {
        pages: w.device_pages,
        ..input.pool
    };
    // The synthetic workload keeps every page of every buffer: a sliding-window, chunked or
    // state buffer (DeepSeek-V4's included: only the trace schedule pages them) is refused. The
    // buffers do not depend on the pages (a page count the model refuses is named by the
    // pairing).
    let one_page = PoolOptions { pages: 1, ..opts };
    crate::pairing::require_full_attention(
        &input.model.name,
        &input.model.pool(&one_page)?.geometry,
    )?;
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
    let (cache, facts) = paired.into_parts();
    let report = new_report(input, &cache, facts);
    check_device_fit(w, report.page_size_tokens)?;
    check_pools_fit(w, report.page_size_tokens, report.host_pages)?;
    check_top_k(w, report.page_size_tokens, report.indexer)?;
    let mut sim = Sim::new(w, cache, report)?;
    sim.run_turns(progress)?;
    Ok(ReplayOutcome::Completed(Box::new(sim.finish())))
}

/// Refuses a zero session, layer, turn, prefix group, concurrency, device page, indexer head or
/// top-k count.
fn check_counts(w: &Workload) -> Result<(), ReplayError> {
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
    Ok(())
}

/// The report of a paired run before any batch: the pools' facts, every count zero.
fn new_report<B: Backend>(
    input: &ReplayInput,
    cache: &HiCache<B>,
    facts: PairingFacts,
) -> ReplayReport {
    let w = &input.workload;
    let device_geometry = cache.device().geometry();
    let host_geometry = cache.host().geometry();
    ReplayReport {
        model: input.model.name.clone(),
        model_layers: input.model.config.num_hidden_layers,
        simulated_layers: w.layers,
        formats: facts.formats,
        page_size_tokens: device_geometry.page_size_tokens,
        device_pages: device_geometry.pages,
        host_pages: host_geometry.pages,
        host_memory_layout: host_geometry.memory_layout.to_string(),
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
        indexer: device_geometry.buffer_index("index_k").is_some(),
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
    }
}

/// Refuses a session longer than the device pool, or a batch of `concurrency` sessions whose
/// pages do not all fit in it at once.
fn check_device_fit(w: &Workload, page_size_tokens: u64) -> Result<(), ReplayError> {
    let session_tokens = w
        .prefix_pages
        .checked_mul(page_size_tokens)
        .zip(own_tokens(w))
        .and_then(|(prefix, own)| prefix.checked_add(own))
        .ok_or_else(|| workload_err(Param::Turns, "token count overflows".into()))?;
    let session_pages = session_tokens.div_ceil(page_size_tokens);
    let batch_sessions = w.concurrency.min(w.sessions);
    let batch_pages = session_pages.saturating_mul(batch_sessions);
    if session_pages > w.device_pages {
        return Err(workload_err(
            Param::DevicePages,
            format!(
                "{} pages cannot hold one session of {session_tokens} tokens ({session_pages} pages)",
                w.device_pages
            ),
        ));
    }
    if batch_pages > w.device_pages {
        return Err(workload_err(
            Param::Concurrency,
            format!(
                "{} at once need {batch_sessions} x {session_pages} pages = {batch_pages}, more than \
                 the device pool's {} pages (--device-pages); at most {} fit",
                if w.concurrency > w.sessions {
                    format!("{} sessions (all {} there are)", w.concurrency, w.sessions)
                } else {
                    format!("{} sessions", w.concurrency)
                },
                w.device_pages,
                w.device_pages / session_pages
            ),
        ));
    }
    Ok(())
}

/// The tokens a session writes past its group's shared prefix: every turn's prompt and
/// decoded tokens (`None` past u64::MAX).
fn own_tokens(w: &Workload) -> Option<u64> {
    w.turns
        .checked_mul(w.user_tokens.checked_add(w.decode_tokens)?)
}

/// Refuses more sessions than the device and host pools hold together: every page a session
/// writes stays in at least one of them to the end (an evicted page keeps its host page: this
/// replay does not evict host pages), so the run would stop on a full host pool. The bound is
/// necessary, not sufficient: a page loaded back keeps its host page too, so a run under it
/// may still stop on a full host pool, later, with that error (a trial: 400 device + 2,000
/// host pages at one token a page ran 13 default sessions and stopped at 14; the bound is 14).
fn check_pools_fit(
    w: &Workload,
    page_size_tokens: u64,
    host_pages: u64,
) -> Result<(), ReplayError> {
    // The prefix is whole pages, so a session's own pages start on a page boundary.
    let own_pages = own_tokens(w)
        .ok_or_else(|| workload_err(Param::Turns, "token count overflows".into()))?
        .div_ceil(page_size_tokens);
    // In 128 bits: the sessions and prefix groups may be any u64.
    let prefix_pages = u128::from(w.prefix_groups.min(w.sessions)) * u128::from(w.prefix_pages);
    let needed_pages = u128::from(w.sessions) * u128::from(own_pages) + prefix_pages;
    let pool_pages = u128::from(w.device_pages) + u128::from(host_pages);
    if needed_pages > pool_pages {
        return Err(workload_err(
            Param::Sessions,
            format!(
                "{} sessions of {own_pages} pages each (plus {prefix_pages} shared prefix pages) \
                 need {needed_pages} pages, more than the device and host pools' {} + \
                 {host_pages} = {pool_pages} pages (this replay does not evict host pages)",
                w.sessions, w.device_pages
            ),
        ));
    }
    Ok(())
}

/// The indexer picks from the tokens before the first decoded one: the shared prefix and
/// the first turn's prompt. A larger top-k selects every token and checks nothing. Without an
/// indexer `top_k` tokens are sampled per step and layer from the same tokens, and a sample
/// larger than them only slows the run (a trial's `--top-k 18446744073709551615` on
/// llama-3.1-8b panicked allocating the sample): the same bound.
fn check_top_k(w: &Workload, page_size_tokens: u64, indexer: bool) -> Result<(), ReplayError> {
    let prefix_tokens = w.prefix_pages.saturating_mul(page_size_tokens);
    let first_context_tokens = prefix_tokens.saturating_add(w.user_tokens);
    if w.top_k as u64 > first_context_tokens {
        let picks = if indexer {
            "the indexer picks from"
        } else {
            "sampled from (no indexer)"
        };
        return Err(workload_err(
            Param::TopK,
            format!(
                "{} is more than the {first_context_tokens} tokens {picks} at the first decode step \
                 ({prefix_tokens} prefix + {} prompt tokens)",
                w.top_k, w.user_tokens
            ),
        ));
    }
    Ok(())
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

impl<'a, B: Backend> Sim<'a, B> {
    /// A simulation of `w` on the paired pools: every session empty, every device and host
    /// page free.
    ///
    /// # Errors
    ///
    /// [`ReplayError::Workload`] naming the sessions when their list cannot be allocated.
    fn new(w: &'a Workload, cache: HiCache<B>, report: ReplayReport) -> Result<Self, ReplayError> {
        let geometry = cache.device().geometry();
        let kv = geometry.buffer_index("kv").unwrap_or(0);
        let index_k = geometry.buffer_index("index_k");
        let page_size_tokens = geometry.page_size_tokens;
        let sim_layers = report.simulated_layers;
        let host_pages = report.host_pages;
        let mut sessions = Vec::new();
        usize::try_from(w.sessions)
            .ok()
            .and_then(|n| sessions.try_reserve_exact(n).ok())
            .ok_or_else(|| {
                workload_err(
                    Param::Sessions,
                    format!("cannot allocate the list of {} sessions", w.sessions),
                )
            })?;
        sessions.extend((0..w.sessions).map(|s| Session {
            group: s % w.prefix_groups,
            len: 0,
            pages: Vec::new(),
            corrupted: false,
            loaded: false,
            ref_keys: vec![Vec::new(); sim_layers as usize],
        }));
        Ok(Sim {
            w,
            source: Gen { seed: w.seed },
            cache,
            page_size_tokens,
            kv,
            index_k,
            pages: Vec::new(),
            prefix: HashMap::new(),
            sessions,
            device_free: (0..w.device_pages).rev().collect(),
            host_free: (0..host_pages).rev().collect(),
            clock: 0,
            report,
        })
    }

    /// Every turn of every session, `concurrency` sessions per batch; `progress(done, total)`
    /// after each batch, in session-turns.
    fn run_turns(&mut self, progress: &mut dyn FnMut(u64, u64)) -> Result<(), ReplayError> {
        let w = self.w;
        let total_session_turns = w.sessions.saturating_mul(w.turns);
        let mut done_session_turns = 0;
        for turn in 0..w.turns {
            let mut start = 0;
            while start < w.sessions {
                let end = (start + w.concurrency).min(w.sessions);
                self.run_batch(turn, start..end)?;
                done_session_turns += end - start;
                progress(done_session_turns, total_session_turns);
                start = end;
            }
        }
        Ok(())
    }

    /// The report with the session counts and the pools' transfer counts filled in.
    fn finish(self) -> ReplayReport {
        let stats = self.cache.stats();
        let mut r = self.report;
        r.corrupted_sessions = self.sessions.iter().filter(|s| s.corrupted).count() as u64;
        r.sessions_with_loaded_pages = self.sessions.iter().filter(|s| s.loaded).count() as u64;
        r.backed_up_pages = stats.backed_up_pages;
        r.loaded_pages = stats.loaded_pages;
        r.backed_up_bytes = stats.backed_up_bytes;
        r.loaded_bytes = stats.loaded_bytes;
        r.backup_transfers = stats.backups;
        r.load_transfers = stats.loads;
        r.refused_transfers = stats.refused;
        r
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
        if pos < self.w.prefix_pages * self.page_size_tokens {
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
        let slot = pos % self.page_size_tokens;
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
            self.write_token(id, owner, index * self.page_size_tokens + t)?;
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
        let page_index = pos / self.page_size_tokens;
        if pos.is_multiple_of(self.page_size_tokens) {
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
        let len = self.w.prefix_pages * self.page_size_tokens;
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

    /// One turn of the sessions in `batch`: pin their pages, load back those not on the device
    /// (recomputing those without a valid host copy), prefill the turn's prompt, decode, unpin.
    fn run_batch(&mut self, turn: u64, batch: Range<u64>) -> Result<(), ReplayError> {
        // Attach shared prefixes made by earlier batches (first turn).
        if turn == 0 {
            for sid in batch.clone() {
                self.attach_prefix(sid)?;
            }
        }
        let pinned_ids = self.pin_pages(batch.clone());
        let missing_ids: Vec<usize> = pinned_ids
            .iter()
            .copied()
            .filter(|&id| self.pages[id].device.is_none())
            .collect();
        self.report.device_page_hits += (pinned_ids.len() - missing_ids.len()) as u64;
        let new_pages = self.turn_new_pages(turn, batch.clone());
        self.make_room_for_batch(missing_ids.len(), new_pages)?;
        let loaded_ids = self.load_pages(&missing_ids)?;
        for sid in batch.clone() {
            let s = &self.sessions[sid as usize];
            if s.pages.iter().any(|id| loaded_ids.contains(id)) {
                self.sessions[sid as usize].loaded = true;
            }
        }
        self.prefill(turn, batch.clone())?;
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

    /// Pins every page of the sessions in `batch`; returns those this call pinned (a page
    /// shared by two sessions of the batch once), in session and page order.
    fn pin_pages(&mut self, batch: Range<u64>) -> Vec<usize> {
        let mut pinned_ids = Vec::new();
        for sid in batch {
            for &id in &self.sessions[sid as usize].pages {
                if !self.pages[id].pinned {
                    self.pages[id].pinned = true;
                    pinned_ids.push(id);
                }
            }
        }
        pinned_ids
    }

    /// Pages the sessions in `batch` will append this turn (the prefix, on a first turn
    /// without one attached, the prompt and the decoded tokens).
    fn turn_new_pages(&self, turn: u64, batch: Range<u64>) -> u64 {
        let mut new_pages = 0u64;
        for sid in batch {
            let len_tokens = self.sessions[sid as usize].len;
            let mut add_tokens = self.w.user_tokens + self.w.decode_tokens;
            if turn == 0 && len_tokens == 0 {
                add_tokens += self.w.prefix_pages * self.page_size_tokens;
            }
            new_pages += (len_tokens + add_tokens).div_ceil(self.page_size_tokens)
                - len_tokens.div_ceil(self.page_size_tokens);
        }
        new_pages
    }

    /// Room for the `missing_pages` to load and, as far as unpinned pages allow, for the
    /// `new_pages` this turn will append, so that evictions are backed up in one transfer per
    /// batch.
    fn make_room_for_batch(
        &mut self,
        missing_pages: usize,
        new_pages: u64,
    ) -> Result<(), ReplayError> {
        let evictable_pages = (0..self.pages.len())
            .filter(|&i| self.pages[i].device.is_some() && !self.pages[i].pinned)
            .count();
        let room_pages =
            (missing_pages + new_pages as usize).min(self.device_free.len() + evictable_pages);
        self.make_room(room_pages.max(missing_pages))
    }

    /// Gives each page of `missing_ids` a device slot and loads those with a valid host copy
    /// back from the host pool, layer by layer; recomputes the others, and all of them when a
    /// layer's load is refused. Returns the pages loaded from the host pool.
    fn load_pages(&mut self, missing_ids: &[usize]) -> Result<Vec<usize>, ReplayError> {
        let mut pairs = Vec::new();
        let mut loaded_ids = Vec::new();
        let mut lost_ids = Vec::new();
        for &id in missing_ids {
            let d = self
                .device_free
                .pop()
                .ok_or_else(|| workload_err(Param::DevicePages, "no free page".into()))?;
            self.pages[id].device = Some(d);
            match (self.pages[id].host, self.pages[id].host_valid) {
                (Some(h), true) => {
                    pairs.push(PagePair::new(d, h));
                    loaded_ids.push(id);
                }
                _ => lost_ids.push(id),
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
                lost_ids.extend(loaded_ids.iter().copied());
            }
        }
        for id in lost_ids {
            self.recompute(id)?;
        }
        Ok(loaded_ids)
    }

    /// Prefill: the first session of a group writes its prefix (on the first turn); then the
    /// turn's prompt.
    fn prefill(&mut self, turn: u64, batch: Range<u64>) -> Result<(), ReplayError> {
        for sid in batch {
            let s = &self.sessions[sid as usize];
            let g = s.group;
            if turn == 0 && s.len == 0 && !self.attach_prefix(sid)? {
                for _ in 0..self.w.prefix_pages * self.page_size_tokens {
                    self.append(sid)?;
                }
                let ids = self.sessions[sid as usize].pages.clone();
                self.prefix.insert(g, ids);
            }
            for _ in 0..self.w.user_tokens {
                self.append(sid)?;
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
                                    .offset_bytes(s, t, 0, self.page_size_tokens)
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
                let page_index = pos / self.page_size_tokens;
                let id = self.sessions[sid as usize].pages[page_index as usize];
                let dev = self.pages[id].device.unwrap_or(0);
                let got =
                    self.cache
                        .device()
                        .read_token(self.kv, l, dev, pos % self.page_size_tokens)?;
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
