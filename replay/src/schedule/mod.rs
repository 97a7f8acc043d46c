//! A page-accurate model of SGLang's hierarchical cache (HiCache) on a request trace: which
//! pages each request finds on the device, loads from the host, or recomputes, and which pages
//! are backed up. It decides *what* moves; a [`PageStore`] moves the bytes.
//!
//! Followed from sglang `python/sglang/srt/mem_cache/radix_cache.py` (prefix matching,
//! `lock_ref`, LRU leaf eviction by `last_access_time`, page-aligned keys: a request's trailing
//! partial page is never cached) and `python/sglang/srt/mem_cache/hiradix_cache.py`:
//! - `evict`: device leaves (nodes whose children are all off the device), least recently used
//!   first, locked nodes skipped; under `write_back` a node not yet on the host is written to it
//!   (`write_backup`, which calls `evict_host` when the host pool is full) and then its device
//!   pages are freed (`_evict_backuped`); a node the host cannot take is dropped
//!   (`_evict_regular`). Under `write_through` (`write_through_threshold` 1) a node is written to
//!   the host when it is inserted (`inc_hit_count`), so eviction only frees device pages.
//! - `evict_host`: host-only leaves, least recently used first; the node is deleted.
//! - `load_back` / `init_load_back`: every host-only node on the matched path is loaded back to
//!   the device before prefill, all or nothing (layer by layer, `load_to_device_per_layer`).
//!
//! The transfers themselves follow `python/sglang/srt/managers/cache_controller.py`
//! (`HiCacheController.write`: device -> host for all layers at once; `load`: host -> device,
//! consumed layer by layer during the forward pass), and the host pool's size
//! `python/sglang/srt/mem_cache/memory_pool_host.py` (`--hicache-ratio` x the device pool, or
//! `--hicache-size`).
//!
//! Units: a page is `page_size_tokens` (64) tokens; a trace block is 512 tokens, so a block is
//! one radix node of up to 8 pages (SGLang's tree compresses a chain of blocks into one node and
//! evicts a whole leaf node at once; here a leaf block of at most 8 pages is the unit: eviction
//! is finer, never coarser). A request caches `floor(input_length / 64)` pages; its last partial
//! page and its decoded tokens occupy private device pages while it runs and are freed when it
//! finishes (the trace gives decoded tokens no block ids, so they cannot be matched later).
//!
//! Time: a request is admitted at its timestamp, or when enough pages are free (first come,
//! first served); it holds its pages for `recomputed_tokens / prefill_tokens_per_s +
//! output_length x decode_ms_per_token`. Requests do not slow each other down (no GPU queue).

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap, HashMap};

use kvlayout_pool::PagePair;

use crate::error::{Param, ReplayError, workload_err};
use crate::trace::{BLOCK_TOKENS, Request, line_err};

mod tree;

/// When a device page is written to the host pool (sglang `--hicache-write-policy`).
///
/// With the feature `clap`, a `clap::ValueEnum` taking SGLang's and the report's names
/// (`write_back`, `write_through`) and, as aliases, the dashed ones the CLI documented before.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[cfg_attr(feature = "clap", value(rename_all = "snake_case"))]
pub enum WritePolicy {
    /// At eviction from the device.
    #[cfg_attr(feature = "clap", value(alias = "write-back"))]
    WriteBack,
    /// When the page is computed (inserted into the tree).
    #[cfg_attr(feature = "clap", value(alias = "write-through"))]
    WriteThrough,
}

/// Capacities and timing of the model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScheduleConfig {
    /// Device pool pages.
    pub device_pages: u64,
    /// Host pool pages.
    pub host_pages: u64,
    /// Tokens per page (64 for the trace's 512-token blocks: 8 pages per block).
    pub page_size_tokens: u64,
    /// Write policy.
    pub write_policy: WritePolicy,
    /// Prefill speed of one request, tokens per second.
    pub prefill_tokens_per_s: u64,
    /// Decode time per output token, milliseconds.
    pub decode_ms_per_token: u64,
}

