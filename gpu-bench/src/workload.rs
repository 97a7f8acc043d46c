//! The `--overlap` workload: DeepSeek-V3.2 DSA pools (MLA fp8 656 B/token + index-K fp8
//! 132 B/token, 61 layers, 64-token pages), host `page_first`, device `layer_first`, and the
//! transfers HiCache makes with them, as run lists; and at page size 1 (`--page-size-1`),
//! Llama-3.1-8B's and DeepSeek-V3's MLA pools.

use kvlayout_core::{BufferGeometry, MemoryLayout, PoolGeometry, formats};
use kvlayout_kernels::test_data::SplitMix64;
use kvlayout_kernels::{ByteRun, DeviceRuns, Gpu, KernelError, RunOrder};

pub const LAYERS: u64 = 61;
pub const PAGE_TOKENS: u64 = 64;
pub const POOL_PAGES: u64 = 4096;
/// MLA fp8 bytes per token (DeepSeek-V3.2: 512 fp8 + 4 x f32 scales + 64 bf16 rope).
pub const MLA_TOKEN_BYTES: u64 = 656;
/// Index-K fp8 bytes per token: 128 fp8 values, then (per page) one f32 scale per token.
pub const INDEX_K_VALUE_BYTES: u64 = 128;
pub const INDEX_K_SCALE_BYTES: u64 = 4;

/// The pool of 4096 pages, both buffers, in `memory_layout`.
pub fn dsa_pool(memory_layout: MemoryLayout) -> PoolGeometry {
    PoolGeometry {
        name: format!("DeepSeek-V3.2 DSA {memory_layout}"),
        page_size_tokens: PAGE_TOKENS,
        pages: POOL_PAGES,
        memory_layout,
        buffers: vec![
            BufferGeometry::new("kv", LAYERS, formats::DSA_MLA_FP8),
            BufferGeometry::new("index_k", LAYERS, formats::INDEX_K_FP8),
        ],
    }
}

/// One call of a transfer (one layer of a layer-by-layer load, or a whole backup).
pub struct Call {
    /// The runs the pool shim plans (one per page per layer per buffer; per token for a
    /// token-granular transfer).
    pub runs: Vec<ByteRun>,
    /// The same runs, in host-address order, on the device (for the run-list kernel).
    pub dev_runs: DeviceRuns,
    /// The SGLang-style peer's items: a 656-byte MLA token each, an index-K page (or token
    /// part) each, on the device.
    pub peer_items: DeviceRuns,
    pub peer_item_count: u64,
    pub bytes: u64,
    /// At page size 1: as many runs of the same length, laid one after the other from offset 0
    /// on both sides (the token kernel's ceiling: the same launches, no scatter).
    pub contiguous_runs: Option<DeviceRuns>,
}

/// A transfer: its calls, direction, and how many back-to-back repetitions make one timed
/// window (small transfers are timed as bursts).
pub struct Shape {
    pub name: String,
    pub h2d: bool,
    pub calls: Vec<Call>,
    pub burst: usize,
    /// True for the token-granular transfer (random device token slots).
    pub token_granular: bool,
}

impl Shape {
    pub fn bytes(&self) -> u64 {
        self.calls.iter().map(|c| c.bytes).sum()
    }
}

