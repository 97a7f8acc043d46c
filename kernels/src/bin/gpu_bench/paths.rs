//! The rows of `gpu_bench --overlap`: the transfer paths, and which of them each shape is
//! measured with in each mode.

use kvlayout_kernels::RunOrder;

use crate::explore;
use crate::workload::Shape;

#[derive(Clone, Copy, Debug)]
pub enum Path {
    /// One contiguous `cuMemcpyAsync` of the call's bytes (the ceiling).
    Memcpy,
    /// One `cuMemcpyAsync` per run.
    MemcpyPerRun,
    /// The SGLang-style warp copy on this many blocks of 32 warps (`block_quota`; 2 is its
    /// default launch, 8 the ROCm PR's tuning).
    Peer(u32),
    /// `cuMemcpyBatchAsync` of the runs: in host-address order (else as given), hinted to
    /// overlap with compute (else default flags), split over this many streams, at most this
    /// many runs per call, runs with constant pitches as 2D copies (else all batched).
    Batch(bool, bool, usize, usize, bool),
    /// kvlayout's run-list kernel on at most this many SMs (`None`: all).
    RunKernel(Option<u32>),
    /// kvlayout's index-list kernel (page or token items per the shape).
    Items(Option<u32>),
    /// kvlayout's staged path (`Gpu::enqueue_staged_runs`): host threads gather or scatter,
    /// one contiguous copy per chunk, the run-list kernel on a few SMs on the device side.
    Staged,
    /// kvlayout's chooser (`Gpu::enqueue_transfer_runs`), what the CUDA pool backend calls.
    Auto,
    /// A candidate of `--explore`.
    Explore(explore::Candidate),
}

/// What a run measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Every path on every shape.
    Full,
    /// The 1- and 8-page rows only.
    Small,
    /// Copy-engine variants on the large transfers.
    Sweep,
    /// The `--explore` candidates.
    Explore,
}

/// The driver's batched copy as a caller would first write it.
pub const BATCH_DEFAULT: Path = Path::Batch(false, false, 1, 16384, false);

impl Path {
    pub fn label(self) -> String {
        let sms = |s: Option<u32>| s.map_or("all SMs".to_string(), |n| format!("{n} SMs"));
        match self {
            Path::Memcpy => "pinned contiguous memcpy (ceiling)".into(),
            Path::MemcpyPerRun => "one cuMemcpyAsync per run".into(),
            Path::Peer(blocks) => format!("SGLang-style warp copy, {blocks} x 32 warps"),
            Path::Batch(false, false, 1, 16384, false) => {
                "cuMemcpyBatchAsync, runs as given, default flags".into()
            }
            Path::Batch(sorted, hint, lanes, per_call, pitched) => format!(
                "cuMemcpyBatchAsync, {}, {}, {lanes} stream{}, {per_call} runs/call{}",
                if sorted {
                    "host order, merged"
                } else {
                    "as given"
                },
                if hint {
                    "overlap hint"
                } else {
                    "default flags"
                },
                if lanes == 1 { "" } else { "s" },
                if pitched { ", pitched runs as 2D" } else { "" }
            ),
            Path::RunKernel(s) => format!("kvlayout run-list kernel, {}", sms(s)),
            Path::Items(s) => format!("kvlayout index-list kernel, {}", sms(s)),
            Path::Staged => format!(
                "kvlayout staged: host threads, 1 copy per {} MiB chunk, {} slots",
                kvlayout_kernels::STAGING_CHUNK_BYTES >> 20,
                kvlayout_kernels::STAGING_SLOTS
            ),
            Path::Auto => "kvlayout chooser (CUDA pool backend)".into(),
            Path::Explore(c) => c.label(),
        }
    }
}