/// A page of a block: where its bytes come from (the keys are derived from these).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PageId {
    /// The block's hash id.
    pub hash_id: u64,
    /// Page index inside the block (0..8).
    pub page: u64,
}

/// Moves the bytes the schedule decides on.
pub trait PageStore {
    /// Writes a freshly computed page into device page `device_page`.
    ///
    /// # Errors
    ///
    /// When the page cannot be written (the implementation's error).
    fn compute(&mut self, page: PageId, device_page: u64) -> Result<(), ReplayError>;
    /// Copies device pages to host pages (one all-layer backup); false when refused.
    ///
    /// # Errors
    ///
    /// When the copy fails for another reason than a refusal (a refusal is `Ok(false)`).
    fn backup(&mut self, pairs: &[PagePair]) -> Result<bool, ReplayError>;
    /// Copies host pages to device pages, layer by layer; false when refused (the pages are
    /// then recomputed).
    ///
    /// # Errors
    ///
    /// When the copy fails for another reason than a refusal (a refusal is `Ok(false)`).
    fn load(&mut self, pairs: &[PagePair]) -> Result<bool, ReplayError>;
    /// The request's context is `pages` (block pages in order, on the device); it loaded pages
    /// from the host. Returns whether what the model reads differs from the reference.
    ///
    /// # Errors
    ///
    /// When the pages cannot be read or decoded.
    fn check(&mut self, request: &Request, pages: &[(PageId, u64)]) -> Result<bool, ReplayError>;
}

/// What happened to one request.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RequestOutcome {
    /// Prompt tokens found on the device.
    pub device_tokens: u64,
    /// Prompt tokens loaded from the host.
    pub host_tokens: u64,
    /// Prompt tokens computed (not cached, or lost).
    pub recomputed_tokens: u64,
    /// Pages loaded from the host.
    pub loaded_pages: u64,
    /// The indexer saw different keys or latent rows than the reference.
    pub corrupted: bool,
    /// Admission time, ms.
    pub admitted_ms: u64,
}

/// Page counts over the whole run.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct PageCounts {
    /// Pages found on the device.
    pub device_hit_pages: u64,
    /// Pages loaded host -> device.
    pub loaded_pages: u64,
    /// Pages computed (prefill).
    pub computed_pages: u64,
    /// Pages backed up device -> host.
    pub backed_up_pages: u64,
    /// Device pages freed by eviction.
    pub evicted_device_pages: u64,
    /// Host pages freed by host eviction.
    pub evicted_host_pages: u64,
    /// Nodes dropped because the host could not take them.
    pub dropped_pages: u64,
    /// Transfers refused by the shim or the backend.
    pub refused_transfers: u64,
    /// Requests that waited for free pages past their timestamp.
    pub delayed_requests: u64,
}

const NONE: u32 = u32::MAX;

#[derive(Clone, Debug)]
struct Node {
    hash_id: u64,
    parent: u32,
    pages: u8,
    children: u32,
    device_children: u32,
    lock: u32,
    last_access: u64,
    on_device: bool,
    on_host: bool,
    device: [u32; 8],
    host: [u32; 8],
    in_device_lru: bool,
    in_host_lru: bool,
}

/// The longest cached prefix of a request's blocks ([`Schedule::match_path`]).
struct PathMatch {
    /// The path's nodes, root first.
    matched: Vec<u32>,
    /// Pages of the host-only nodes on the path (to load).
    load_pages: u64,
    /// Pages of the cached blocks the path lacks (to compute).
    missing_pages: u64,
}

/// A request whose pages fit: its cached blocks `(hash id, pages)`, the matched path (locked),
/// the device pages it needs and those private to it.
struct Admission {
    blocks: Vec<(u64, u64)>,
    matched: Vec<u32>,
    need: u64,
    private_pages: u64,
}

