//! `checksum_bench`: the page checksum kernel's throughput on the GPU (BENCHMARKS.md, "Page
//! checksum"): the pages of a 1,024-page x 61-layer load of DeepSeek-V3.2's latent (64 x 656 =
//! 41,984 B per page and layer: 2,622,488,576 B), checksummed on 1, 2 and 4 blocks (one block of
//! 1,024 threads per SM) and on the whole GPU, against a device-to-device `memcpy` of the same
//! bytes measured in the same run; every checksum of the 1-block run checked against the CPU
//! reference. Prints one line per measurement.

use std::time::Instant;

use kvlayout_core::checksum::page_checksum;
use kvlayout_kernels::Gpu;
use kvlayout_kernels::checksum_gpu::ChecksumKernels;

const PAGE_BYTES: u64 = 64 * 656;
const PAGES: u64 = 1024 * 61;

fn main() {
    let gpu = match Gpu::new(0) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("checksum_bench: no GPU: {e}");
            std::process::exit(2);
        }
    };
    let k = ChecksumKernels::new(&gpu).expect("compile");
    let total = PAGE_BYTES * PAGES;
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let host: Vec<u8> = (0..total)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect();
    let stream = gpu.stream().clone();
    let d = stream.clone_htod(&host).expect("upload");
    let mut copy = stream.alloc_zeros::<u8>(total as usize).expect("alloc");
    let offsets: Vec<u64> = (0..PAGES).map(|p| p * PAGE_BYTES).collect();
    println!(
        "device: {} ({} SMs); {} pages x {} B = {} B",
        gpu.arch(),
        gpu.sm_count(),
        PAGES,
        PAGE_BYTES,
        total
    );
    // memcpy device -> device of the same bytes (reads and writes them: 2 x total moved).
    let mut best = f64::MAX;
    for _ in 0..5 {
        let t = Instant::now();
        stream.memcpy_dtod(&d, &mut copy).expect("dtod");
        stream.synchronize().expect("sync");
        best = best.min(t.elapsed().as_secs_f64());
    }
    println!(
        "memcpy dtod: {:.3} ms, {:.1} GB/s of payload read (and as much written)",
        best * 1e3,
        total as f64 / best / 1e9
    );
    let sms = gpu.sm_count();
    for blocks in [Some(1u32), Some(2), Some(4), Some(sms), Some(4 * sms)] {
        let mut best = f64::MAX;
        let mut sums = Vec::new();
        for _ in 0..4 {
            let t = Instant::now();
            sums = k
                .page_checksums(
                    &gpu,
                    &d,
                    &offsets,
                    PAGE_BYTES,
                    0xc1cd_f993_2d9f_02b1,
                    3,
                    blocks,
                )
                .expect("checksums");
            best = best.min(t.elapsed().as_secs_f64());
        }
        let b = blocks.unwrap_or(0);
        let mut checked = "";
        if b == 1 {
            let bad = offsets
                .iter()
                .zip(&sums)
                .filter(|&(&o, &s)| {
                    page_checksum(
                        0xc1cd_f993_2d9f_02b1,
                        3,
                        &host[o as usize..(o + PAGE_BYTES) as usize],
                    ) != s
                })
                .count();
            assert_eq!(bad, 0, "{bad} pages differ from the CPU reference");
            checked = "; all equal to the CPU reference";
        }
        println!(
            "checksum on {b} block(s) of 1024 threads: {:.3} ms, {:.1} GB/s of payload{checked}",
            best * 1e3,
            total as f64 / best / 1e9
        );
    }
}