/// The paths `shape` is measured with in `mode` (the ceiling first).
pub fn for_shape(shape: &Shape, mode: Mode) -> Vec<Path> {
    let (sweep, small, exploring) = (
        mode == Mode::Sweep,
        mode == Mode::Small,
        mode == Mode::Explore,
    );
    let big = shape.calls.len() > 1 || shape.bytes() > 100_000_000;
    let huge = shape.bytes() > 5_000_000_000;
    let mut paths = vec![Path::Memcpy];
    if std::env::args().any(|a| a == "--auto-only") {
        // The ceiling and the chooser only.
        paths.push(Path::Auto);
        return paths;
    }
    let variants = [
        Path::Batch(false, true, 1, 2048, false),
        Path::Batch(true, true, 1, 2048, false),
        Path::Batch(true, true, 8, 16384, false),
    ];
    if exploring {
        use explore::Candidate as C;
        if let Some(k) = explore::sm_carveout() {
            paths.extend([Path::Auto, Path::RunKernel(Some(k))]);
            let gather = std::env::args().any(|a| a == "--gather");
            if shape.h2d && std::env::args().any(|a| a == "--split-share") {
                // Loads: the SMs' share of the bytes (0: short runs only, the index-K).
                paths.push(Path::Explore(C::SplitKernel(k)));
                for sm_permille in [0, 300, 450, 600] {
                    paths.push(Path::Explore(C::SplitShare {
                        blocks: k,
                        sm_permille,
                    }));
                }
            } else if shape.h2d {
                paths.extend([C::SplitKernel(1), C::SplitKernel(k)].map(Path::Explore));
            } else if gather {
                // Where a device-side gather's time goes: the parts alone, the copies out
                // on 1, 2 or 4 streams or batched, and plain copies of contiguous pieces.
                // (Session 4's list, with one copy per stretch and the pieces, is in its
                // logs; these are the batched copies out the chooser uses.)
                for (blocks, part, outs) in [(k, 0, 0), (8, 0, 0), (k, 1, 0), (8, 2, 0)] {
                    paths.push(Path::Explore(C::GatherThenCopy(blocks, part, outs)));
                }
                if std::env::args().any(|a| a == "--pieces") {
                    for (piece, shuffled) in [
                        (2 << 20, false),
                        (2 << 20, true),
                        (512 << 10, false),
                        (64 << 10, false),
                        (32 << 20, true),
                    ] {
                        paths.push(Path::Explore(C::Pieces(piece, shuffled)));
                    }
                }
            }
            if !gather && !std::env::args().any(|a| a == "--split-share") {
                paths.push(Path::Explore(C::PrioKernel(k)));
                for (blocks, runs_per_launch, cluster) in [
                    (k, 2048, false),
                    (k, 512, false),
                    (k, 2048, true),
                    (1, 2048, false),
                ] {
                    paths.push(Path::Explore(C::Chunked {
                        blocks,
                        runs_per_launch,
                        cluster,
                    }));
                }
            }
        } else if shape.name.contains("only") {
            paths.push(Path::Batch(true, true, 1, 2048, false));
        } else if shape.h2d && std::env::args().any(|a| a == "--orders") {
            paths.push(Path::Auto);
            paths.extend(
                [
                    RunOrder::AsGiven,
                    RunOrder::SrcAscending,
                    RunOrder::DstAscending,
                ]
                .map(|o| Path::Explore(C::Order(o))),
            );
            paths.push(Path::Auto);
        } else if shape.h2d {
            paths.push(Path::Auto);
        } else {
            paths.extend([Path::Auto, Path::Batch(true, true, 8, 16384, false)]);
            paths.push(Path::Explore(C::DeviceStaged));
        }
        if std::env::args().any(|a| a == "--candidates") && !shape.name.contains("only") {
            paths.extend(
                [
                    C::SplitTwoStreams,
                    C::ThreadsSplit,
                    C::Threads(2),
                    C::Threads(4),
                    C::SplitKernel(8),
                    C::PrioKernel(8),
                ]
                .map(Path::Explore),
            );
        }
    } else if small {
        paths.extend([BATCH_DEFAULT, Path::Staged, Path::Auto]);
    } else if sweep {
        paths.extend([BATCH_DEFAULT, Path::Batch(true, true, 1, 16384, false)]);
        paths.extend(variants);
        paths.extend([Path::Batch(true, true, 8, 2048, false), Path::Auto]);
    } else if shape.token_granular && shape.name.starts_with("page size 1") {
        // Page size 1: the peer at its default launch and at block_quota 8, the token kernel
        // on a few SM budgets, the chooser.
        paths.extend([Path::Peer(2), Path::Peer(8)]);
        paths.extend([Some(2), Some(4), Some(8), Some(16), None].map(Path::RunKernel));
        paths.push(Path::Auto);
    } else if shape.token_granular {
        paths.extend([Path::Peer(2), Path::Batch(true, true, 1, 2048, false)]);
        paths.extend([Some(4), Some(8), None].map(Path::RunKernel));
        paths.extend([Path::Items(None), Path::Auto]);
    } else if huge {
        // The all-SM kernel and the staged path at this size: earlier logs
        // (h200-overlap.txt, h200-overlap-staged.txt).
        paths.push(BATCH_DEFAULT);
        paths.extend(&variants[..2]);
        paths.push(Path::Auto);
    } else if big {
        paths.extend([Path::Peer(2), BATCH_DEFAULT]);
        paths.extend(variants);
        paths.extend([Path::RunKernel(Some(4)), Path::RunKernel(None)]);
        paths.extend([Path::Items(None), Path::Staged, Path::Auto]);
    } else {
        paths.extend([Path::Peer(2), BATCH_DEFAULT, Path::RunKernel(None)]);
        paths.extend([Path::Items(None), Path::Staged, Path::Auto]);
        paths.push(Path::MemcpyPerRun);
    }
    paths
}
