//! Regression tests: `HiCache::enqueue` waited on the device pool's backend only,
//! while a load is enqueued on the *host* pool's backend. Two instances of one backend type (two
//! `CudaBackend::new(0)`: two `Gpu`s, two streams) pair fine, so safe code can read, write or
//! free the device pool while the load's copy is still in flight.
//!
//! `Deferred` models a backend whose enqueued copies are finished only by *its own* `wait`
//! (exactly `Backend::wait`'s documented contract: "every copy enqueued on this backend (and
//! its clones)"). It copies at once (so bytes stay right) but records the copy as in flight
//! until that instance waits, and asserts that no pool memory is touched or freed while any
//! instance has a copy in flight, i.e. the `# Safety` contract of `enqueue_*`.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use kvlayout_core::{BufferGeometry, MemoryLayout, PoolGeometry, formats};
use kvlayout_pool::backend::copy_runs;
use kvlayout_pool::{
    Backend, BackendError, CopyRun, DevicePool, Direction, HiCache, HostPool, KvPool, Layers,
    Memory, PagePair,
};

#[derive(Clone)]
struct Deferred {
    /// Copies in flight on every instance that shares this world.
    world: Arc<AtomicUsize>,
    /// Copies in flight on this instance (and its clones).
    mine: Arc<AtomicUsize>,
}

impl Deferred {
    fn assert_idle(&self, what: &str) {
        let n = self.world.load(Ordering::SeqCst);
        assert_eq!(n, 0, "{what} while {n} enqueued copy(ies) still in flight");
    }
    fn enqueued(&self) {
        self.mine.fetch_add(1, Ordering::SeqCst);
        self.world.fetch_add(1, Ordering::SeqCst);
    }
}

struct Mem {
    bytes: Vec<u8>,
    world: Arc<AtomicUsize>,
}
impl Memory for Mem {
    fn len_bytes(&self) -> u64 {
        self.bytes.len() as u64
    }
}
impl Drop for Mem {
    fn drop(&mut self) {
        let n = self.world.load(Ordering::SeqCst);
        if n != 0 && !std::thread::panicking() {
            panic!("pool memory freed while {n} enqueued copy(ies) still in flight");
        }
    }
}

// SAFETY: copies finish at once; `wait` only does the bookkeeping the tests check.
unsafe impl Backend for Deferred {
    type DeviceMem = Mem;
    type HostMem = Mem;
    fn name(&self) -> &'static str {
        "deferred"
    }
    fn alloc_device(&self, len_bytes: u64) -> Result<Mem, BackendError> {
        Ok(Mem {
            bytes: vec![0; len_bytes as usize],
            world: self.world.clone(),
        })
    }
    fn alloc_host(&self, len_bytes: u64) -> Result<Mem, BackendError> {
        self.alloc_device(len_bytes)
    }
    fn read_device(&self, m: &Mem, off: u64, out: &mut [u8]) -> Result<(), BackendError> {
        self.assert_idle("device pool read");
        out.copy_from_slice(&m.bytes[off as usize..off as usize + out.len()]);
        Ok(())
    }
    fn write_device(&self, m: &mut Mem, off: u64, d: &[u8]) -> Result<(), BackendError> {
        self.assert_idle("device pool written");
        m.bytes[off as usize..off as usize + d.len()].copy_from_slice(d);
        Ok(())
    }
    fn read_host(&self, m: &Mem, off: u64, out: &mut [u8]) -> Result<(), BackendError> {
        self.assert_idle("host pool read");
        out.copy_from_slice(&m.bytes[off as usize..off as usize + out.len()]);
        Ok(())
    }
    fn write_host(&self, m: &mut Mem, off: u64, d: &[u8]) -> Result<(), BackendError> {
        self.assert_idle("host pool written");
        m.bytes[off as usize..off as usize + d.len()].copy_from_slice(d);
        Ok(())
    }
    fn device_to_host(&self, s: &Mem, d: &mut Mem, r: &[CopyRun]) -> Result<(), BackendError> {
        copy_runs(Direction::Backup, &s.bytes, &mut d.bytes, r)
    }
    fn host_to_device(&self, s: &Mem, d: &mut Mem, r: &[CopyRun]) -> Result<(), BackendError> {
        copy_runs(Direction::Load, &s.bytes, &mut d.bytes, r)
    }
    unsafe fn enqueue_device_to_host(
        &self,
        s: &Mem,
        d: &mut Mem,
        r: &[CopyRun],
    ) -> Result<(), BackendError> {
        self.device_to_host(s, d, r)?;
        self.enqueued();
        Ok(())
    }
    unsafe fn enqueue_host_to_device(
        &self,
        s: &Mem,
        d: &mut Mem,
        r: &[CopyRun],
    ) -> Result<(), BackendError> {
        self.host_to_device(s, d, r)?;
        self.enqueued();
        Ok(())
    }
    fn wait(&self) -> Result<(), BackendError> {
        let n = self.mine.swap(0, Ordering::SeqCst);
        self.world.fetch_sub(n, Ordering::SeqCst);
        Ok(())
    }
}

