//! `gpu_bench`: the transfer paths of `kvlayout-kernels` alone and next to a bf16 GEMM loop
//! on one GPU, all figures from one run (`overlap.rs` says how they are measured).
//!
//! Modes (one is required):
//! - `--overlap`: every path on DeepSeek-V3.2 DSA pools (MLA fp8 656 B + index-K fp8 132 B per
//!   token, 61 layers, 64-token pages): 1,024 and 4,096 pages x 61 layers (loads layer by
//!   layer, backups of all layers), 8 pages and 1 page of 1 layer, a token-granular load;
//!   with `--page-size-1` instead Llama-3.1-8B (32 layers, K and V of 8 x 128 bf16) and
//!   DeepSeek-V3 MLA (61 layers, 576 bf16) pools of page size 1, 16,384 tokens into random
//!   slots (loads layer by layer, backups of all layers), against the SGLang-style peer at
//!   `block_quota` 2 (its default) and 8.
//! - `--overlap-small`: the 1- and 8-page rows only (memcpy, the driver's batch, the staged
//!   path, the chooser).
//! - `--dma-sweep`: the copy-engine variants (order, hint, streams, runs per call) on the large
//!   page transfers, from which `CopyEngineOptions::chosen` was set.
//!
//! Options: `--sm-carveout K` (the GEMM leaves K SMs, `cublasSetSmCountTarget`, and the chooser
//! is told, `Gpu::set_model_carveout_sms`); `--auto-only` (the ceiling and the chooser rows
//! only); `--loads-only`, `--backups-only`; `--pair-major` (page transfers' runs laid page pair
//! by page pair, as the pool shim lays them; else buffer by buffer, layer by layer);
//! `--hold SECONDS` (instead of windows, long phases of the GEMM loop alone, beside memcpy,
//! beside the chooser and, at page size 1, beside the peer, each stream fed without a pause,
//! with wall-clock intervals to read an `nvidia-smi` log by); `--token-variants` (with `--hold`
//! and `--page-size-1`: phases of the token kernel on 2 and 4 SMs and over contiguous runs, the
//! SM path's ceiling, too); `--backup-variants` (with `--hold` and `--page-size-1`: backup
//! phases of the token kernel on 1, 2, 4 and 8 blocks in all, its list in host order or as
//! listed); `--backup-shares` (the same: the chooser's backups paced to 700, 750, 850 and 1000
//! per mille of the host link besides its default; with a carve-out only, as backups are paced
//! only then; `--backup-variants` wins when both are given); `--paced-blocks` (the same
//! with a carve-out: the token kernel paced as the chooser paces backups, on 8 SMs x 1 block
//! (the chooser's launch), the carve-out's SMs x 4 and x 2 blocks, 4 SMs x 2; after
//! `--backup-shares` in precedence); `--kv-row` (with `--page-size-1`: Llama's K and V in one
//! 4,096 B row per token and layer instead of two 2,048 B buffers); `--token-ceiling` (windows
//! at page size 1:
//! memcpy, the token kernel over contiguous runs and over the scattered ones on 4 and all SMs,
//! the peer, the token kernel's backups on few blocks, the chooser);
//! `--verify` (the 1,024-page load only, also verified layer by layer on the device by the page
//! checksum and by SGLang's Adler-32 as the peer, `verify.rs`; each verifier alone first);
//! `--verify-sms V` (with `--sm-carveout K`: the GEMM leaves K + V SMs, the chooser is told K).
//!
//! The exploration modes of sessions 3 to 7 (`--explore` and its candidates, the item-copy and
//! quantizer rows of the first benchmark) were removed with the code they measured or once
//! their question was settled; their raw logs stay in `kernels/bench-results/`.

mod overlap;
mod paths;
mod report;
mod verify;
mod workload;

use kvlayout_kernels::KernelError;

fn main() -> Result<(), KernelError> {
    for (flag, mode) in [
        ("--overlap", paths::Mode::Full),
        ("--overlap-small", paths::Mode::Small),
        ("--dma-sweep", paths::Mode::Sweep),
    ] {
        if std::env::args().any(|a| a == flag) {
            return overlap::run(mode);
        }
    }
    eprintln!(
        "usage: gpu_bench --overlap | --overlap-small | --dma-sweep [--page-size-1] \
         [--sm-carveout K] [--auto-only] [--loads-only | --backups-only] [--pair-major] \
         [--hold SECONDS] [--token-variants] [--backup-variants] [--backup-shares] \
         [--paced-blocks] [--kv-row] [--token-ceiling] [--verify [--verify-sms V]]"
    );
    std::process::exit(2);
}
