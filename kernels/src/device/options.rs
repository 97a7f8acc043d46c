//! What a caller may choose about a launch (SMs, work order, run order) and what the transfer
//! chooser picked.

use crate::copy_runs::{ByteRun, RunScan};

/// How many multiprocessors a launch may use, to leave the rest to the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LaunchShape {
    /// Most multiprocessors to use (`None`: all). The grid is `max_sms * blocks_per_sm` blocks
    /// of 256 threads at most; the work is strided over it.
    pub max_sms: Option<u32>,
    /// Blocks per multiprocessor (8 blocks of 256 threads fill an H200 SM; the token kernel
    /// keeps 4 resident).
    pub blocks_per_sm: u32,
    /// The token kernel (lists of runs of one length it takes: `copy_runs_uniform_paced`)
    /// moves at most about this many bytes per microsecond (MB/s) on average over a launch,
    /// each warp starting its k-th group of runs no earlier than k paces after its first, on
    /// the GPU's global timer (`None`: as fast as it can; `Some(0)`: refused by the token
    /// kernel, [`crate::KernelError::Spec`] naming `rate_limit_bytes_per_us`). The run-list
    /// kernel of other lists (several lengths, runs under 128 B or over 4 KiB, unaligned)
    /// ignores it, `Some(0)` included.
    pub rate_limit_bytes_per_us: Option<u64>,
}

impl Default for LaunchShape {
    fn default() -> LaunchShape {
        LaunchShape {
            max_sms: None,
            blocks_per_sm: 8,
            rate_limit_bytes_per_us: None,
        }
    }
}

impl LaunchShape {
    /// At most `sms` multiprocessors, 8 blocks each.
    pub const fn sm_budget(sms: u32) -> LaunchShape {
        LaunchShape {
            max_sms: Some(sms),
            blocks_per_sm: 8,
            rate_limit_bytes_per_us: None,
        }
    }
}

/// Run lists at least this long are sorted on several threads ([`RunOrder::sorted_and_merged`]).
pub(crate) const PARALLEL_SORT_MIN_RUNS: usize = 32 * 1024;

/// The order a run list is executed in. Every order moves the same bytes (destination ranges
/// must not overlap); walking the host side in address order keeps PCIe writes and reads
/// sequential when the host pool is page-major (`page_first`): about 0.87 -> 0.95 of memcpy for
/// a 4096-page backup on the H200 (BENCHMARKS.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RunOrder {
    /// The caller's order.
    AsGiven,
    /// By source offset (loads: the host is the source).
    SrcAscending,
    /// By destination offset (backups: the host is the destination).
    DstAscending,
}

impl RunOrder {
    /// `runs` in this order, then neighbours that continue each other on both sides merged
    /// into one run (same bytes moved, fewer runs: the tokens of one page, the layers of one
    /// page when both sides are page-major).
    ///
    /// Lists of at least `PARALLEL_SORT_MIN_RUNS` runs are sorted on rayon's threads (a
    /// 1,024-page, 61-layer backup is 124,928 runs: 4.5 ms on one thread of the build machine,
    /// most of the host's planning of a gathered backup). Runs with equal keys may come in any
    /// order among themselves (on either sort), which moves the same bytes unless their
    /// destinations overlap (and the copy engines' batches never order those anyway).
    ///
    /// A list made of contiguous blocks that do not interleave (what the pool shim lays for a
    /// backup to a `page_first` host pool: each page pair's layers of one buffer one after the
    /// other on the host, the pairs in the caller's order) is put in order block by block
    /// ([`sort_ascending_blocks`]): 124,928 such runs took 4.2 ms to sort on the build machine.
    pub fn sorted_and_merged(self, runs: &[ByteRun]) -> Vec<ByteRun> {
        let key: fn(&ByteRun) -> u64 = match self {
            RunOrder::AsGiven => |_| 0,
            RunOrder::SrcAscending => |r| r.src_offset_bytes,
            RunOrder::DstAscending => |r| r.dst_offset_bytes,
        };
        let sorted: std::borrow::Cow<[ByteRun]> = match self {
            RunOrder::AsGiven => std::borrow::Cow::Borrowed(runs),
            _ => std::borrow::Cow::Owned(sort_ascending_blocks(runs, key).unwrap_or_else(|| {
                let mut v = runs.to_vec();
                // The key as a closure of its own per order, not through the `fn` pointer
                // (inlined): sorting and merging a layer's 2,048 runs took half the host time
                // (BENCHMARKS.md, "Host planning of a layer's load").
                match self {
                    RunOrder::SrcAscending => sort_runs_by(&mut v, |r| r.src_offset_bytes),
                    RunOrder::DstAscending => sort_runs_by(&mut v, |r| r.dst_offset_bytes),
                    RunOrder::AsGiven => {}
                }
                v
            })),
        };
        let mut out: Vec<ByteRun> = Vec::with_capacity(sorted.len());
        for &r in sorted.iter() {
            if r.len_bytes == 0 {
                continue;
            }
            match out.last_mut() {
                Some(last)
                    if last.src_offset_bytes.checked_add(last.len_bytes)
                        == Some(r.src_offset_bytes)
                        && last.dst_offset_bytes.checked_add(last.len_bytes)
                            == Some(r.dst_offset_bytes)
                        && last.len_bytes.checked_add(r.len_bytes).is_some() =>
                {
                    // Checked just above: a merged length that would not fit a u64 is left as
                    // two runs (unchecked lists may hold such runs; checked ones never do).
                    last.len_bytes += r.len_bytes;
                }
                _ => out.push(r),
            }
        }
        out
    }
}

