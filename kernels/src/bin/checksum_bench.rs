//! `checksum_bench`: the page checksum kernel's throughput on the GPU (BENCHMARKS.md, "Page
//! checksum"): the pages of a 1,024-page x 61-layer load of DeepSeek-V3.2's latent (64 x 656 =
//! 41,984 B per page and layer: 2,622,488,576 B), checksummed on 1, 2 and 4 blocks of 1,024
//! threads (one block per SM), on 1 block of 512 threads, and on the whole GPU, against a
//! device-to-device `memcpy` of the same bytes measured in the same run. Timed with CUDA events
//! around the launch alone (page offsets uploaded once), median of 5 after a warm-up. The
//! checksums of every launch shape are checked against the CPU reference (all 62,464 pages),
//! with random bytes in the pages and the result buffer poisoned before each run. Prints one
//! line per measurement.

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{DevicePtr, DevicePtrMut};
use kvlayout_core::checksum::page_checksum;
use kvlayout_kernels::Gpu;
use kvlayout_kernels::checksum_gpu::{ChecksumJob, ChecksumKernels, ChecksumLaunch};

const PAGE_BYTES: u64 = 64 * 656;
const PAGES: u64 = 1024 * 61;
const SEED: (u64, u64) = (0xc1cd_f993_2d9f_02b1, 3);

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

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
    let d_offsets = stream.clone_htod(&offsets).expect("upload offsets");
    let mut out = stream.alloc_zeros::<u64>(PAGES as usize).expect("alloc");
    let want: Vec<u64> = offsets
        .iter()
        .map(|&o| page_checksum(SEED.0, SEED.1, &host[o as usize..(o + PAGE_BYTES) as usize]))
        .collect();
    println!(
        "device: {} ({} SMs); {} pages x {} B = {} B",
        gpu.arch(),
        gpu.sm_count(),
        PAGES,
        PAGE_BYTES,
        total
    );
    let ev = || {
        gpu.context()
            .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .expect("event")
    };
    // memcpy device -> device of the same bytes (reads and writes them: 2 x total moved).
    let mut times = Vec::new();
    for i in 0..6 {
        let (a, b) = (ev(), ev());
        a.record(&stream).expect("record");
        stream.memcpy_dtod(&d, &mut copy).expect("dtod");
        b.record(&stream).expect("record");
        stream.synchronize().expect("sync");
        if i > 0 {
            times.push(f64::from(a.elapsed_ms(&b).expect("elapsed")));
        }
    }
    let ms = median(times);
    println!(
        "memcpy dtod: {ms:.3} ms, {:.1} GB/s of payload read (and as much written)",
        total as f64 / ms / 1e6
    );
    let sms = gpu.sm_count();
    let shapes = [
        ChecksumLaunch::sms(1),
        ChecksumLaunch {
            blocks: 1,
            threads_per_block: 512,
        },
        ChecksumLaunch::sms(2),
        ChecksumLaunch::sms(4),
        ChecksumLaunch::sms(sms),
        ChecksumLaunch::for_pages(PAGES),
    ];
    for launch in shapes {
        let mut times = Vec::new();
        for i in 0..6 {
            stream.memset_zeros(&mut out).expect("poison the results");
            let (a, b) = (ev(), ev());
            a.record(&stream).expect("record");
            {
                let (data_address, _g0) = d.device_ptr(&stream);
                let (offsets_address, _g1) = d_offsets.device_ptr(&stream);
                let (out_address, _g2) = out.device_ptr_mut(&stream);
                let job = ChecksumJob {
                    data_address,
                    offsets_address,
                    pages: PAGES,
                    payload_bytes: PAGE_BYTES,
                    token_fingerprint: SEED.0,
                    layer_id: SEED.1,
                    out_address,
                    expected_address: 0,
                    mismatches_address: 0,
                };
                // SAFETY: every page lies inside `d`; `d_offsets` and `out` hold PAGES words.
                unsafe { k.enqueue(&stream, &job, launch) }.expect("launch");
            }
            b.record(&stream).expect("record");
            stream.synchronize().expect("sync");
            if i > 0 {
                times.push(f64::from(a.elapsed_ms(&b).expect("elapsed")));
            }
        }
        let got = stream.clone_dtoh(&out).expect("read back");
        let bad = got.iter().zip(&want).filter(|(g, w)| g != w).count();
        assert_eq!(
            bad, 0,
            "{bad} pages differ from the CPU reference ({launch:?})"
        );
        let ms = median(times);
        println!(
            "checksum on {} block(s) of {} threads: {ms:.3} ms, {:.1} GB/s of payload; all {PAGES} equal to the CPU reference",
            launch.blocks,
            launch.threads_per_block,
            total as f64 / ms / 1e6
        );
    }
}
