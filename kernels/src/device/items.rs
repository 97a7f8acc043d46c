//! Index-list copies ([`Gpu::copy_items`]): items addressed by a [`CopySpec`] and two index
//! lists on the device, checked on the GPU before any byte moves.

use super::{Arg, Gpu, LaunchShape, PendingCheck, SELF_CHECK_MAX_ITEMS, options::group_items};
use crate::copy_spec::{CopySpec, SideSpec};
use crate::cuda_source::{COPY_UNROLL, THREADS_PER_BLOCK};
use crate::device_memory::{DeviceIndices, GpuBytes};
use crate::error::{KernelError, Side};

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct SideParams {
    base: u64,
    layer_stride: u64,
    page_stride: u64,
    item_stride: u64,
    index_limit: u64,
}

/// The copy kernels' parameter struct, mirrored field for field by `CopyParams` in the CUDA
/// source.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct CopyParams {
    src: SideParams,
    dst: SideParams,
    item_bytes: u64,
    items_per_page: u64,
    layer_begin: u64,
    layer_count: u64,
    n_items: u64,
    total_vectors: u64,
    group_items: u64,
    self_check: u64,
}

impl Gpu {
    /// Copies item `src_idx[i]` of `src` to item `dst_idx[i]` of `dst` for every position `i`
    /// and every layer of `spec.layers` (the contract of [`crate::copy_items_cpu`]): checks the
    /// spec and both buffers' lengths on the host, validates the lists on the GPU, copies, and
    /// waits. Out-of-range indices: [`KernelError::IndexOutOfRange`], nothing copied.
    pub fn copy_items(
        &self,
        spec: &CopySpec,
        src: &dyn GpuBytes,
        dst: &mut dyn GpuBytes,
        src_idx: &DeviceIndices,
        dst_idx: &DeviceIndices,
        shape: LaunchShape,
    ) -> Result<(), KernelError> {
        self.copy_items_multi(
            std::slice::from_ref(spec),
            src,
            dst,
            src_idx,
            dst_idx,
            shape,
        )
    }

    /// [`Gpu::copy_items`] for several specs driven by the same index lists (the parts of a
    /// token of a `section_major` page, as [`CopySpec::for_pool_buffer`] plans them): the lists
    /// are validated once, then each part is copied. Every spec must have the same index limits
    /// on each side.
    pub fn copy_items_multi(
        &self,
        specs: &[CopySpec],
        src: &dyn GpuBytes,
        dst: &mut dyn GpuBytes,
        src_idx: &DeviceIndices,
        dst_idx: &DeviceIndices,
        shape: LaunchShape,
    ) -> Result<(), KernelError> {
        // SAFETY: finish() waits for the launches before the borrows end.
        let queued =
            unsafe { self.enqueue_copy_items_multi(specs, src, dst, src_idx, dst_idx, shape) };
        let finished = self.finish();
        queued.and(finished)
    }

    /// [`Gpu::copy_items`] without the wait: enqueues validation and copy and returns.
    ///
    /// # Safety
    /// `src`, `dst` and both lists must stay alive and untouched by the CPU until
    /// [`Gpu::finish`] returns (the GPU may still be reading and writing them).
    pub unsafe fn enqueue_copy_items(
        &self,
        spec: &CopySpec,
        src: &dyn GpuBytes,
        dst: &mut dyn GpuBytes,
        src_idx: &DeviceIndices,
        dst_idx: &DeviceIndices,
        shape: LaunchShape,
    ) -> Result<(), KernelError> {
        // SAFETY: forwarded to the caller.
        unsafe {
            self.enqueue_copy_items_multi(
                std::slice::from_ref(spec),
                src,
                dst,
                src_idx,
                dst_idx,
                shape,
            )
        }
    }