/// True when [`RunOrder::AsGiven`]'s [`RunOrder::sorted_and_merged`] would change `runs`: an
/// empty run (dropped), or a run that continues the one before it on both sides (merged, the
/// sum of lengths fitting a `u64`). Otherwise the list is used as given, with no copy: token
/// lists between random slots rarely merge, and copying a layer's 32,768 runs (786 KB, page
/// faults included) was most of the chooser's host time per load call on the H200
/// (BENCHMARKS.md, "page size 1").
pub fn changed_by_merging(runs: &[ByteRun]) -> bool {
    // Any list, checked or not: a run ending past u64::MAX does not stop an empty run or two
    // neighbours before it from changing the list.
    crate::copy_runs::scan_facts(runs, u64::MAX, u64::MAX)
        .0
        .changed_by_merging
}

/// `runs` sorted by `key`: on rayon's threads from `PARALLEL_SORT_MIN_RUNS` runs (unstable),
/// else on this one (stable).
fn sort_runs_by<K: Fn(&ByteRun) -> u64 + Sync>(runs: &mut [ByteRun], key: K) {
    use rayon::slice::ParallelSliceMut;
    if runs.len() >= PARALLEL_SORT_MIN_RUNS {
        runs.par_sort_unstable_by_key(key);
    } else {
        runs.sort_by_key(key);
    }
}

/// Fewest runs per ascending block, on average, for [`sort_ascending_blocks`] to try.
pub(crate) const MIN_MEAN_BLOCK_RUNS: usize = 8;

/// `runs` in ascending `key` order when they are a sequence of contiguous blocks (in each
/// block every run starts, by `key`, where the one before it ends) that do not interleave:
/// the blocks put in order of their first key, when each then ends at or before the next
/// one's first key. `None` (the caller sorts) when the blocks interleave or are shorter than
/// `MIN_MEAN_BLOCK_RUNS` runs on average.
pub fn sort_ascending_blocks(runs: &[ByteRun], key: fn(&ByteRun) -> u64) -> Option<Vec<ByteRun>> {
    if !runs.is_empty() && runs.len() < MIN_MEAN_BLOCK_RUNS {
        // Fewer runs than one block's mean: never accepted; decided without allocating
        // (a one-page transfer is 2 runs).
        return None;
    }
    let mut blocks: Vec<(usize, usize)> = Vec::new(); // (start, end) in `runs`
    let mut start = 0;
    for i in 1..=runs.len() {
        let continues = i < runs.len()
            && key(&runs[i - 1]).checked_add(runs[i - 1].len_bytes) == Some(key(&runs[i]));
        if !continues {
            blocks.push((start, i));
            start = i;
            if blocks.len().saturating_mul(MIN_MEAN_BLOCK_RUNS) > runs.len() {
                return None;
            }
        }
    }
    blocks.sort_unstable_by_key(|&(s, _)| key(&runs[s]));
    let mut out = Vec::with_capacity(runs.len());
    for &(s, e) in &blocks {
        // The block before must end (its last run's key plus length) at or before this one.
        if let Some(last) = out.last()
            && key(last).checked_add(last.len_bytes)? > key(&runs[s])
        {
            return None;
        }
        out.extend_from_slice(&runs[s..e]);
    }
    Some(out)
}