/// The host-only nodes of a path loaded back ([`Schedule::load_back`]) and whether the load
/// went through (false: refused and recomputed; also false when there was none).
struct LoadBack {
    nodes: Vec<u32>,
    ok: bool,
}

/// A request's blocks in place ([`Schedule::place_blocks`]): its context, `(page, device
/// page)` in prompt order, and the nodes it holds (locked) while it runs.
struct Placed {
    context: Vec<(PageId, u64)>,
    nodes: Vec<u32>,
}

/// A running request: its nodes (locked) and its private pages.
struct Running {
    nodes: Vec<u32>,
    private: Vec<u32>,
}

/// The model's state.
pub struct Schedule {
    cfg: ScheduleConfig,
    nodes: Vec<Node>,
    free_nodes: Vec<u32>,
    by_hash: HashMap<u64, u32>,
    device_free: Vec<u32>,
    host_free: Vec<u32>,
    device_lru: BTreeSet<(u64, u32)>,
    host_lru: BTreeSet<(u64, u32)>,
    /// Device pages of unlocked nodes (evictable, leaves first).
    evictable_pages: u64,
    clock: u64,
    now_ms: u64,
    running: BinaryHeap<Reverse<(u64, u64)>>,
    running_reqs: HashMap<u64, Running>,
    /// Backups queued, with their nodes.
    pending_backup: Vec<(u32, PagePair)>,
    /// Counters.
    pub counts: PageCounts,
}

/// Whether the schedule models pages of `page_size_tokens`: it must divide the trace's
/// 512-token blocks into at most 8 pages (64 tokens or more).
///
/// # Errors
///
/// [`ReplayError::Workload`] naming the page size.
pub fn check_page_size(page_size_tokens: u64) -> Result<(), ReplayError> {
    if page_size_tokens == 0 {
        return Err(workload_err(
            Param::PageSizeTokens,
            "must be at least 1, got 0".into(),
        ));
    }
    if !BLOCK_TOKENS.is_multiple_of(page_size_tokens) {
        return Err(workload_err(
            Param::PageSizeTokens,
            format!("{page_size_tokens} does not divide the trace's {BLOCK_TOKENS}-token blocks"),
        ));
    }
    if BLOCK_TOKENS / page_size_tokens > 8 {
        return Err(workload_err(
            Param::PageSizeTokens,
            format!(
                "{page_size_tokens} gives {} pages per {BLOCK_TOKENS}-token block; at most 8 are modelled",
                BLOCK_TOKENS / page_size_tokens
            ),
        ));
    }
    Ok(())
}

impl Schedule {
    /// An empty cache.
    ///
    /// # Errors
    ///
    /// [`ReplayError::Workload`] naming the parameter: a page size that does not divide the trace's
    /// 512-token blocks or gives more than 8 pages a block; device pages, host pages or prefill
    /// speed of 0 or over `u32::MAX - 1`.
    pub fn new(cfg: ScheduleConfig) -> Result<Schedule, ReplayError> {
        check_page_size(cfg.page_size_tokens)?;
        for (field, v) in [
            (Param::DevicePages, cfg.device_pages),
            (Param::HostPages, cfg.host_pages),
            (Param::PrefillTokensPerS, cfg.prefill_tokens_per_s),
        ] {
            if v == 0 {
                return Err(workload_err(field, "must be at least 1, got 0".into()));
            }
            if v > u64::from(u32::MAX - 1) {
                return Err(workload_err(field, format!("{v} is over {}", u32::MAX - 1)));
            }
        }
        Ok(Schedule {
            device_free: (0..cfg.device_pages as u32).rev().collect(),
            host_free: (0..cfg.host_pages as u32).rev().collect(),
            cfg,
            nodes: Vec::new(),
            free_nodes: Vec::new(),
            by_hash: HashMap::new(),
            device_lru: BTreeSet::new(),
            host_lru: BTreeSet::new(),
            evictable_pages: 0,
            clock: 0,
            now_ms: 0,
            running: BinaryHeap::new(),
            running_reqs: HashMap::new(),
            pending_backup: Vec::new(),
            counts: PageCounts::default(),
        })
    }