fn geometry(pages: u64) -> PoolGeometry {
    PoolGeometry {
        name: "review3".into(),
        page_size_tokens: 64,
        pages,
        memory_layout: MemoryLayout::LayerFirst,
        buffers: vec![BufferGeometry::new("index_k", 2, formats::INDEX_K_FP8)],
    }
}

/// Device pool on one backend instance, host pool on another: `pair` accepts it.
fn mixed() -> HiCache<Deferred> {
    let world = Arc::new(AtomicUsize::new(0));
    let a = Deferred {
        world: world.clone(),
        mine: Arc::new(AtomicUsize::new(0)),
    };
    let b = Deferred {
        world,
        mine: Arc::new(AtomicUsize::new(0)),
    };
    let device = DevicePool::new_in(a, geometry(4)).unwrap();
    let mut g = geometry(6);
    g.memory_layout = MemoryLayout::PageFirst;
    let host = HostPool::from_geometry_in(b, g).unwrap();
    HiCache::pair(device, host).expect("pair accepts pools on two backend instances")
}

/// Same instance on both sides: the accessors wait, as documented (passes).
#[test]
fn same_backend_instance_waits_before_the_device_is_read() {
    let world = Arc::new(AtomicUsize::new(0));
    let a = Deferred {
        world,
        mine: Arc::new(AtomicUsize::new(0)),
    };
    let device = DevicePool::new_in(a, geometry(4)).unwrap();
    let host = HostPool::mirror_of(&device, 6, MemoryLayout::PageFirst).unwrap();
    let mut c = HiCache::pair(device, host).unwrap();
    c.enqueue(Direction::Load, Layers::All, &[PagePair::new(1, 0)])
        .unwrap();
    let mut out = [0u8; 16];
    c.device().read_bytes(0, &mut out).unwrap();
}

/// Safe code only: a load enqueued, then the device pool read. Failed before the fix:
/// `HiCache::device` waited on the device's backend, the copy runs on the host's.
#[test]
fn a_load_on_the_host_backend_is_waited_for_before_the_device_is_read() {
    let mut c = mixed();
    c.enqueue(Direction::Load, Layers::All, &[PagePair::new(1, 0)])
        .unwrap();
    let mut out = [0u8; 16];
    c.device().read_bytes(0, &mut out).unwrap();
}

/// Safe code only: a load enqueued, then the pools taken back and dropped (freed). Failed
/// before the fix.
#[test]
fn a_load_on_the_host_backend_is_waited_for_before_the_pools_are_freed() {
    let mut c = mixed();
    c.enqueue(Direction::Load, Layers::One(0), &[PagePair::new(1, 0)])
        .unwrap();
    let (device, host) = c.into_parts();
    drop(device);
    drop(host);
}

/// `complete` must wait for it too. Failed before the fix.
#[test]
fn complete_waits_for_a_load_on_the_host_backend() {
    let mut c = mixed();
    c.enqueue(Direction::Load, Layers::All, &[PagePair::new(1, 0)])
        .unwrap();
    c.complete().unwrap();
    let mut out = [0u8; 16];
    c.host().read_bytes(0, &mut out).unwrap();
}

/// Like `Deferred`, but its wait takes a while (a GPU stream still copying).
#[derive(Clone)]
struct Slow(Deferred);