/// A page-granular transfer of `pages` random pages (`consecutive`: a random range of pages on
/// each side, what a fresh allocator hands out): `layer_by_layer` gives one call per layer (a
/// HiCache load during the forward pass), else one call for all layers (a backup); `layers`
/// limits the layers moved.
#[allow(clippy::too_many_arguments)]
pub fn page_shape(
    gpu: &Gpu,
    rng: &mut SplitMix64,
    host: &PoolGeometry,
    device: &PoolGeometry,
    pages: u64,
    layers: u64,
    h2d: bool,
    layer_by_layer: bool,
    burst: usize,
    consecutive: bool,
) -> Result<Shape, KernelError> {
    let mut pick = || {
        if consecutive {
            let start = rng.next_u64() % (POOL_PAGES - pages + 1);
            (start..start + pages).collect()
        } else {
            rng.distinct_below(POOL_PAGES, pages as usize)
        }
    };
    let host_pages: Vec<u64> = pick();
    let dev_pages: Vec<u64> = pick();
    let (sp, dp, s_pages, d_pages) = if h2d {
        (host, device, &host_pages, &dev_pages)
    } else {
        (device, host, &dev_pages, &host_pages)
    };
    let groups: Vec<std::ops::Range<u64>> = if layer_by_layer {
        (0..layers).map(|l| l..l + 1).collect()
    } else {
        std::iter::once(0..layers).collect()
    };
    let mut calls = Vec::new();
    for layer_range in groups {
        let mut runs = Vec::new();
        let mut peer = Vec::new();
        for b in [0usize, 1] {
            let len = sp.stored_page_bytes(b)?;
            for layer in layer_range.clone() {
                for (&s, &d) in s_pages.iter().zip(d_pages) {
                    let r = ByteRun::new(
                        sp.page_offset_bytes(b, layer, s)?,
                        dp.page_offset_bytes(b, layer, d)?,
                        len,
                    );
                    runs.push(r);
                    if b == 0 {
                        // SGLang's MLA item is one token (656 B, token_major pages).
                        for t in 0..PAGE_TOKENS {
                            peer.push(ByteRun::new(
                                r.src_offset_bytes + t * MLA_TOKEN_BYTES,
                                r.dst_offset_bytes + t * MLA_TOKEN_BYTES,
                                MLA_TOKEN_BYTES,
                            ));
                        }
                    } else {
                        peer.push(r);
                    }
                }
            }
        }
        if std::env::args().any(|a| a == "--pair-major") {
            // As the pool shim lays a transfer: page pair by page pair, each pair's buffers
            // and layers in order (the runs above are buffer, layer, then pair).
            let pairs = s_pages.len();
            let per_buffer = pairs * layer_range.clone().count();
            let at = |i: usize| {
                let (b, rest) = (i / per_buffer, i % per_buffer);
                let (layer, pair) = (rest / pairs, rest % pairs);
                (pair, b, layer)
            };
            let mut order: Vec<usize> = (0..runs.len()).collect();
            order.sort_by_key(|&i| at(i));
            runs = order.into_iter().map(|i| runs[i]).collect();
        }
        calls.push(call(gpu, runs, peer, h2d)?);
    }
    Ok(Shape {
        name: format!(
            "{} {pages}{} pages x {layers} layers{}",
            if h2d { "load H2D" } else { "backup D2H" },
            if consecutive { " consecutive" } else { "" },
            if layer_by_layer {
                ", layer by layer"
            } else {
                ""
            }
        ),
        h2d,
        calls,
        burst,
        token_granular: false,
    })
}