    fn pages_per_block(&self) -> u64 {
        BLOCK_TOKENS / self.cfg.page_size_tokens
    }

    /// Finishes every running request that ends at or before `t_ms`.
    fn finish_until(&mut self, t_ms: u64) {
        while let Some(&Reverse((end, id))) = self.running.peek() {
            if end > t_ms {
                break;
            }
            self.running.pop();
            self.release(id);
        }
    }

    fn release(&mut self, id: u64) {
        if let Some(r) = self.running_reqs.remove(&id) {
            for &n in &r.nodes {
                self.unlock(n);
            }
            self.device_free.extend(r.private);
        }
    }

    /// Finishes every request still running (end of the trace).
    pub fn drain(&mut self) {
        while let Some(Reverse((end, id))) = self.running.pop() {
            self.now_ms = self.now_ms.max(end);
            self.release(id);
        }
    }

    /// Admits `req` (at its timestamp or when pages free up), moves its pages through `store`
    /// and checks it when it loaded pages from the host.
    ///
    /// # Errors
    ///
    /// A trace-line error naming the line and field when its token counts or end time overflow 64
    /// bits, or a block id appears under another prefix; [`ReplayError::Workload`] naming the
    /// device pages when the request cannot fit even with every other request finished; and
    /// whatever `store` returns.
    pub fn admit<S: PageStore>(
        &mut self,
        req: &Request,
        store: &mut S,
    ) -> Result<RequestOutcome, ReplayError> {
        let page = self.cfg.page_size_tokens;
        let cached_pages = req.input_tokens / page;
        let total_pages = req
            .input_tokens
            .checked_add(req.output_tokens)
            .ok_or_else(|| {
                line_err(
                    req.line,
                    "output_length",
                    format!(
                        "input_length {} + output_length {} tokens overflows 64 bits",
                        req.input_tokens, req.output_tokens
                    ),
                )
            })?
            .div_ceil(page);
        let private_pages = total_pages - cached_pages;
        self.now_ms = self.now_ms.max(req.timestamp_ms);
        self.finish_until(self.now_ms);
        let blocks = self.cached_blocks(req, cached_pages);
        loop {
            let path = self.match_path(req, &blocks)?;
            let compute_pages = path.missing_pages;
            let need = path.load_pages + compute_pages + private_pages;
            for &n in &path.matched {
                self.lock(n);
            }
            let available = self.device_free.len() as u64 + self.evictable_pages;
            if need > available {
                for &n in &path.matched {
                    self.unlock(n);
                }
                // Wait for the next request to finish.
                let Some(Reverse((end, id))) = self.running.pop() else {
                    return Err(workload_err(
                        Param::DevicePages,
                        format!(
                            "{} pages cannot hold the request of trace line {}: it needs {need} \
                             pages ({} to load, {compute_pages} to compute, \
                             {private_pages} private for its {} prompt tokens past the last \
                             full page and {} decoded tokens)",
                            self.cfg.device_pages,
                            req.line,
                            path.load_pages,
                            req.input_tokens % page,
                            req.output_tokens
                        ),
                    ));
                };
                self.now_ms = self.now_ms.max(end);
                self.release(id);
                self.finish_until(self.now_ms);
                continue;
            }
            return self.run_admitted(
                req,
                store,
                Admission {
                    blocks,
                    matched: path.matched,
                    need,
                    private_pages,
                },
            );
        }
    }

    /// The prompt's blocks that cache at least one page, `(hash id, pages)`: the first
    /// `cached_pages` pages of the prompt, [`Self::pages_per_block`] to a block.
    fn cached_blocks(&self, req: &Request, cached_pages: u64) -> Vec<(u64, u64)> {
        let per_block = self.pages_per_block();
        req.hash_ids
            .iter()
            .enumerate()
            .map(|(j, &h)| {
                (
                    h,
                    cached_pages
                        .saturating_sub(j as u64 * per_block)
                        .min(per_block),
                )
            })
            .filter(|&(_, p)| p > 0)
            .collect()
    }