// SAFETY: as `Deferred`, whose methods it forwards to.
unsafe impl Backend for Slow {
    type DeviceMem = Mem;
    type HostMem = Mem;
    fn name(&self) -> &'static str {
        "slow"
    }
    fn alloc_device(&self, n: u64) -> Result<Mem, BackendError> {
        self.0.alloc_device(n)
    }
    fn alloc_host(&self, n: u64) -> Result<Mem, BackendError> {
        self.0.alloc_host(n)
    }
    fn read_device(&self, m: &Mem, o: u64, out: &mut [u8]) -> Result<(), BackendError> {
        self.0.read_device(m, o, out)
    }
    fn write_device(&self, m: &mut Mem, o: u64, d: &[u8]) -> Result<(), BackendError> {
        self.0.write_device(m, o, d)
    }
    fn read_host(&self, m: &Mem, o: u64, out: &mut [u8]) -> Result<(), BackendError> {
        self.0.read_host(m, o, out)
    }
    fn write_host(&self, m: &mut Mem, o: u64, d: &[u8]) -> Result<(), BackendError> {
        self.0.write_host(m, o, d)
    }
    fn device_to_host(&self, s: &Mem, d: &mut Mem, r: &[CopyRun]) -> Result<(), BackendError> {
        self.0.device_to_host(s, d, r)
    }
    fn host_to_device(&self, s: &Mem, d: &mut Mem, r: &[CopyRun]) -> Result<(), BackendError> {
        self.0.host_to_device(s, d, r)
    }
    unsafe fn enqueue_device_to_host(
        &self,
        s: &Mem,
        d: &mut Mem,
        r: &[CopyRun],
    ) -> Result<(), BackendError> {
        // SAFETY: forwarded to the caller, who upholds `enqueue_device_to_host`'s contract.
        unsafe { self.0.enqueue_device_to_host(s, d, r) }
    }
    unsafe fn enqueue_host_to_device(
        &self,
        s: &Mem,
        d: &mut Mem,
        r: &[CopyRun],
    ) -> Result<(), BackendError> {
        // SAFETY: forwarded to the caller, who upholds `enqueue_host_to_device`'s contract.
        unsafe { self.0.enqueue_host_to_device(s, d, r) }
    }
    fn wait(&self) -> Result<(), BackendError> {
        std::thread::sleep(std::time::Duration::from_millis(300));
        self.0.wait()
    }
}

/// Safe code only: one backend instance for both pools (the documented set-up), a load
/// enqueued, then `&HiCache` shared by two threads that both read the device pool.
/// `InFlight::settle` clears its flag *before* it waits, so the second reader sees "nothing in
/// flight" and reads while the first is still waiting for the copy. Failed before the fix.
#[test]
fn two_threads_reading_a_shared_cache_both_wait_for_the_copy() {
    let world = Arc::new(AtomicUsize::new(0));
    let a = Slow(Deferred {
        world,
        mine: Arc::new(AtomicUsize::new(0)),
    });
    let device = DevicePool::new_in(a, geometry(4)).unwrap();
    let host = HostPool::mirror_of(&device, 6, MemoryLayout::PageFirst).unwrap();
    let mut c = HiCache::pair(device, host).unwrap();
    c.enqueue(Direction::Load, Layers::All, &[PagePair::new(1, 0)])
        .unwrap();
    let c = &c;
    std::thread::scope(|s| {
        let t1 = s.spawn(move || {
            let mut out = [0u8; 16];
            c.device().read_bytes(0, &mut out).unwrap();
        });
        std::thread::sleep(std::time::Duration::from_millis(50));
        let t2 = s.spawn(move || {
            let mut out = [0u8; 16];
            c.device().read_bytes(0, &mut out).unwrap();
        });
        let (r1, r2) = (t1.join(), t2.join());
        assert!(
            r1.is_ok() && r2.is_ok(),
            "a reader touched the pool while the copy ran"
        );
    });
}

/// A backend whose enqueued copies run only when *it* waits: one instance is one stream, two
/// instances are two unordered streams (a legal schedule under the enqueue contract).
#[derive(Clone)]
struct Stream {
    queue: Arc<std::sync::Mutex<Vec<Pending>>>,
}

struct Pending {
    dir: Direction,
    src: *const u8,
    src_len: usize,
    dst: *mut u8,
    dst_len: usize,
    runs: Vec<CopyRun>,
}
// SAFETY: test only; the pointers are used only under the enqueue contract.
unsafe impl Send for Pending {}

impl Stream {
    fn new() -> Self {
        Stream {
            queue: Arc::new(std::sync::Mutex::new(Vec::new())),
        }
    }
    fn push(&self, dir: Direction, s: &[u8], d: &mut [u8], r: &[CopyRun]) {
        self.queue.lock().unwrap().push(Pending {
            dir,
            src: s.as_ptr(),
            src_len: s.len(),
            dst: d.as_mut_ptr(),
            dst_len: d.len(),
            runs: r.to_vec(),
        });
    }
}