/// `runs` put in ascending `key` order at bucket granularity, in two passes and no comparison
/// sort (a counting sort): the key range is cut into at most `max(1, runs.len() / 4)` buckets
/// (1,024 at most) of a power-of-two width, runs go bucket by bucket, and keep their list order inside a bucket.
/// For a token list between random slots this is the host-address order up to a few hundred
/// KiB: on the H200 next to a GEMM, a page-size-1 load whose runs walk the host pool in that
/// order moved 39.5-40.2 GB/s (DeepSeek-V3 MLA, 4 SMs) against 28.2-29.7 in the engine's
/// random slot order (BENCHMARKS.md, "GPU at page size 1"), while a comparison sort of a
/// layer's 16,384 to 32,768 runs costs the host about as long as the GPU takes to move them
/// (session 4).
pub fn in_key_buckets(runs: &[ByteRun], key: fn(&ByteRun) -> u64) -> Vec<ByteRun> {
    let span = runs.iter().map(key).max().unwrap_or(0);
    let mut out = Vec::new();
    in_key_buckets_into(runs, (key, span), &mut out, &mut Vec::new());
    out
}

/// Longest token list the chooser puts in host order ([`in_key_buckets_into`]): a layer's load
/// (16,384 to 32,768 runs at page size 1), one run-ring slot. A longer list (a backup of all
/// layers, about a million runs) keeps list order: in session 11 the chooser's backups alone
/// (no carve-out, 4 blocks per SM on 8 SMs) moved 0.819 and 0.762 of memcpy in list order
/// (Llama-3.1-8B and DeepSeek-V3 MLA), 0.664 and 0.451 ordered whole on one thread (the H200's
/// host the bound), 0.720 and 0.655 ordered part by part (32,768 runs) on rayon's threads; on
/// session 12's 8 blocks of one per SM, in list order, 0.844-0.864 and 0.808-0.814
/// (BENCHMARKS.md, "GPU at page size 1" and its appendix).
pub const HOST_ORDER_MAX_RUNS: usize = 32 * 1024;

/// Fewest runs per bucket of [`in_key_buckets`] on average: the counts of 4 runs' buckets
/// stay in the first-level cache for a layer's 16,384 to 32,768 runs.
const RUNS_PER_BUCKET: u64 = 4;

/// Most buckets of [`in_key_buckets`]: their counts (8 KiB) stay in the first-level cache and
/// the scatter writes to at most 1,024 places at a time. A 4.3 GB host pool is then ordered at
/// 4 MiB, far inside what the GPU's address translation holds at once.
const MAX_BUCKETS: u64 = 1024;

/// [`in_key_buckets`] into `out` (cleared first), with `starts` as scratch: both reused from
/// call to call, so a layer-by-layer load allocates (and faults in) nothing after its first
/// layer. The buckets cover keys `0..=key_span_bytes` (the key side's buffer length, known to
/// the caller: no pass to find the range); a larger key goes to the last bucket.
pub fn in_key_buckets_into(
    runs: &[ByteRun],
    run_key: RunKey,
    out: &mut Vec<ByteRun>,
    starts: &mut Vec<usize>,
) {
    out.clear();
    out.resize(runs.len(), ByteRun::default());
    buckets_into_slice(runs, run_key, out, starts);
}

/// The counting sort of [`in_key_buckets_into`] into `out` (`runs.len()` long).
fn buckets_into_slice(
    runs: &[ByteRun],
    (key, key_span_bytes): RunKey,
    out: &mut [ByteRun],
    starts: &mut Vec<usize>,
) {
    if runs.is_empty() {
        return;
    }
    // Buckets over 0..=key_span_bytes (the key side's buffer length: no pass for the range).
    // Bucket width 2^shift: the smallest with span >> shift below runs.len() / 4, and at
    // most MAX_BUCKETS buckets.
    let span = key_span_bytes;
    let target = (runs.len() as u64 / RUNS_PER_BUCKET).clamp(1, MAX_BUCKETS);
    let shift = (0..64).find(|&s| (span >> s) < target).unwrap_or(64);
    let last = bucket_count(span, shift) - 1;
    let bucket = |r: &ByteRun| (key(r).checked_shr(shift).unwrap_or(0) as usize).min(last);
    let buckets = bucket_count(span, shift);
    starts.clear();
    starts.resize(buckets + 1, 0);
    for r in runs {
        starts[bucket(r) + 1] += 1;
    }
    for b in 0..buckets {
        starts[b + 1] += starts[b];
    }
    for r in runs {
        let at = &mut starts[bucket(r)];
        out[*at] = *r;
        *at += 1;
    }
}