    /// Matches `blocks` against the tree (sglang `match_prefix`): the nodes of the longest
    /// cached prefix, device and host-only alike, up to the first block missing or cached
    /// shorter. A block id found under another parent than the previous block is an error
    /// naming the trace line and `hash_ids`.
    fn match_path(&self, req: &Request, blocks: &[(u64, u64)]) -> Result<PathMatch, ReplayError> {
        let mut matched: Vec<u32> = Vec::new();
        let mut load_pages = 0u64;
        for &(h, p) in blocks {
            let Some(&n) = self.by_hash.get(&h) else {
                break;
            };
            let node = &self.nodes[n as usize];
            let expected_parent = matched.last().copied().unwrap_or(NONE);
            if node.parent != expected_parent {
                return Err(crate::trace::TraceError::Line {
                    line: req.line,
                    field: "hash_ids".into(),
                    problem: format!(
                        "block id {h} follows another prefix here than where it was first seen"
                    ),
                }
                .into());
            }
            let have = u64::from(node.pages);
            if !node.on_device {
                load_pages += have;
            }
            matched.push(n);
            if have < p {
                break;
            }
        }
        let matched_pages: u64 = matched
            .iter()
            .zip(blocks)
            .map(|(&n, &(_, p))| u64::from(self.nodes[n as usize].pages).min(p))
            .sum();
        let missing_pages = blocks.iter().map(|&(_, p)| p).sum::<u64>() - matched_pages;
        Ok(PathMatch {
            matched,
            load_pages,
            missing_pages,
        })
    }

    /// Runs an admitted request, phase by phase: evict for its pages, load its host-only
    /// nodes back, place its blocks (reused, loaded or computed), take its private pages,
    /// check what the indexer reads when it loaded pages, and schedule its end.
    fn run_admitted<S: PageStore>(
        &mut self,
        req: &Request,
        store: &mut S,
        admission: Admission,
    ) -> Result<RequestOutcome, ReplayError> {
        let Admission {
            blocks,
            matched,
            need,
            private_pages,
        } = admission;
        if (self.device_free.len() as u64) < need {
            self.evict(need, store)?;
        }
        let mut out = RequestOutcome {
            admitted_ms: self.now_ms,
            ..RequestOutcome::default()
        };
        if self.now_ms > req.timestamp_ms {
            self.counts.delayed_requests += 1;
        }
        let loaded = self.load_back(&matched, store)?;
        let placed = self.place_blocks(req, store, &blocks, &matched, &loaded, &mut out)?;
        // The rest of the prompt (a partial last page) is computed too.
        out.recomputed_tokens +=
            req.input_tokens - (out.device_tokens + out.host_tokens + out.recomputed_tokens);
        for &n in &placed.nodes {
            self.touch(n);
        }
        self.flush_backups(store)?;
        let private = self.take_private_pages(private_pages)?;
        if out.loaded_pages > 0 {
            out.corrupted = store.check(req, &placed.context)?;
        }
        let end = self.end_ms(req, out.recomputed_tokens)?;
        self.running.push(Reverse((end, req.line)));
        self.running_reqs.insert(
            req.line,
            Running {
                nodes: placed.nodes,
                private,
            },
        );
        Ok(out)
    }