// SAFETY: `wait` runs every queued copy before it returns and never calls back;
// `shares_waits_with` is the default (false).
unsafe impl Backend for Stream {
    type DeviceMem = Vec<u8>;
    type HostMem = Vec<u8>;
    fn name(&self) -> &'static str {
        "stream"
    }
    fn alloc_device(&self, n: u64) -> Result<Vec<u8>, BackendError> {
        Ok(vec![0; n as usize])
    }
    fn alloc_host(&self, n: u64) -> Result<Vec<u8>, BackendError> {
        Ok(vec![0; n as usize])
    }
    fn read_device(&self, m: &Vec<u8>, o: u64, out: &mut [u8]) -> Result<(), BackendError> {
        out.copy_from_slice(&m[o as usize..o as usize + out.len()]);
        Ok(())
    }
    fn write_device(&self, m: &mut Vec<u8>, o: u64, d: &[u8]) -> Result<(), BackendError> {
        m[o as usize..o as usize + d.len()].copy_from_slice(d);
        Ok(())
    }
    fn read_host(&self, m: &Vec<u8>, o: u64, out: &mut [u8]) -> Result<(), BackendError> {
        self.read_device(m, o, out)
    }
    fn write_host(&self, m: &mut Vec<u8>, o: u64, d: &[u8]) -> Result<(), BackendError> {
        self.write_device(m, o, d)
    }
    fn device_to_host(
        &self,
        s: &Vec<u8>,
        d: &mut Vec<u8>,
        r: &[CopyRun],
    ) -> Result<(), BackendError> {
        copy_runs(Direction::Backup, s, d, r)
    }
    fn host_to_device(
        &self,
        s: &Vec<u8>,
        d: &mut Vec<u8>,
        r: &[CopyRun],
    ) -> Result<(), BackendError> {
        copy_runs(Direction::Load, s, d, r)
    }
    unsafe fn enqueue_device_to_host(
        &self,
        s: &Vec<u8>,
        d: &mut Vec<u8>,
        r: &[CopyRun],
    ) -> Result<(), BackendError> {
        self.push(Direction::Backup, s, d, r);
        Ok(())
    }
    unsafe fn enqueue_host_to_device(
        &self,
        s: &Vec<u8>,
        d: &mut Vec<u8>,
        r: &[CopyRun],
    ) -> Result<(), BackendError> {
        self.push(Direction::Load, s, d, r);
        Ok(())
    }
    fn wait(&self) -> Result<(), BackendError> {
        let pending: Vec<Pending> = std::mem::take(&mut *self.queue.lock().unwrap());
        for p in pending {
            // SAFETY: the enqueue contract keeps both regions alive and untouched until this
            // wait returns.
            let (s, d) = unsafe {
                (
                    std::slice::from_raw_parts(p.src, p.src_len),
                    std::slice::from_raw_parts_mut(p.dst, p.dst_len),
                )
            };
            copy_runs(p.dir, s, d, &p.runs)?;
        }
        Ok(())
    }
}

/// Review 4: device pool on stream `a`, host pool on stream `b`. Load host 1 -> device 0, then
/// back up device 0 -> host 2: host 2 must hold what host 1 held. The load is on `b`, the backup
/// on `a`: before the fix nothing ordered them and the backup copied the old page.
#[test]
fn enqueued_load_then_backup_on_two_streams_stay_in_order() {
    let device = DevicePool::new_in(Stream::new(), geometry(4)).unwrap();
    let host = HostPool::from_geometry_in(Stream::new(), geometry(6)).unwrap();
    let mut c = HiCache::pair(device, host).unwrap();
    let len = c.device().read_page(0, 0, 0).unwrap().len();
    for layer in 0..2 {
        c.device_writer()
            .write_page(0, layer, 0, &vec![0xAA; len])
            .unwrap();
        c.host_writer()
            .write_page(0, layer, 1, &vec![0x55; len])
            .unwrap();
    }
    c.enqueue(Direction::Load, Layers::All, &[PagePair::new(0, 1)])
        .unwrap();
    c.enqueue(Direction::Backup, Layers::All, &[PagePair::new(0, 2)])
        .unwrap();
    c.complete().unwrap();
    assert!(
        c.device()
            .read_page(0, 0, 0)
            .unwrap()
            .iter()
            .all(|&b| b == 0x55)
    );
    let host2 = c.host().read_page(0, 0, 2).unwrap();
    assert!(
        host2.iter().all(|&b| b == 0x55),
        "host page 2 starts {:#x}: the backup ran before the load it follows",
        host2[0]
    );
}

/// With checksums on, enqueued transfers are checksummed at the wait (issue 23): the pages are
/// read only once no copy is in flight (`Deferred` panics on a pool read while one is), both
/// at `complete` and when a load into a page still to checksum waits for it at enqueue.
#[test]
fn checksums_of_enqueued_transfers_read_the_pools_only_after_the_wait() {
    let mut c = mixed();
    c.set_checksum_mode(kvlayout_pool::ChecksumMode::All)
        .unwrap();
    c.enqueue(Direction::Backup, Layers::All, &[PagePair::new(1, 0)])
        .unwrap();
    c.enqueue(Direction::Load, Layers::All, &[PagePair::new(2, 0)])
        .unwrap();
    // Device page 2 again: the pending checksums are made (after a wait) before it enqueues.
    c.enqueue(Direction::Load, Layers::All, &[PagePair::new(2, 0)])
        .unwrap();
    c.complete().unwrap();
    // 2 loads x 2 layers verified against the backup's record.
    let s = c.stats();
    assert_eq!((s.checksummed_pages, s.checksum_mismatches), (4, 0));
}
