//! The page checksum's NVRTC kernel against the CPU reference, bit for bit (`kvlayout.checksum/v1`).
//! Ignored by default (CI has no GPU); run on the device machine with `--ignored`.

use kvlayout_core::checksum::page_checksum;
use kvlayout_kernels::Gpu;
use kvlayout_kernels::checksum_gpu::ChecksumKernels;
use kvlayout_kernels::test_data::SplitMix64;

#[test]
#[ignore = "needs a GPU: run on the device machine with --ignored"]
fn gpu_checksums_equal_the_cpu_reference_bit_for_bit() {
    let gpu = Gpu::new(0).expect("a CUDA device");
    let k = ChecksumKernels::new(&gpu).expect("compile");
    let mut rng = SplitMix64::new(23);
    let data: Vec<u8> = (0..(3 << 20)).map(|_| rng.next_u64() as u8).collect();
    let d = gpu.stream().clone_htod(&data).expect("upload");
    // Page payloads: DeepSeek-V3.2 latent (64 x 656), fp8 index-K (64 x 132), bf16 index-K
    // (64 x 256), DeepSeek-V4 (64 x 584 = 37,376), a partial word, one byte past a chunk.
    for payload in [41_984u64, 8_448, 16_384, 37_376, 3, 4_097, 100] {
        for blocks in [None, Some(1), Some(2)] {
            // Aligned pages, then unaligned starts (odd offsets).
            let offsets: Vec<u64> = (0..40u64)
                .map(|i| {
                    (i * 52_361 + if i % 3 == 0 { 0 } else { i }) % (data.len() as u64 - payload)
                })
                .collect();
            let got = k
                .page_checksums(
                    &gpu,
                    &d,
                    &offsets,
                    payload,
                    0xc1cd_f993_2d9f_02b1,
                    7,
                    blocks,
                )
                .expect("checksums");
            for (i, &o) in offsets.iter().enumerate() {
                let want = page_checksum(
                    0xc1cd_f993_2d9f_02b1,
                    7,
                    &data[o as usize..(o + payload) as usize],
                );
                assert_eq!(
                    got[i], want,
                    "payload {payload}, page {i} at {o}, blocks {blocks:?}"
                );
            }
        }
    }
    // A page past the buffer is refused before any launch.
    let e = k
        .page_checksums(&gpu, &d, &[data.len() as u64 - 10], 100, 0, 0, None)
        .unwrap_err();
    assert!(e.to_string().contains("past the"), "{e}");
}

#[test]
fn the_kernel_compiles_for_hopper_where_nvrtc_is_present() {
    if !kvlayout_kernels::nvrtc_present() {
        println!("skipped: libnvrtc not found (the GPU test compiles it on the device machine)");
        return;
    }
    let ptx = kvlayout_kernels::checksum_gpu::compile("sm_90").expect("NVRTC compile");
    let text = ptx.to_src();
    // The full-chunk path's 16-byte streaming loads are in the PTX.
    assert!(
        text.contains("ld.global.cs.v4.u32"),
        "no 16-byte loads in the PTX"
    );
}