    /// Loads the host-only nodes of `matched` back into free device pages, all or nothing
    /// (sglang `load_back`); a refused load leaves them on the device recomputed from the
    /// prompt.
    fn load_back<S: PageStore>(
        &mut self,
        matched: &[u32],
        store: &mut S,
    ) -> Result<LoadBack, ReplayError> {
        let mut pairs = Vec::new();
        let mut loading = Vec::new();
        for &n in matched {
            let node = &self.nodes[n as usize];
            if node.on_device {
                continue;
            }
            let mut device = [0u32; 8];
            for (slot, &h) in device.iter_mut().zip(&node.host).take(node.pages as usize) {
                *slot = self.device_free.pop().ok_or_else(|| {
                    workload_err(Param::DevicePages, "no free page after eviction".into())
                })?;
                pairs.push(PagePair::new(u64::from(*slot), u64::from(h)));
            }
            self.nodes[n as usize].device = device;
            loading.push(n);
        }
        let mut loaded_ok = false;
        if !pairs.is_empty() {
            loaded_ok = store.load(&pairs)?;
            if loaded_ok {
                self.counts.loaded_pages += pairs.len() as u64;
            } else {
                self.counts.refused_transfers += 1;
                self.counts.computed_pages += pairs.len() as u64;
            }
            for &n in &loading {
                self.set_on_device(n, true);
                if !loaded_ok {
                    // Refused: the pages are recomputed from the prompt.
                    let node = self.nodes[n as usize].clone();
                    for i in 0..node.pages as usize {
                        store.compute(
                            PageId {
                                hash_id: node.hash_id,
                                page: i as u64,
                            },
                            u64::from(node.device[i]),
                        )?;
                    }
                }
            }
        }
        Ok(LoadBack {
            nodes: loading,
            ok: loaded_ok,
        })
    }

    /// Walks the prompt's `blocks` along the `matched` path, counting into `out` the tokens
    /// found on the device, loaded from the host or recomputed, and computing what is missing
    /// (a new node, or the pages a node cached shorter lacks). A block id cached under another
    /// prefix is an error naming the trace line and `hash_ids`.
    fn place_blocks<S: PageStore>(
        &mut self,
        req: &Request,
        store: &mut S,
        blocks: &[(u64, u64)],
        matched: &[u32],
        loaded: &LoadBack,
        out: &mut RequestOutcome,
    ) -> Result<Placed, ReplayError> {
        let page = self.cfg.page_size_tokens;
        // Tokens by source, page by page along the prompt's cached pages.
        let mut context: Vec<(PageId, u64)> = Vec::new();
        let mut nodes_held = matched.to_vec();
        let mut parent = NONE;
        for (j, &(h, p)) in blocks.iter().enumerate() {
            let n = match matched.get(j) {
                Some(&n) => n,
                None => {
                    if self.by_hash.contains_key(&h) {
                        return Err(crate::trace::TraceError::Line {
                            line: req.line,
                            field: "hash_ids".into(),
                            problem: format!(
                                "block id {h} is cached under another prefix than this request's"
                            ),
                        }
                        .into());
                    }
                    let n = self.new_node(h, parent, 0);
                    self.lock(n);
                    nodes_held.push(n);
                    n
                }
            };
            let have = u64::from(self.nodes[n as usize].pages);
            let from_host = loaded.nodes.contains(&n);
            let reused = have.min(p);
            if j < matched.len() {
                if from_host && loaded.ok {
                    out.host_tokens += reused * page;
                    out.loaded_pages += reused;
                } else if from_host {
                    out.recomputed_tokens += reused * page;
                } else {
                    out.device_tokens += reused * page;
                    self.counts.device_hit_pages += reused;
                }
            }
            if p > have {
                // Compute the missing pages of this block (a new node, or a longer version of
                // a block seen shorter before: its host copy, if any, no longer covers it).
                self.grow(n, p, store)?;
                out.recomputed_tokens += (p - have) * page;
                self.counts.computed_pages += p - have;
            }
            let node = &self.nodes[n as usize];
            for i in 0..p as usize {
                context.push((
                    PageId {
                        hash_id: h,
                        page: i as u64,
                    },
                    u64::from(node.device[i]),
                ));
            }
            parent = n;
        }
        Ok(Placed {
            context,
            nodes: nodes_held,
        })
    }

    /// `private_pages` free device pages for the prompt's partial last page and the decoded
    /// tokens.
    fn take_private_pages(&mut self, private_pages: u64) -> Result<Vec<u32>, ReplayError> {
        let mut private = Vec::with_capacity(private_pages as usize);
        for _ in 0..private_pages {
            private.push(self.device_free.pop().ok_or_else(|| {
                workload_err(Param::DevicePages, "no free page for decoding".into())
            })?);
        }
        Ok(private)
    }

