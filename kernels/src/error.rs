//! Errors of the kernels crate: one typed error for every refusal, never a panic.

use kvlayout_core::{GeometryError, Mismatch};

/// Which side of a copy a problem concerns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// The side bytes are read from.
    Src,
    /// The side bytes are written to.
    Dst,
}

impl std::fmt::Display for Side {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Side::Src => "src",
            Side::Dst => "dst",
        })
    }
}

/// Everything a kernel call (or its CPU reference) can refuse or fail with.
///
/// A refusal (`Spec`, `Length`, `IndexOutOfRange`, `Incompatible`, `Geometry`, `Unsupported`)
/// moves no byte: both sides are left exactly as they were.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum KernelError {
    /// No CUDA driver library (libcuda) could be loaded on this machine; probed before cudarc
    /// is touched, so this is an error and never a panic. Use a CPU reference instead.
    #[error("no CUDA driver: libcuda could not be loaded on this machine")]
    NoDriver,
    /// No NVRTC library (libnvrtc) could be loaded, so kernels cannot be compiled.
    #[error("no NVRTC: libnvrtc could not be loaded on this machine")]
    NoNvrtc,
    /// A CUDA driver call failed (`call` names it).
    #[error("CUDA driver error in {call}: {message}")]
    Driver {
        /// The driver operation.
        call: &'static str,
        /// The driver's error text.
        message: String,
    },
    /// NVRTC failed to compile the kernels (`log` is the compiler log).
    #[error("NVRTC failed to compile the kernels for {arch}: {log}")]
    Compile {
        /// Target architecture (`sm_90`).
        arch: String,
        /// Compiler log or error.
        log: String,
    },
    /// The device cannot run a kernel (e.g. the fp8 conversion needs compute capability 8.9).
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// A copy or quantizer description breaks a rule; `field` names it, `problem` gives the
    /// rule and both values.
    #[error("{field}: {problem}")]
    Spec {
        /// The offending field (`dst.page_stride_bytes`).
        field: String,
        /// The rule broken, with the values involved.
        problem: String,
    },
    /// A buffer or list has the wrong length for the description it is used with.
    #[error("{what}: expected {expected} {unit}, got {actual}")]
    Length {
        /// Which buffer or list.
        what: String,
        /// Required length.
        expected: u64,
        /// Actual length.
        actual: u64,
        /// Unit of both numbers (`bytes`, `indices`).
        unit: &'static str,
    },
    /// An index list names an item past the end of a side. Found by the validation pass (in a
    /// kernel on the GPU), before any byte is moved: the whole call moved nothing.
    #[error(
        "index out of range at position {position}: src index {src_index} (limit {src_limit}), \
         dst index {dst_index} (limit {dst_limit}); {bad_count} bad position(s); nothing was copied"
    )]
    IndexOutOfRange {
        /// First bad position in the lists.
        position: u64,
        /// Source index at that position.
        src_index: u64,
        /// Source items available (`pages * items_per_page`).
        src_limit: u64,
        /// Destination index at that position.
        dst_index: u64,
        /// Destination items available.
        dst_limit: u64,
        /// Number of bad positions found.
        bad_count: u64,
    },
    /// A copy run reaches outside the source or destination region. Found before any byte is
    /// moved (by the validation pass on the GPU): the whole call moved nothing.
    #[error(
        "run {position} ({} bytes from src offset {} to dst offset {}) reaches outside the \
         {src_len_bytes}-byte src or the {dst_len_bytes}-byte dst; {bad_count} bad run(s); \
         nothing was copied",
        run.len_bytes, run.src_offset_bytes, run.dst_offset_bytes
    )]
    RunOutOfRange {
        /// First bad position in the run list.
        position: u64,
        /// The run at that position.
        run: crate::copy_runs::ByteRun,
        /// Source region length.
        src_len_bytes: u64,
        /// Destination region length.
        dst_len_bytes: u64,
        /// Number of bad runs found.
        bad_count: u64,
    },
    /// Two pool geometries cannot exchange pages (the field-by-field diff).
    #[error("pools are not compatible: {0}")]
    Incompatible(String),
    /// A pool geometry is invalid or an offset could not be computed.
    #[error("geometry: {0}")]
    Geometry(String),
}

impl KernelError {
    /// A [`KernelError::Spec`] on `field`.
    pub fn spec(field: impl Into<String>, problem: impl Into<String>) -> KernelError {
        KernelError::Spec {
            field: field.into(),
            problem: problem.into(),
        }
    }
}

impl From<GeometryError> for KernelError {
    fn from(e: GeometryError) -> KernelError {
        KernelError::Geometry(e.to_string())
    }
}

impl From<Mismatch> for KernelError {
    fn from(e: Mismatch) -> KernelError {
        KernelError::Incompatible(e.to_string())
    }
}
