//! Page claims of [`crate::ConcurrentHiCache`]: one 32-bit word per page of each pool, taken
//! before a transfer moves a byte and released when it ends (also on error or panic).
//!
//! A word is 0 when free, [`WRITER`] while one transfer writes the page (an exclusive claim),
//! otherwise the number of transfers reading it (shared claims). Taking a claim is one
//! compare-and-swap (`Acquire`); releasing is one store or decrement (`Release`), so whatever a
//! holder wrote to the page happens before the next holder's access. Model-checked with `loom`
//! (`RUSTFLAGS="--cfg loom" cargo test -p kvlayout-pool --release loom`): under every
//! interleaving of the tests below, no page is written while another thread reads or writes it.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicU32, Ordering};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicU32, Ordering};

/// The claim word of a page held by one writer.
pub(crate) const WRITER: u32 = u32::MAX;

/// Claims taken by one transfer, released on drop.
pub(crate) struct Claims<'a> {
    taken: Vec<(&'a AtomicU32, bool)>,
}

impl<'a> Claims<'a> {
    /// No claim yet, room for `n`.
    pub(crate) fn with_capacity(n: usize) -> Claims<'a> {
        Claims {
            taken: Vec::with_capacity(n),
        }
    }

    /// Takes `word` exclusively: only when no one reads or writes its page.
    pub(crate) fn exclusive(&mut self, word: &'a AtomicU32) -> bool {
        let ok = word
            .compare_exchange(0, WRITER, Ordering::Acquire, Ordering::Relaxed)
            .is_ok();
        if ok {
            self.taken.push((word, true));
        }
        ok
    }

    /// Takes `word` shared: only when no one writes its page (any number of readers).
    pub(crate) fn shared(&mut self, word: &'a AtomicU32) -> bool {
        let ok = word
            .fetch_update(Ordering::Acquire, Ordering::Relaxed, |n| {
                // Lazily: `then_some(n + 1)` would compute `WRITER + 1` (an overflow) while a
                // writer holds the page.
                (n < WRITER - 1).then(|| n + 1)
            })
            .is_ok();
        if ok {
            self.taken.push((word, false));
        }
        ok
    }

    fn release(&mut self) {
        for (word, exclusive) in self.taken.drain(..) {
            if exclusive {
                word.store(0, Ordering::Release);
            } else {
                word.fetch_sub(1, Ordering::Release);
            }
        }
    }
}

impl Drop for Claims<'_> {
    fn drop(&mut self) {
        self.release();
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// Regression: a shared claim on a page a writer held computed `u32::MAX + 1` (a panic in
    /// debug builds, found by `conflicting_transfers_are_refused_or_serialized_never_torn`
    /// when a backup met a load on the same host page).
    #[test]
    fn claims_exclude_writers_and_count_readers() {
        let word = AtomicU32::new(0);
        let mut writer = Claims::with_capacity(1);
        assert!(writer.exclusive(&word));
        assert_eq!(word.load(Ordering::SeqCst), WRITER);
        let mut reader = Claims::with_capacity(2);
        assert!(!reader.shared(&word), "a reader got a page a writer holds");
        assert!(!reader.exclusive(&word));
        drop(writer);
        assert_eq!(word.load(Ordering::SeqCst), 0);
        // Two readers (one transfer naming the page twice, or two transfers) then a writer.
        assert!(reader.shared(&word) && reader.shared(&word));
        assert_eq!(word.load(Ordering::SeqCst), 2);
        let mut writer = Claims::with_capacity(1);
        assert!(!writer.exclusive(&word), "a writer got a page being read");
        drop(reader);
        assert_eq!(word.load(Ordering::SeqCst), 0);
        assert!(writer.exclusive(&word));
    }
}

/// `loom` explores every interleaving of the threads below (bounded by its preemption
/// budget). The page is a `loom` cell: a write while another thread holds a reference to it
/// is reported as a data race, so a claim that let two conflicting holders in fails the test.
#[cfg(all(test, loom))]
mod loom_tests {
    use loom::cell::UnsafeCell;
    use loom::sync::Arc;
    use loom::thread;

    use super::*;

    struct Page {
        word: AtomicU32,
        bytes: UnsafeCell<[u8; 2]>,
    }

    /// Writes `v` to both bytes under an exclusive claim; false if refused.
    fn write(page: &Page, v: u8) -> bool {
        let mut c = Claims::with_capacity(1);
        if !c.exclusive(&page.word) {
            return false;
        }
        page.bytes.with_mut(|b| {
            // SAFETY: the exclusive claim is held (loom checks no other access overlaps).
            unsafe { *b = [v, v] }
        });
        true
    }

    /// Reads both bytes under a shared claim: never torn (both bytes from one write).
    fn read(page: &Page) -> Option<[u8; 2]> {
        let mut c = Claims::with_capacity(1);
        if !c.shared(&page.word) {
            return None;
        }
        let got = page.bytes.with(|b| {
            // SAFETY: a shared claim is held; writers are excluded (checked by loom).
            unsafe { *b }
        });
        assert_eq!(got[0], got[1], "torn page");
        Some(got)
    }

    fn page() -> Arc<Page> {
        Arc::new(Page {
            word: AtomicU32::new(0),
            bytes: UnsafeCell::new([0, 0]),
        })
    }

    #[test]
    fn loom_two_writers_and_a_reader_never_overlap() {
        loom::model(|| {
            let p = page();
            let writers: Vec<_> = [1u8, 2]
                .into_iter()
                .map(|v| {
                    let p = Arc::clone(&p);
                    thread::spawn(move || write(&p, v))
                })
                .collect();
            let got = read(&p);
            let wrote: Vec<bool> = writers.into_iter().map(|t| t.join().unwrap()).collect();
            if let Some(g) = got {
                assert!(g == [0, 0] || (g == [1, 1] && wrote[0]) || (g == [2, 2] && wrote[1]));
            }
            // Every claim released: the word is free again.
            assert_eq!(p.word.load(Ordering::SeqCst), 0);
        });
    }

    #[test]
    fn loom_readers_share_and_a_writer_waits_for_both() {
        loom::model(|| {
            let p = page();
            let readers: Vec<_> = (0..2)
                .map(|_| {
                    let p = Arc::clone(&p);
                    thread::spawn(move || read(&p).is_some())
                })
                .collect();
            let wrote = write(&p, 7);
            let read_ok: Vec<bool> = readers.into_iter().map(|t| t.join().unwrap()).collect();
            // A reader is refused only while the writer holds the page.
            if !wrote {
                assert!(read_ok.iter().any(|&r| r));
            }
            assert_eq!(p.word.load(Ordering::SeqCst), 0);
            if wrote {
                assert!(read(&p) == Some([7, 7]));
            }
        });
    }
}
