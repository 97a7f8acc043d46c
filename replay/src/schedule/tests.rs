//! The page schedule worked by hand on small pools.

use super::*;

/// Records what the schedule asks for; refuses backups when `refuse_backups`.
#[derive(Default)]
struct Log {
    refuse_backups: bool,
    computed: Vec<(PageId, u64)>,
    backups: Vec<Vec<PagePair>>,
    loads: Vec<Vec<PagePair>>,
    checked: Vec<(u64, usize)>,
}

impl PageStore for Log {
    fn compute(&mut self, page: PageId, device_page: u64) -> Result<(), ReplayError> {
        self.computed.push((page, device_page));
        Ok(())
    }
    fn backup(&mut self, pairs: &[PagePair]) -> Result<bool, ReplayError> {
        self.backups.push(pairs.to_vec());
        Ok(!self.refuse_backups)
    }
    fn load(&mut self, pairs: &[PagePair]) -> Result<bool, ReplayError> {
        self.loads.push(pairs.to_vec());
        Ok(true)
    }
    fn check(&mut self, r: &Request, pages: &[(PageId, u64)]) -> Result<bool, ReplayError> {
        self.checked.push((r.line, pages.len()));
        Ok(false)
    }
}

fn cfg(device_pages: u64, host_pages: u64, write_policy: WritePolicy) -> ScheduleConfig {
    ScheduleConfig {
        device_pages,
        host_pages,
        page_size_tokens: 64,
        write_policy,
        // 1 ms of prefill for any request: each one is done before the next arrives.
        prefill_tokens_per_s: 1_000_000_000,
        decode_ms_per_token: 0,
    }
}

fn req(line: u64, t: u64, input: u64, output: u64, ids: &[u64]) -> Request {
    Request {
        line,
        timestamp_ms: t,
        input_tokens: input,
        output_tokens: output,
        hash_ids: ids.to_vec(),
    }
}

fn pages(pairs: &[Vec<PagePair>]) -> usize {
    pairs.iter().map(Vec::len).sum()
}

#[test]
fn write_back_evicts_lru_leaf_and_loads_it_back() {
    let mut s = Schedule::new(cfg(16, 32, WritePolicy::WriteBack)).unwrap();
    let mut log = Log::default();
    // R1: 1024 tokens = blocks 1, 2 = 16 pages: fills the device.
    let r1 = s.admit(&req(1, 0, 1024, 0, &[1, 2]), &mut log).unwrap();
    assert_eq!((r1.device_tokens, r1.recomputed_tokens), (0, 1024));
    // R2: block 3 (8 pages); the LRU device leaf is block 2 (block 1 is its parent):
    // backed up (8 pages) and freed.
    let r2 = s.admit(&req(2, 10, 512, 0, &[3]), &mut log).unwrap();
    assert_eq!(r2.recomputed_tokens, 512);
    assert_eq!(pages(&log.backups), 8);
    // R3: blocks 1, 2 again: block 1 on the device (512 tokens), block 2 on the host (512
    // tokens, 8 pages loaded); room for it by evicting block 3 (8 more pages backed up).
    let r3 = s.admit(&req(3, 20, 1024, 0, &[1, 2]), &mut log).unwrap();
    assert_eq!(
        (
            r3.device_tokens,
            r3.host_tokens,
            r3.recomputed_tokens,
            r3.loaded_pages
        ),
        (512, 512, 0, 8)
    );
    assert_eq!(pages(&log.backups), 16);
    assert_eq!(pages(&log.loads), 8);
    // The check ran for R3 only, over its 16 pages.
    assert_eq!(log.checked, vec![(3, 16)]);
    // Computed: 16 (R1) + 8 (R2) pages.
    assert_eq!(log.computed.len(), 24);
    assert_eq!(s.counts.computed_pages, 24);
    assert_eq!(s.counts.device_hit_pages, 8);
    assert_eq!(s.counts.loaded_pages, 8);
    // The loaded pages come from the host pages block 2 was backed up to.
    let backed: Vec<u64> = log.backups[0].iter().map(|p| p.host_page).collect();
    let loaded: Vec<u64> = log.loads[0].iter().map(|p| p.host_page).collect();
    assert_eq!(backed, loaded);
}

#[test]
fn partial_page_and_decoded_tokens_are_private() {
    let mut s = Schedule::new(cfg(4, 8, WritePolicy::WriteBack)).unwrap();
    let mut log = Log::default();
    // 100 prompt tokens: floor(100 / 64) = 1 cached page; with 30 decoded tokens the
    // request holds ceil(130 / 64) = 3 pages, 2 of them private.
    let r = s.admit(&req(1, 0, 100, 30, &[7]), &mut log).unwrap();
    assert_eq!(r.recomputed_tokens, 100);
    assert_eq!(log.computed.len(), 1);
    assert_eq!(s.device_used_pages(), 3);
    s.drain();
    // Finished: the private pages are free, the cached page stays.
    assert_eq!(s.device_used_pages(), 1);
    // The same prompt again: 64 tokens from the device, 36 recomputed.
    let r = s.admit(&req(2, 10, 100, 0, &[7]), &mut log).unwrap();
    assert_eq!((r.device_tokens, r.recomputed_tokens), (64, 36));
}

