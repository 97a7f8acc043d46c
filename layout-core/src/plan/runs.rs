//! A list of runs that merges each new run into the last when both sides continue it.

use super::{PlanError, Run};

pub(super) struct RunList {
    runs: Vec<Run>,
}

impl RunList {
    pub(super) fn with_capacity(n: usize) -> RunList {
        RunList {
            runs: Vec::with_capacity(n),
        }
    }

    /// Appends `run`, or extends the last run when `run` starts where it ends on both sides.
    pub(super) fn push(&mut self, run: Run) -> Result<(), PlanError> {
        if run.len_bytes == 0 {
            return Ok(());
        }
        if let Some(last) = self.runs.last_mut()
            && last.src_offset_bytes.checked_add(last.len_bytes) == Some(run.src_offset_bytes)
            && last.dst_offset_bytes.checked_add(last.len_bytes) == Some(run.dst_offset_bytes)
        {
            // Both ends lie inside one region, whose length fits in 64 bits.
            last.len_bytes =
                last.len_bytes
                    .checked_add(run.len_bytes)
                    .ok_or(PlanError::Overflow {
                        buffer: String::new(),
                        what: "merged run length",
                    })?;
            return Ok(());
        }
        self.runs.push(run);
        Ok(())
    }

    pub(super) fn finish(self) -> Vec<Run> {
        self.runs
    }

    /// The runs in source order, merged again (for orders the loops could not follow).
    pub(super) fn finish_sorted(mut self) -> Result<Vec<Run>, PlanError> {
        self.runs
            .sort_unstable_by_key(|r| (r.src_offset_bytes, r.dst_offset_bytes));
        let mut out = RunList::with_capacity(self.runs.len());
        for r in self.runs {
            out.push(r)?;
        }
        Ok(out.finish())
    }
}