/// A run's key for [`in_key_buckets_into`] and the largest key it can have, in bytes (the
/// length of the buffer the key is an offset of).
pub type RunKey = (fn(&ByteRun) -> u64, u64);

/// Buckets of width `2^shift` that cover `0..=span`.
fn bucket_count(span: u64, shift: u32) -> usize {
    (span.checked_shr(shift).unwrap_or(0) as usize).saturating_add(1)
}

/// Registers and residency of one compiled kernel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelReport {
    /// Kernel name.
    pub name: String,
    /// Registers per thread.
    pub registers: i32,
    /// Blocks of 256 threads resident per multiprocessor.
    pub blocks_per_sm: u32,
}

/// Runs (after merging) at least this long on average go to the copy engines; shorter ones
/// (token-granular lists) to the SM kernel under `SM_BUDGET` = 8. A copy engine pays a fixed cost
/// per run; at 656-byte token runs it moves a small fraction of memcpy, at a 8,448-byte index-K
/// page most of it (BENCHMARKS.md, "Transfers next to the model").
pub(crate) const COPY_ENGINE_MIN_MEAN_RUN_BYTES: u64 = 4096;

/// Multiprocessors the token kernel may take when the model declares no carve-out
/// (token-granular runs): at page size 1 on the H200 the token kernel moved 0.903-0.910 of memcpy
/// alone on 8 SMs against 0.863-0.913 on 4 and 0.507-0.758 on 2 (Llama-3.1-8B and DeepSeek-V3
/// MLA loads), and no more on 16 or all SMs; next to a GEMM with no carve-out the first token
/// kernel on 8 SMs moved 0.619 of memcpy (Llama load, GEMM +19%), on 4 SMs 0.364 (+11%)
/// (BENCHMARKS.md, "page size 1").
pub(crate) const SM_BUDGET: u32 = 8;

/// Blocks of 8 warps (one per SM) the token kernel takes for a backup of token-granular runs
/// (device to host), carve-out or not, paced on a carve-out to a share of the host link
/// ([`crate::Gpu::set_backup_link_share_permille`]). On the H200 at page size 1, 8 such blocks
/// with an uploaded list moved 0.89-0.93 of memcpy alone (4 blocks 0.84-0.92, 2 blocks
/// 0.48-0.68; next to the GEMM about 12-13 GB/s a block up to 4), where the chooser's earlier
/// token backups at 4 blocks per SM on 8 SMs moved 0.69-0.82 (BENCHMARKS.md, "GPU at page size
/// 1").
pub(crate) const TOKEN_BACKUP_BLOCKS: u32 = 8;

/// Fewest lines a pitched group needs to go as one 2D copy; shorter groups are batched with the
/// single runs. Among random pages of one layer about half of the neighbouring runs pair up by
/// chance; sent as 2-line 2D copies (one driver call each) they took a layer-by-layer load of
/// 1,024 random DeepSeek-V3.2 pages from 0.89 to 0.23 of memcpy on the H200, while groups of
/// 61 layers (a backup) and of 1,024 consecutive pages moved as fast as the batch or faster, at
/// a seventh of its host time (BENCHMARKS.md, "Transfers next to the model").
pub(crate) const MIN_PITCHED_LINES: u64 = 8;

/// Most streams a copy-engine transfer is split over ([`crate::Gpu::enqueue_copy_runs_dma`]).
pub(crate) const MAX_COPY_ENGINE_LANES: usize = 8;

/// How a run list goes to the copy engines ([`crate::Gpu::enqueue_copy_runs_dma`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CopyEngineOptions {
    /// Order of the runs before neighbours are merged.
    pub order: RunOrder,
    /// Flag given to the driver.
    pub hint: CopyEngineHint,
    /// Streams the runs are split over (1 to `MAX_COPY_ENGINE_LANES`).
    pub lanes: usize,
    /// Most runs per `cuMemcpyBatchAsync` call.
    pub runs_per_call: usize,
    /// Consecutive runs with constant pitches, at least `MIN_PITCHED_LINES` of them, go as
    /// one 2D copy each ([`crate::pitched::group_pitched`], `cuMemcpy2DAsync`); the rest are
    /// batched.
    pub pitched: bool,
}

