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
#[ignore = "needs a GPU: run on the device machine with --ignored"]
fn the_on_device_compare_counts_each_mismatched_page_at_every_launch_shape() {
    use cudarc::driver::{DevicePtr, DevicePtrMut};
    use kvlayout_kernels::checksum_gpu::{ChecksumJob, ChecksumLaunch};
    let gpu = Gpu::new(0).expect("a CUDA device");
    let k = ChecksumKernels::new(&gpu).expect("compile");
    let stream = gpu.stream().clone();
    let mut rng = SplitMix64::new(29);
    // 50 pages of 41,984 B (the DeepSeek-V3.2 latent), back to back.
    let payload = 41_984u64;
    let data: Vec<u8> = (0..50 * payload).map(|_| rng.next_u64() as u8).collect();
    let d = stream.clone_htod(&data).expect("upload");
    let offsets: Vec<u64> = (0..50).map(|p| p * payload).collect();
    let mut expected: Vec<u64> = offsets
        .iter()
        .map(|&o| page_checksum(5, 9, &data[o as usize..(o + payload) as usize]))
        .collect();
    // Pages 3 and 41 recorded with other values: exactly 2 mismatches.
    expected[3] ^= 1;
    expected[41] = expected[40];
    let d_offsets = stream.clone_htod(&offsets).expect("upload");
    let d_expected = stream.clone_htod(&expected).expect("upload");
    for (blocks, threads_per_block) in [(1, 1024), (2, 512), (4, 256), (64, 32)] {
        let mut out = stream.alloc_zeros::<u64>(50).expect("alloc");
        let mut counter = stream.alloc_zeros::<u64>(1).expect("alloc");
        {
            let (data_address, _g0) = d.device_ptr(&stream);
            let (offsets_address, _g1) = d_offsets.device_ptr(&stream);
            let (expected_address, _g2) = d_expected.device_ptr(&stream);
            let (out_address, _g3) = out.device_ptr_mut(&stream);
            let (mismatches_address, _g4) = counter.device_ptr_mut(&stream);
            let job = ChecksumJob {
                data_address,
                offsets_address,
                pages: 50,
                payload_bytes: payload,
                token_fingerprint: 5,
                layer_id: 9,
                out_address,
                expected_address,
                mismatches_address,
            };
            let launch = ChecksumLaunch {
                blocks,
                threads_per_block,
            };
            // SAFETY: 50 pages inside `d`; `out` and `d_expected` hold 50 words, the counter 1.
            unsafe { k.enqueue(&stream, &job, launch) }.expect("launch");
        }
        let got = stream.clone_dtoh(&out).expect("read back");
        let bad = stream.clone_dtoh(&counter).expect("read back")[0];
        assert_eq!(bad, 2, "{blocks} x {threads_per_block}");
        for (i, &o) in offsets.iter().enumerate() {
            let want = page_checksum(5, 9, &data[o as usize..(o + payload) as usize]);
            assert_eq!(got[i], want, "page {i}, {blocks} x {threads_per_block}");
        }
    }
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