    /// When a request admitted now ends: its `recomputed_tokens` at `prefill_tokens_per_s`,
    /// then its output tokens at `decode_ms_per_token`. Checked: a time past 2^64 ms is an
    /// error naming the line, the field and the flag.
    fn end_ms(&self, req: &Request, recomputed_tokens: u64) -> Result<u64, ReplayError> {
        let prefill_ms = recomputed_tokens
            .checked_mul(1000)
            .ok_or_else(|| {
                line_err(
                    req.line,
                    "input_length",
                    format!(
                        "{recomputed_tokens} recomputed tokens x 1000 ms/s overflows 64 bits \
                         (prefill time at --prefill-tokens-per-s)"
                    ),
                )
            })?
            .div_ceil(self.cfg.prefill_tokens_per_s);
        let decode_ms = req
            .output_tokens
            .checked_mul(self.cfg.decode_ms_per_token)
            .ok_or_else(|| {
                line_err(
                    req.line,
                    "output_length",
                    format!(
                        "{} tokens x --decode-ms-per-token {} ms overflows 64 bits",
                        req.output_tokens, self.cfg.decode_ms_per_token
                    ),
                )
            })?;
        let end_ms = self
            .now_ms
            .checked_add(prefill_ms)
            .and_then(|t| t.checked_add(decode_ms))
            .ok_or_else(|| {
                line_err(
                    req.line,
                    "output_length",
                    format!(
                        "the request ends at {} ms (admitted) + {prefill_ms} ms (prefill) + \
                         {decode_ms} ms ({} tokens x --decode-ms-per-token {} ms): overflows 64 bits",
                        self.now_ms, req.output_tokens, self.cfg.decode_ms_per_token
                    ),
                )
            })?;
        Ok(end_ms)
    }

    /// Gives node `n` (locked, on the device or new) `p` pages, computing the new ones.
    fn grow<S: PageStore>(&mut self, n: u32, p: u64, store: &mut S) -> Result<(), ReplayError> {
        let have = self.nodes[n as usize].pages as usize;
        self.unindex(n);
        if self.nodes[n as usize].on_host {
            let node = &mut self.nodes[n as usize];
            node.on_host = false;
            let host = node.host;
            self.host_free.extend_from_slice(&host[..have]);
        }
        let mut device = self.nodes[n as usize].device;
        for slot in device.iter_mut().take(p as usize).skip(have) {
            *slot = self.device_free.pop().ok_or_else(|| {
                workload_err(Param::DevicePages, "no free page for prefill".into())
            })?;
        }
        let hash_id = self.nodes[n as usize].hash_id;
        for (i, &d) in device.iter().enumerate().take(p as usize).skip(have) {
            store.compute(
                PageId {
                    hash_id,
                    page: i as u64,
                },
                u64::from(d),
            )?;
        }
        let was_on = self.nodes[n as usize].on_device;
        {
            let node = &mut self.nodes[n as usize];
            node.device = device;
            node.pages = p as u8;
        }
        self.index(n);
        // Locked: not evictable, so only the parent's device count changes when it is new.
        if !was_on {
            self.set_on_device(n, true);
        }
        if self.cfg.write_policy == WritePolicy::WriteThrough {
            self.write_backup(n, store)?;
        }
        Ok(())
    }

    /// Simulated time, ms: the last admission or finish.
    pub fn now_ms(&self) -> u64 {
        self.now_ms
    }

    /// Device pages in use by cached nodes and running requests.
    pub fn device_used_pages(&self) -> u64 {
        self.cfg.device_pages - self.device_free.len() as u64
    }

    /// Host pages in use.
    pub fn host_used_pages(&self) -> u64 {
        self.cfg.host_pages - self.host_free.len() as u64
    }
}

#[cfg(test)]
mod tests;