impl CopyEngineOptions {
    /// What the chooser uses for a transfer walked in `order`, set from measurement on the
    /// H200 (BENCHMARKS.md, "Transfers next to the model"): one stream, the overlap hint, host
    /// order, and runs with constant pitches as 2D copies (a backup of all layers: one copy
    /// per page and buffer, a seventh of the batch's host time; with 2D copies 8 streams moved
    /// no more than one). Loads ([`RunOrder::SrcAscending`]): 2,048 runs per batch call (8,192
    /// per call took a 4,096-page load from 47.4 to 12.7 GB/s). Backups
    /// ([`RunOrder::DstAscending`]) and as given: 16,384.
    pub const fn chosen(order: RunOrder) -> CopyEngineOptions {
        let runs_per_call = match order {
            RunOrder::SrcAscending => 2048,
            RunOrder::DstAscending | RunOrder::AsGiven => 16 * 1024,
        };
        CopyEngineOptions {
            order,
            hint: CopyEngineHint::PreferOverlapWithCompute,
            lanes: 1,
            runs_per_call,
            pitched: true,
        }
    }
}

/// How [`crate::Gpu::transfer_runs`] moved a run list.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TransferPath {
    /// The copy engines (`cuMemcpyBatchAsync` hinted to overlap with compute, and
    /// `cuMemcpy2DAsync` for pitched groups): no SM used.
    CopyEngines {
        /// Runs after merging neighbours.
        runs: u64,
    },
    /// The run-list copy kernel on at most `max_sms` multiprocessors.
    SmKernel {
        /// The SM budget.
        max_sms: u32,
        /// Runs after merging neighbours.
        runs: u64,
    },
    /// A load split between the run-list kernel on at most `max_sms` multiprocessors (the
    /// model's carve-out, on a side stream) and the copy engines, both at once
    /// ([`mod@crate::split_load`]).
    SplitLoad {
        /// The SM budget of the kernel's part.
        max_sms: u32,
        /// Runs after merging neighbours (both parts).
        runs: u64,
    },
    /// A backup gathered on the device into staging slots by the run-list kernel on at most
    /// `max_sms` multiprocessors, then copied to the host by the copy engines one
    /// host-contiguous stretch at a time ([`crate::gather_plan`]).
    GatheredBackup {
        /// The SM budget of the gather.
        max_sms: u32,
        /// Non-empty runs gathered (as listed when the list order paid, else after sorting by
        /// host offset and merging neighbours); [`TransferPath::choose`] gives the count of the
        /// runs it was given.
        runs: u64,
    },
}

/// Fewest runs (after merging) a load needs before it goes to the run-list kernel on the
/// model's SM carve-out ([`crate::Gpu::set_model_carveout_sms`]). Below it the copy engines
/// stay: a load of 1 or 8 pages of one layer (2 or 16 runs) moved 0.93-1.0 of memcpy on them
/// next to the GEMM, while a kernel launch with its list copy costs about as much as the copy.
pub(crate) const CARVEOUT_MIN_RUNS: u64 = 64;

/// Which way a transfer goes, for the chooser.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TransferDirection {
    /// Host pool to device pool.
    Load,
    /// Device pool to host pool.
    Backup,
    /// Anything else (device to device, host to host).
    Other,
}

impl TransferPath {
    /// True when the mean length of `runs` is at least `COPY_ENGINE_MIN_MEAN_RUN_BYTES` = 4,096 B
    /// (an empty list counts as short). The chooser's page runs are those of
    /// [`RunScan::is_page_runs`]: long, and not a list the token kernel takes.
    pub fn mean_is_long(runs: &[ByteRun]) -> bool {
        let total: u128 = runs.iter().map(|r| u128::from(r.len_bytes)).sum();
        total >= u128::from(COPY_ENGINE_MIN_MEAN_RUN_BYTES) * u128::from((runs.len() as u64).max(1))
    }

    /// The path for merged runs `runs` with no carve-out ([`TransferPath::choose`]).
    pub fn for_runs(runs: &[ByteRun]) -> TransferPath {
        TransferPath::choose(runs, TransferDirection::Other, None)
    }

