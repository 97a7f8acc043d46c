//! The rows of `gpu_bench --overlap`: the transfer paths, and which of them each shape is
//! measured with in each mode.

use crate::verify::Verifier;
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
    /// kvlayout's run-list kernel on this many blocks of 256 threads in all (one per SM), its
    /// list in host order (else as listed): how many resident stores a token backup wants.
    RunKernelBlocks(u32, bool),
    /// The token kernel paced as the chooser paces token backups on a carve-out
    /// (`BACKUP_LINK_SHARE_PERMILLE` of the measured host link), on at most this many SMs at this
    /// many blocks of 8 warps each, the list as listed (`--paced-blocks`): where the paced
    /// blocks sit against the model's SMs.
    PacedBlocks(u32, u32),
    /// The token kernel on at most this many SMs over contiguous runs of the same count and
    /// length (page size 1: the SM path's ceiling without the scatter).
    SmContiguous(Option<u32>),
    /// kvlayout's staged path (`Gpu::enqueue_staged_runs`): host threads gather or scatter,
    /// one contiguous copy per chunk, the run-list kernel on a few SMs on the device side.
    Staged,
    /// kvlayout's chooser (`Gpu::enqueue_transfer_runs`), what the CUDA pool backend calls.
    Auto,
    /// The chooser with token backups on a carve-out paced to this share of the host link
    /// (per mille, `Gpu::set_backup_link_share_permille`; 1000: not paced).
    AutoShare(u32),
    /// The chooser's load, each layer verified on the device after its copy (`--verify`).
    Verified(Verifier),
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
}

/// `--backup-variants` and `--token-ceiling` (page-size-1 backups): the run-list kernel on
/// few blocks in all, as the peer's 2 blocks of 32 warps keep few stores to the host in flight.
pub const BACKUP_BLOCKS: [Path; 6] = [
    Path::RunKernelBlocks(1, true),
    Path::RunKernelBlocks(2, true),
    Path::RunKernelBlocks(4, true),
    Path::RunKernelBlocks(8, true),
    Path::RunKernelBlocks(2, false),
    Path::RunKernelBlocks(4, false),
];

/// `--paced-blocks`: (SMs, blocks per SM) of the paced token kernel, 0 SMs standing for the
/// carve-out's: the chooser's 8 x 1, then 8 blocks and 4 blocks on the carve-out's SMs, 8 on 4.
pub const PACED_BLOCKS: [(u32, u32); 4] = [(8, 1), (0, 4), (0, 2), (4, 2)];

/// `--backup-shares`: shares of the host link (per mille) the chooser's token backups on a
/// carve-out are paced to besides its default (1000: not paced).
pub const BACKUP_SHARES: [u32; 4] = [700, 750, 850, 1000];

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
            Path::RunKernelBlocks(blocks, sorted) => format!(
                "kvlayout run-list kernel, {blocks} blocks of 8 warps, list {}",
                if sorted { "in host order" } else { "as listed" }
            ),
            Path::PacedBlocks(sms, per_sm) => format!(
                "token kernel paced to the chooser's share, {sms} SMs x {per_sm} blocks of 8 warps"
            ),
            Path::SmContiguous(s) => {
                format!("token kernel on contiguous runs (SM ceiling), {}", sms(s))
            }
            Path::Staged => {
                "kvlayout staged: host threads, 1 copy per 16 MiB chunk, 8 slots".into()
            }
            Path::Auto => "kvlayout chooser (CUDA pool backend)".into(),
            Path::AutoShare(p) => {
                format!("kvlayout chooser, backups paced to {p}/1000 of the link")
            }
            Path::Verified(v) => format!("kvlayout chooser + verify: {}", v.label()),
        }
    }
}

/// The paths `shape` is measured with in `mode` (the ceiling first).
pub fn for_shape(shape: &Shape, mode: Mode) -> Vec<Path> {
    let (sweep, small) = (mode == Mode::Sweep, mode == Mode::Small);
    let big = shape.calls.len() > 1 || shape.bytes() > 100_000_000;
    let huge = shape.bytes() > 5_000_000_000;
    let mut paths = vec![Path::Memcpy];
    if std::env::args().any(|a| a == "--verify") {
        let launch = kvlayout_kernels::checksum_gpu::ChecksumLaunch::sms(2);
        paths.extend([Path::Auto, Path::Verified(Verifier::Kvlayout(launch))]);
        paths.push(Path::Verified(Verifier::Adler32(None)));
        return paths;
    }
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
    if small {
        paths.extend([BATCH_DEFAULT, Path::Staged, Path::Auto]);
    } else if sweep {
        paths.extend([BATCH_DEFAULT, Path::Batch(true, true, 1, 16384, false)]);
        paths.extend(variants);
        paths.extend([Path::Batch(true, true, 8, 2048, false), Path::Auto]);
    } else if shape.token_granular
        && shape.name.starts_with("page size 1")
        && std::env::args().any(|a| a == "--token-ceiling")
    {
        // `--token-ceiling`: the token kernel over contiguous runs (the SM path's ceiling) and
        // over the scattered ones on 4 and all SMs, the peer at its default launch, the chooser.
        paths.extend([Path::SmContiguous(Some(4)), Path::SmContiguous(None)]);
        paths.extend([
            Path::RunKernel(Some(4)),
            Path::RunKernel(None),
            Path::Peer(2),
        ]);
        if !shape.h2d {
            paths.extend(BACKUP_BLOCKS);
        }
        paths.push(Path::Auto);
    } else if shape.token_granular && shape.name.starts_with("page size 1") {
        // Page size 1: the peer at its default launch and at block_quota 8, the token kernel
        // on a few SM budgets, the chooser.
        paths.extend([Path::Peer(2), Path::Peer(8)]);
        paths.extend([Some(2), Some(4), Some(8), Some(16), None].map(Path::RunKernel));
        paths.push(Path::Auto);
    } else if shape.token_granular {
        paths.extend([Path::Peer(2), Path::Batch(true, true, 1, 2048, false)]);
        paths.extend([Some(4), Some(8), None].map(Path::RunKernel));
        paths.push(Path::Auto);
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
        paths.extend([Path::Staged, Path::Auto]);
    } else {
        paths.extend([Path::Peer(2), BATCH_DEFAULT, Path::RunKernel(None)]);
        paths.extend([Path::Staged, Path::Auto]);
        paths.push(Path::MemcpyPerRun);
    }
    paths
}