/// A token-granular load of `pages` random host pages (every token) into random device token
/// slots, layer by layer: one run per token for MLA (656 B) and two for index-K (128 B values,
/// 4 B scale), from the page formulas (`page_first` host, `layer_first` device, index-K
/// `section_major`: values of 64 tokens, then their scales).
pub fn token_shape(
    gpu: &Gpu,
    rng: &mut SplitMix64,
    host: &PoolGeometry,
    device: &PoolGeometry,
    pages: u64,
) -> Result<Shape, KernelError> {
    let host_pages = rng.distinct_below(POOL_PAGES, pages as usize);
    let slots = rng.distinct_below(POOL_PAGES * PAGE_TOKENS, (pages * PAGE_TOKENS) as usize);
    let src_tokens: Vec<u64> = host_pages
        .iter()
        .flat_map(|p| (0..PAGE_TOKENS).map(move |t| p * PAGE_TOKENS + t))
        .collect();
    let mut calls = Vec::new();
    for layer in 0..LAYERS {
        let mut runs = Vec::new();
        for (&st, &slot) in src_tokens.iter().zip(&slots) {
            let (hp, ht) = (st / PAGE_TOKENS, st % PAGE_TOKENS);
            let (dp, dt) = (slot / PAGE_TOKENS, slot % PAGE_TOKENS);
            let (h0, d0) = (
                host.page_offset_bytes(0, layer, hp)?,
                device.page_offset_bytes(0, layer, dp)?,
            );
            runs.push(ByteRun::new(
                h0 + ht * MLA_TOKEN_BYTES,
                d0 + dt * MLA_TOKEN_BYTES,
                MLA_TOKEN_BYTES,
            ));
            let (h1, d1) = (
                host.page_offset_bytes(1, layer, hp)?,
                device.page_offset_bytes(1, layer, dp)?,
            );
            runs.push(ByteRun::new(
                h1 + ht * INDEX_K_VALUE_BYTES,
                d1 + dt * INDEX_K_VALUE_BYTES,
                INDEX_K_VALUE_BYTES,
            ));
            let scales = PAGE_TOKENS * INDEX_K_VALUE_BYTES;
            runs.push(ByteRun::new(
                h1 + scales + ht * INDEX_K_SCALE_BYTES,
                d1 + scales + dt * INDEX_K_SCALE_BYTES,
                INDEX_K_SCALE_BYTES,
            ));
        }
        let peer = runs.clone();
        calls.push(call(gpu, runs, peer, true)?);
    }
    Ok(Shape {
        name: format!(
            "token-granular load H2D {pages} pages x {LAYERS} layers into random slots, layer by layer"
        ),
        h2d: true,
        calls,
        burst: 1,
        token_granular: true,
    })
}

fn call(gpu: &Gpu, runs: Vec<ByteRun>, peer: Vec<ByteRun>, h2d: bool) -> Result<Call, KernelError> {
    let order = if h2d {
        RunOrder::SrcAscending
    } else {
        RunOrder::DstAscending
    };
    let bytes = runs.iter().map(|r| r.len_bytes).sum();
    Ok(Call {
        dev_runs: gpu.upload_runs(&runs, order)?,
        peer_item_count: peer.len() as u64,
        peer_items: gpu.upload_runs(&peer, RunOrder::AsGiven)?,
        runs,
        bytes,
        contiguous_runs: None,
    })
}

/// `call` with its [`Call::contiguous_runs`]: as many runs as it has, each as long as its
/// first, laid one after the other from offset 0 on both sides.
fn with_contiguous(gpu: &Gpu, mut call: Call) -> Result<Call, KernelError> {
    let len = call.runs.first().map_or(0, |r| r.len_bytes);
    let runs: Vec<ByteRun> = (0..call.runs.len() as u64)
        .map(|i| ByteRun::new(i * len, i * len, len))
        .collect();
    call.contiguous_runs = Some(gpu.upload_runs(&runs, RunOrder::AsGiven)?);
    Ok(call)
}

/// Tokens of each page-size-1 pool (`--page-size-1`): twice the tokens moved.
pub const PAGE1_POOL_TOKENS: u64 = 32 * 1024;
/// Tokens a page-size-1 transfer moves, into random slots on both sides.
pub const PAGE1_TOKENS: u64 = 16 * 1024;

