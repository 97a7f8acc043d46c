//! Host time the chooser spends in each of its steps, summed over calls (feature
//! `host-timing`, which `scripts/gpu-check.sh build` turns on for `gpu_bench`, to tell a
//! host-bound transfer from a GPU-bound one): without the feature every timer is empty and
//! [`take_ns`] gives zeros.

/// A step of the chooser's host path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// The whole call (`Gpu::enqueue_transfer_runs`).
    Call = 0,
    /// The one pass over the list (`scan_runs`).
    Scan = 1,
    /// Waiting for a run-ring slot whose kernel has not finished.
    RingWait = 2,
    /// Writing a run list into a ring slot's pinned host half.
    ListWrite = 3,
    /// The driver calls of a ring slot (copy, events, launch).
    Driver = 4,
    /// Putting a token list in host order (`in_key_buckets`).
    Order = 5,
}

/// Steps in [`take_ns`]'s array, in [`Step`] order.
pub const STEPS: usize = 6;

#[cfg(feature = "host-timing")]
mod imp {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::Instant;

    use super::{STEPS, Step};

    static NS: [AtomicU64; STEPS] = [const { AtomicU64::new(0) }; STEPS];

    /// Adds the time from its creation to its drop to its step.
    pub(crate) struct Timer(Step, Instant);

    pub(crate) fn start(step: Step) -> Timer {
        Timer(step, Instant::now())
    }

    impl Drop for Timer {
        fn drop(&mut self) {
            let ns = u64::try_from(self.1.elapsed().as_nanos()).unwrap_or(u64::MAX);
            NS[self.0 as usize].fetch_add(ns, Ordering::Relaxed);
        }
    }

    pub fn take_ns() -> [u64; STEPS] {
        std::array::from_fn(|i| NS[i].swap(0, Ordering::Relaxed))
    }
}

#[cfg(not(feature = "host-timing"))]
mod imp {
    use super::{STEPS, Step};

    /// Nothing timed without the feature.
    pub(crate) struct Timer;

    pub(crate) fn start(_step: Step) -> Timer {
        Timer
    }

    pub fn take_ns() -> [u64; STEPS] {
        [0; STEPS]
    }
}

pub(crate) use imp::start;
/// Nanoseconds spent in each [`Step`] since the last call, then reset (zeros without the
/// feature `host-timing`).
pub use imp::take_ns;