    /// The path for merged runs `runs` going `direction`, when the model leaves `carveout`
    /// SMs free (`Some(0)` counts as `None`):
    /// - mean run length at least `COPY_ENGINE_MIN_MEAN_RUN_BYTES` = 4,096 B (page runs, unless the
    ///   token kernel takes the list: [`RunScan::is_page_runs`]): the copy
    ///   engines; with a carve-out and at least `CARVEOUT_MIN_RUNS` = 64 runs, a load is split
    ///   between the run-list kernel on the carve-out and the copy engines, and a backup is
    ///   gathered on the carve-out (copy engines pay per run: 0.32-0.79 of memcpy for a
    ///   1,024-page DSA load next to a GEMM, 0.55-0.79 for the backup; with 2 free SMs
    ///   0.907-0.911 and 0.889-0.897, BENCHMARKS.md "Session 5");
    /// - shorter runs (token-granular): a load on the run-list kernel on the carve-out, or on
    ///   `SM_BUDGET` = 8 SMs without one; a backup of runs of one length the token kernel takes
    ///   (128 to 4,096 B, multiples of 16 at 16-byte offsets: Llama-3.1-8B's 2,048 B K or V
    ///   or its 4,096 B K and V together, an MLA latent's 1,152 B;
    ///   [`RunScan::takes_token_kernel`]) on its
    ///   `TOKEN_BACKUP_BLOCKS` = 8 blocks (one per SM), carve-out or not, paced on a carve-out to a
    ///   share of the host link
    ///   (`Gpu::set_backup_link_share_permille`): at page size 1 on the H200 it moved
    ///   0.70-0.78 of memcpy next to the GEMM with the GEMM 0.8-1.5 points over memcpy's cost,
    ///   where the gathered backup of session 11 moved 0.47-0.70 at up to 2.7 points, and
    ///   0.81-0.86 alone (BENCHMARKS.md, "GPU at page size 1"). Any other token backup (runs
    ///   of several lengths, such as DeepSeek-V3.2's 656 B MLA and 132 B index-K tokens in one
    ///   list) cannot be paced: with a carve-out, at least `CARVEOUT_MIN_RUNS` = 64 of them are
    ///   gathered on it as page runs are when that pays (`Gpu::enqueue_transfer_runs` then
    ///   moves them unpaced on the carve-out's run-list kernel when it does not); else the
    ///   run-list kernel as a load.
    pub fn choose(
        runs: &[ByteRun],
        direction: TransferDirection,
        carveout: Option<u32>,
    ) -> TransferPath {
        // Every run fits regions of u64::MAX bytes: only the list's facts are read.
        let (scan, _) = crate::copy_runs::scan_facts(runs, u64::MAX, u64::MAX);
        TransferPath::choose_scanned(&scan, direction, carveout)
    }

    /// [`TransferPath::choose`] from a list's [`RunScan`] (its run count, bytes and uniform
    /// length).
    pub fn choose_scanned(
        scan: &RunScan,
        direction: TransferDirection,
        carveout: Option<u32>,
    ) -> TransferPath {
        let count = scan.runs;
        let long = scan.is_page_runs();
        let many = count >= CARVEOUT_MIN_RUNS;
        let paced_token_backup =
            !long && direction == TransferDirection::Backup && scan.takes_token_kernel();
        match carveout.filter(|&k| k > 0) {
            _ if paced_token_backup => TransferPath::SmKernel {
                max_sms: TOKEN_BACKUP_BLOCKS,
                runs: count,
            },
            Some(k) if many && direction == TransferDirection::Backup => {
                TransferPath::GatheredBackup {
                    max_sms: k,
                    runs: count,
                }
            }
            Some(k) if long && many && direction == TransferDirection::Load => {
                TransferPath::SplitLoad {
                    max_sms: k,
                    runs: count,
                }
            }
            Some(k) if !long => TransferPath::SmKernel {
                max_sms: k,
                runs: count,
            },
            _ if long => TransferPath::CopyEngines { runs: count },
            _ => TransferPath::SmKernel {
                max_sms: SM_BUDGET,
                runs: count,
            },
        }
    }
}

/// Hint given to the copy engines with a batched copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CopyEngineHint {
    /// The driver's default (`CU_MEMCPY_FLAG_DEFAULT`).
    Default,
    /// `CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE`: keep the copy off the SMs.
    PreferOverlapWithCompute,
}

#[cfg(test)]
mod tests {
    use super::{RunOrder, changed_by_merging};
    use crate::copy_runs::ByteRun;