/// A pool of page size 1 (SGLang's default for FlashAttention-3 and FlashInfer): Llama-3.1-8B
/// (`llama`: 32 layers, K and V buffers of 8 heads x 128 bf16 = 2,048 B per token and layer
/// each; with `--kv-row` one buffer of K and V together, 16 x 128 bf16 = 4,096 B, as kvlayout's
/// `mha_bf16_8x128` and a vLLM FlashInfer block of one token lay them) or DeepSeek-V3 MLA (61
/// layers, 512 + 64 bf16 = 1,152 B), in `memory_layout`.
pub fn page1_pool(llama: bool, memory_layout: MemoryLayout) -> PoolGeometry {
    let kv_row = std::env::args().any(|a| a == "--kv-row");
    let buffers = if llama && kv_row {
        let layout =
            kvlayout_core::formats::single("kv", kvlayout_core::Dtype::Bf16, vec![16, 128])
                .expect("16 x 128 bf16 is a valid layout");
        vec![BufferGeometry::new("kv", 32, layout)]
    } else if llama {
        let kv = |name: &'static str| {
            let layout =
                kvlayout_core::formats::single(name, kvlayout_core::Dtype::Bf16, vec![8, 128])
                    .expect("8 x 128 bf16 is a valid layout");
            BufferGeometry::new(name, 32, layout)
        };
        vec![kv("k"), kv("v")]
    } else {
        vec![BufferGeometry::new("kv", 61, formats::MLA_BF16)]
    };
    PoolGeometry {
        name: format!(
            "{} page size 1 {memory_layout}",
            if llama && kv_row {
                "Llama-3.1-8B K+V rows"
            } else if llama {
                "Llama-3.1-8B"
            } else {
                "DeepSeek-V3 MLA"
            }
        ),
        page_size_tokens: 1,
        pages: PAGE1_POOL_TOKENS,
        memory_layout,
        buffers,
    }
}

/// A token-granular transfer at page size 1 of [`PAGE1_TOKENS`] random host slots into random
/// device slots (`h2d`, a load: one call per layer, each token's buffers in turn) or back (a
/// backup: one call for all layers, laid token by token, each buffer's layers in order, as the
/// pool shim lays a page pair's runs). One run (and one SGLang item) per token, layer and
/// buffer.
pub fn page1_shape(
    gpu: &Gpu,
    rng: &mut SplitMix64,
    host: &PoolGeometry,
    device: &PoolGeometry,
    h2d: bool,
) -> Result<Shape, KernelError> {
    let host_slots = rng.distinct_below(host.pages, PAGE1_TOKENS as usize);
    let dev_slots = rng.distinct_below(device.pages, PAGE1_TOKENS as usize);
    let layers = host.buffers[0].layers;
    let buffers = host.buffers.len();
    let run = |b: usize, layer: u64, hs: u64, ds: u64| -> Result<ByteRun, KernelError> {
        let (h, d) = (
            host.page_offset_bytes(b, layer, hs)?,
            device.page_offset_bytes(b, layer, ds)?,
        );
        let len = host.stored_page_bytes(b)?;
        Ok(if h2d {
            ByteRun::new(h, d, len)
        } else {
            ByteRun::new(d, h, len)
        })
    };
    let mut calls = Vec::new();
    if h2d {
        for layer in 0..layers {
            let mut runs = Vec::new();
            for (&hs, &ds) in host_slots.iter().zip(&dev_slots) {
                for b in 0..buffers {
                    runs.push(run(b, layer, hs, ds)?);
                }
            }
            let peer = runs.clone();
            calls.push(with_contiguous(gpu, call(gpu, runs, peer, true)?)?);
        }
    } else {
        let mut runs = Vec::new();
        for (&hs, &ds) in host_slots.iter().zip(&dev_slots) {
            for b in 0..buffers {
                for layer in 0..layers {
                    runs.push(run(b, layer, hs, ds)?);
                }
            }
        }
        let peer = runs.clone();
        calls.push(with_contiguous(gpu, call(gpu, runs, peer, false)?)?);
    }
    Ok(Shape {
        name: format!(
            "page size 1, {}: {} {PAGE1_TOKENS} tokens x {layers} layers{}",
            host.name.split(" page size").next().unwrap_or(""),
            if h2d { "load H2D" } else { "backup D2H" },
            if h2d { ", layer by layer" } else { "" }
        ),
        h2d,
        calls,
        burst: 1,
        token_granular: true,
    })
}