#[test]
fn write_through_backs_up_when_computed() {
    let mut s = Schedule::new(cfg(16, 32, WritePolicy::WriteThrough)).unwrap();
    let mut log = Log::default();
    s.admit(&req(1, 0, 1024, 0, &[1, 2]), &mut log).unwrap();
    assert_eq!(pages(&log.backups), 16);
    // Evicting an already backed-up node moves nothing more.
    s.admit(&req(2, 10, 512, 0, &[3]), &mut log).unwrap();
    assert_eq!(pages(&log.backups), 24);
    assert_eq!(s.counts.evicted_device_pages, 8);
}

#[test]
fn a_request_larger_than_the_device_pool_names_device_pages() {
    let mut s = Schedule::new(cfg(4, 8, WritePolicy::WriteBack)).unwrap();
    let e = s
        .admit(&req(9, 0, 512, 0, &[1]), &mut Log::default())
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("workload: device_pages: 4 pages cannot hold the request of trace line 9: it needs 8 pages"), "{e}");
}

/// Regression: 512 prompt tokens fill 512 / 64 = 8 pages exactly; the 1 decoded token needs
/// ceil(513 / 64) - 8 = 1 private page, and no prompt token is past the last full page (the
/// message said "for its last partial page", which this prompt does not have).
#[test]
fn a_request_larger_than_the_pool_counts_its_private_pages_honestly() {
    let mut s = Schedule::new(cfg(4, 8, WritePolicy::WriteBack)).unwrap();
    let e = s
        .admit(&req(9, 0, 512, 1, &[1]), &mut Log::default())
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        "workload: device_pages: 4 pages cannot hold the request of trace line 9: it needs \
         9 pages (0 to load, 8 to compute, 1 private for its 0 prompt tokens past the last full \
         page and 1 decoded tokens)"
    );
    // 520 tokens: 8 full pages and 520 - 512 = 8 tokens past them; with 1 decoded token
    // ceil(521 / 64) - 8 = 1 private page.
    let mut s = Schedule::new(cfg(4, 8, WritePolicy::WriteBack)).unwrap();
    let e = s
        .admit(&req(3, 0, 520, 1, &[1, 2]), &mut Log::default())
        .unwrap_err()
        .to_string();
    assert!(
        e.ends_with(
            "1 private for its 8 prompt tokens past the last full page and 1 decoded tokens)"
        ),
        "{e}"
    );
}

#[test]
fn a_request_waits_for_a_running_one() {
    let mut c = cfg(8, 8, WritePolicy::WriteBack);
    c.decode_ms_per_token = 1000;
    let mut s = Schedule::new(c).unwrap();
    let mut log = Log::default();
    // R1: 450 prompt tokens = floor(450 / 64) = 7 cached pages; with 2 decoded tokens
    // ceil(452 / 64) = 8 pages in all: the whole device.
    s.admit(&req(1, 0, 450, 2, &[1]), &mut log).unwrap();
    // It runs 1 ms of prefill + 2 x 1000 ms of decode: until 2001 ms. R2 (8 pages) arrives
    // at 5 ms and is admitted when R1 ends.
    let r2 = s.admit(&req(2, 5, 512, 0, &[2]), &mut log).unwrap();
    assert_eq!(r2.admitted_ms, 2001);
    assert_eq!(s.counts.delayed_requests, 1);
}

#[test]
fn a_full_host_drops_the_page() {
    // No host page at all can be evicted (the host holds nothing evictable): block 1 is
    // dropped, not backed up.
    let mut s = Schedule::new(cfg(8, 1, WritePolicy::WriteBack)).unwrap();
    let mut log = Log::default();
    s.admit(&req(1, 0, 512, 0, &[1]), &mut log).unwrap();
    s.admit(&req(2, 10, 512, 0, &[2]), &mut log).unwrap();
    assert_eq!(s.counts.dropped_pages, 8);
    assert!(log.backups.is_empty());
    // Block 1 again: recomputed.
    let r = s.admit(&req(3, 20, 512, 0, &[1]), &mut log).unwrap();
    assert_eq!(r.recomputed_tokens, 512);
}