    #[test]
    fn key_buckets_order_by_key_at_bucket_width_and_keep_list_order_inside() {
        use super::in_key_buckets;
        let src = |r: &ByteRun| r.src_offset_bytes;
        let dst = |r: &ByteRun| r.dst_offset_bytes;
        // Eight Llama-3.1-8B token runs (2,048 B) from host slots 5, 0, 7, 2, 6, 1, 4, 3 to
        // device slots 0..8. Span 7 x 2,048 = 14,336 B; 8 runs / 4 per bucket = 2 buckets at
        // most: the width is the smallest power of two with 14,336 >> s < 2, s = 13 (8 KiB):
        // slots 0-3 in bucket 0, slots 4-7 in bucket 1, each in list order: 0, 2, 1, 3, then
        // 5, 7, 6, 4.
        let slots = [5u64, 0, 7, 2, 6, 1, 4, 3];
        let runs: Vec<ByteRun> = (0..8u64)
            .map(|i| ByteRun::new(slots[i as usize] * 2048, i * 2048, 2048))
            .collect();
        let got: Vec<u64> = in_key_buckets(&runs, src)
            .iter()
            .map(|r| r.src_offset_bytes / 2048)
            .collect();
        assert_eq!(got, vec![0, 2, 1, 3, 5, 7, 6, 4]);
        // By destination (already ascending): unchanged.
        assert_eq!(in_key_buckets(&runs, dst), runs);
        // Fewer than 8 runs: one bucket, the list as given; one run; nothing.
        assert_eq!(in_key_buckets(&runs[..7], src), runs[..7].to_vec());
        assert_eq!(in_key_buckets(&runs[..1], src), vec![runs[0]]);
        assert!(in_key_buckets(&[], src).is_empty());
        // Keys u64::MAX apart, 8 runs: the width 2^63 (u64::MAX >> 63 = 1 < 2): 0 before MAX.
        let mut wide = vec![ByteRun::new(u64::MAX, 0, 0); 4];
        wide.extend(vec![ByteRun::new(0, 1, 0); 4]);
        let got = in_key_buckets(&wide, src);
        assert!(got[..4].iter().all(|r| r.src_offset_bytes == 0), "{got:?}");
        assert!(
            got[4..].iter().all(|r| r.src_offset_bytes == u64::MAX),
            "{got:?}"
        );
    }

    #[test]
    fn a_list_is_changed_by_merging_exactly_when_as_given_merging_changes_it() {
        // Two Llama-3.1-8B token runs (2,048 B) between unrelated slots: nothing merges.
        let apart = [ByteRun::new(0, 8192, 2048), ByteRun::new(4096, 0, 2048)];
        // Continuing on the source only (2,048 = 0 + 2,048) but not on the destination.
        let src_only = [ByteRun::new(0, 8192, 2048), ByteRun::new(2048, 0, 2048)];
        // Continuing on both sides: one run of 4,096 B.
        let both = [ByteRun::new(0, 0, 2048), ByteRun::new(2048, 2048, 2048)];
        // An empty run is dropped.
        let empty = [ByteRun::new(0, 8192, 2048), ByteRun::new(64, 64, 0)];
        // Continuing on both sides, but 10 + (u64::MAX - 9) passes u64::MAX: left as two.
        let wraps = [ByteRun::new(0, 0, 10), ByteRun::new(10, 10, u64::MAX - 9)];
        // Unchecked lists with a run ending past u64::MAX (u64::MAX + 16): an empty run before
        // it is still dropped, two neighbours before it (0 + 16 = 16 on both sides) still merge.
        let empty_then_past = [ByteRun::new(0, 0, 0), ByteRun::new(u64::MAX, 0, 16)];
        let merging_then_past = [
            ByteRun::new(0, 0, 16),
            ByteRun::new(16, 16, 16),
            ByteRun::new(u64::MAX, 0, 16),
        ];
        for (runs, changed) in [
            (&apart[..], false),
            (&src_only[..], false),
            (&both[..], true),
            (&empty[..], true),
            (&wraps[..], false),
            (&empty_then_past[..], true),
            (&merging_then_past[..], true),
            (&[][..], false),
        ] {
            assert_eq!(changed_by_merging(runs), changed, "{runs:?}");
            let merged = RunOrder::AsGiven.sorted_and_merged(runs);
            assert_eq!(merged != runs, changed, "{runs:?}");
        }
    }
}