    /// [`Gpu::copy_items_multi`] without the wait.
    ///
    /// Lists of at most [`SELF_CHECK_MAX_ITEMS`] positions are checked inside the first copy
    /// launch (every block checks every index before it writes); longer lists get a separate
    /// validation launch first. Either way no byte moves unless every index is in range.
    ///
    /// # Safety
    /// As [`Gpu::enqueue_copy_items`].
    pub unsafe fn enqueue_copy_items_multi(
        &self,
        specs: &[CopySpec],
        src: &dyn GpuBytes,
        dst: &mut dyn GpuBytes,
        src_idx: &DeviceIndices,
        dst_idx: &DeviceIndices,
        shape: LaunchShape,
    ) -> Result<(), KernelError> {
        let Some(first) = specs.first() else {
            return Ok(());
        };
        let src_limit = first.index_limit(Side::Src)?;
        let dst_limit = first.index_limit(Side::Dst)?;
        for (i, spec) in specs.iter().enumerate() {
            spec.validate()?;
            crate::copy_cpu::check_len("src buffer", spec.src.total_bytes, src.len_bytes())?;
            crate::copy_cpu::check_len("dst buffer", spec.dst.total_bytes, dst.len_bytes())?;
            let limits = (spec.index_limit(Side::Src)?, spec.index_limit(Side::Dst)?);
            if limits != (src_limit, dst_limit) {
                return Err(KernelError::spec(
                    format!("specs[{i}]"),
                    format!(
                        "index limits (src {}, dst {}) differ from specs[0]'s (src {src_limit}, \
                         dst {dst_limit}); parts sharing index lists must share page counts",
                        limits.0, limits.1
                    ),
                ));
            }
        }
        if src_idx.len() != dst_idx.len() {
            return Err(KernelError::Length {
                what: "dst index list (must match the src index list)".to_string(),
                expected: src_idx.len() as u64,
                actual: dst_idx.len() as u64,
                unit: "indices",
            });
        }
        let n = src_idx.len() as u64;
        if n == 0 {
            return Ok(());
        }
        let self_check = n <= SELF_CHECK_MAX_ITEMS;
        if self_check {
            self.note(PendingCheck::Lists(
                src_idx.host.clone(),
                src_limit,
                dst_idx.host.clone(),
                dst_limit,
            ))?;
        } else {
            self.enqueue_validate(src_idx, src_limit, dst_idx, dst_limit, shape)?;
        }
        for (i, spec) in specs.iter().enumerate() {
            // Only the first part checks; later parts see its error record and return.
            self.launch_copy(
                spec,
                src,
                dst,
                src_idx,
                dst_idx,
                shape,
                self_check && i == 0,
            )?;
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn launch_copy(
        &self,
        spec: &CopySpec,
        src: &dyn GpuBytes,
        dst: &mut dyn GpuBytes,
        src_idx: &DeviceIndices,
        dst_idx: &DeviceIndices,
        shape: LaunchShape,
        self_check: bool,
    ) -> Result<(), KernelError> {
        let n = src_idx.len() as u64;
        let src_limit = spec.index_limit(Side::Src)?;
        let dst_limit = spec.index_limit(Side::Dst)?;
        let (src_addr, dst_addr) = (src.device_address(), dst.device_address());
        let width = spec.vector_bytes(src_addr, dst_addr);
        let vectors_per_item = spec.item_bytes / width;
        let total_vectors = n
            .checked_mul(spec.layer_count())
            .and_then(|x| x.checked_mul(vectors_per_item))
            .ok_or_else(|| KernelError::spec("items", "overflow: items * layers * vectors"))?;
        let grid = self.grid(shape, total_vectors.div_ceil(COPY_UNROLL));
        let grid_threads = u64::from(grid) * u64::from(THREADS_PER_BLOCK);
        let fits_u32 = |x: u64| x < (1u64 << 32);
        let use_u32 = fits_u32(total_vectors + grid_threads * COPY_UNROLL)
            && fits_u32(src_limit)
            && fits_u32(dst_limit);
        let k = self.kernels()?;
        let (_, f32_, f64_) = k
            .copy
            .iter()
            .find(|(w, _, _)| *w == width)
            .ok_or_else(|| KernelError::Unsupported(format!("vector width {width}")))?;
        let f = if use_u32 { f32_ } else { f64_ };
        let side = |s: &SideSpec, limit: u64| SideParams {
            base: s.base_bytes,
            layer_stride: s.layer_stride_bytes,
            page_stride: s.page_stride_bytes,
            item_stride: s.item_stride_bytes,
            index_limit: limit,
        };
        let params = CopyParams {
            src: side(&spec.src, src_limit),
            dst: side(&spec.dst, dst_limit),
            item_bytes: spec.item_bytes,
            items_per_page: spec.items_per_page,
            layer_begin: spec.layers.start,
            layer_count: spec.layer_count(),
            n_items: n,
            total_vectors,
            group_items: group_items(spec, n, shape.order),
            self_check: u64::from(self_check),
        };
        let args = [
            Arg::Copy(&params),
            Arg::Word(src_addr),
            Arg::Word(dst_addr),
            Arg::Word(src_idx.address()),
            Arg::Word(dst_idx.address()),
            Arg::Word(self.err_address()),
        ];
        // SAFETY: arguments match the copy kernels' signature; spec.validate() and check_len
        // bound every address of every in-range index by both buffers' lengths, and the kernel
        // only copies when every index was found in range (validation launch or self-check).
        unsafe { self.launch(f, "cuLaunchKernel(copy_items)", grid, &args) }
    }
}