#[test]
fn a_refused_backup_leaves_no_host_copy() {
    let mut s = Schedule::new(cfg(8, 16, WritePolicy::WriteBack)).unwrap();
    let mut log = Log {
        refuse_backups: true,
        ..Log::default()
    };
    s.admit(&req(1, 0, 512, 0, &[1]), &mut log).unwrap();
    // Block 1 is evicted; its backup (8 pages) is refused, so it is dropped.
    s.admit(&req(2, 10, 512, 0, &[2]), &mut log).unwrap();
    assert_eq!(pages(&log.backups), 8);
    assert_eq!(s.counts.refused_transfers, 1);
    assert_eq!(s.counts.backed_up_pages, 0);
    assert_eq!(s.counts.dropped_pages, 8);
    assert_eq!(s.host_used_pages(), 0);
    // Block 1 again: nothing to load, recomputed.
    let r = s.admit(&req(3, 20, 512, 0, &[1]), &mut log).unwrap();
    assert_eq!((r.host_tokens, r.recomputed_tokens), (0, 512));
    assert!(log.loads.is_empty());
}

/// Tracks which page each device and host page holds, as the bytes would.
#[derive(Default)]
struct Contents {
    device: std::collections::HashMap<u64, PageId>,
    host: std::collections::HashMap<u64, PageId>,
    checks: u64,
    loads: u64,
}

impl PageStore for Contents {
    fn compute(&mut self, page: PageId, device_page: u64) -> Result<(), ReplayError> {
        self.device.insert(device_page, page);
        Ok(())
    }
    fn backup(&mut self, pairs: &[PagePair]) -> Result<bool, ReplayError> {
        for p in pairs {
            let page = self.device[&p.device_page];
            self.host.insert(p.host_page, page);
        }
        Ok(true)
    }
    fn load(&mut self, pairs: &[PagePair]) -> Result<bool, ReplayError> {
        self.loads += 1;
        for p in pairs {
            let page = self.host[&p.host_page];
            self.device.insert(p.device_page, page);
        }
        Ok(true)
    }
    fn check(&mut self, r: &Request, pages: &[(PageId, u64)]) -> Result<bool, ReplayError> {
        self.checks += 1;
        for &(want, dev) in pages {
            assert_eq!(self.device.get(&dev), Some(&want), "line {}", r.line);
        }
        Ok(false)
    }
}

/// Random multi-turn traces on small pools: every request that loads from the host finds, on
/// the device, exactly the pages of its prompt (as the pages moved), the pools never hold more
/// than their capacity, and every prompt token is counted once. (It found the double count of
/// dropped pages: `dropped_pages_count_once_toward_an_eviction`.)
#[test]
fn random_traces_keep_pages_where_the_schedule_says() {
    use kvlayout_kernels::test_data::SplitMix64;
    for seed in 0..40u64 {
        let mut rng = SplitMix64::new(seed);
        let policy = if seed % 2 == 0 {
            WritePolicy::WriteBack
        } else {
            WritePolicy::WriteThrough
        };
        let mut c = cfg(48 + rng.below(48), 16 + rng.below(96), policy);
        c.decode_ms_per_token = rng.below(50);
        c.prefill_tokens_per_s = 1000 + rng.below(100_000);
        let mut s = Schedule::new(c.clone()).unwrap();
        let mut store = Contents::default();
        // Sessions grow one block per turn; block ids are unique per (session, block).
        let mut turns = [0u64; 6];
        let mut t = 0;
        for line in 1..=120u64 {
            let session = rng.below(6);
            turns[session as usize] = (turns[session as usize] + 1).min(4);
            let blocks = turns[session as usize];
            let input = (blocks - 1) * 512 + 1 + rng.below(512);
            let ids: Vec<u64> = (0..blocks).map(|b| 100 * session + b).collect();
            t += rng.below(400);
            let r = req(line, t, input, rng.below(200), &ids);
            let out = s.admit(&r, &mut store).unwrap();
            assert_eq!(
                out.device_tokens + out.host_tokens + out.recomputed_tokens,
                input,
                "seed {seed} line {line}"
            );
            assert!(s.device_used_pages() <= c.device_pages);
            assert!(s.host_used_pages() <= c.host_pages);
        }
        s.drain();
        assert_eq!(store.checks, store.loads, "seed {seed}");
    }
}

/// Regression (found by the random traces above): pages dropped by an eviction (no host room)
/// were counted twice toward the pages it had to free, so it stopped early and prefill found
/// no free page. Two 8-page blocks fill a 16-page device; a 16-page request must drop both.
#[test]
fn dropped_pages_count_once_toward_an_eviction() {
    let mut s = Schedule::new(cfg(16, 1, WritePolicy::WriteBack)).unwrap();
    let mut log = Log::default();
    s.admit(&req(1, 0, 512, 0, &[1]), &mut log).unwrap();
    s.admit(&req(2, 10, 512, 0, &[2]), &mut log).unwrap();
    let r = s.admit(&req(3, 20, 1024, 0, &[3, 4]), &mut log).unwrap();
    assert_eq!(r.recomputed_tokens, 1024);
    assert_eq!(s.counts.dropped_pages, 16);
}
