//! The public C types: result codes, data types, reduction operators, the unique id, the
//! configuration and the opaque handles. Values and layouts follow `nccl.h` (NCCL 2.28).
//!
//! Enumerations that C passes *in* (data type, reduction, a result code handed to
//! `ampcclGetErrorString`) are plain `int` aliases on the Rust side ([`ampcclDataType_raw`],
//! ...), renamed to the C enum type in the header: C may pass any `int`, and an out-of-range
//! value must be an `ampcclInvalidArgument`, not undefined behaviour in Rust.

#![allow(non_camel_case_types, non_upper_case_globals)]

use std::ffi::{c_char, c_int, c_uint};

use ampccl_native::{DataType, ReduceOp};

/// Result of every call (values of `ncclResult_t`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ampcclResult_t {
    ampcclSuccess = 0,
    /// Never returned (there is no CUDA in the host-memory library); kept for NCCL's numbering.
    ampcclUnhandledCudaError = 1,
    ampcclSystemError = 2,
    ampcclInternalError = 3,
    ampcclInvalidArgument = 4,
    ampcclInvalidUsage = 5,
    ampcclRemoteError = 6,
    ampcclInProgress = 7,
    ampcclTimeout = 8,
    ampcclNumResults = 9,
}

/// Element types (values of `ncclDataType_t`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ampcclDataType_t {
    ampcclInt8 = 0,
    ampcclUint8 = 1,
    ampcclInt32 = 2,
    ampcclUint32 = 3,
    ampcclInt64 = 4,
    ampcclUint64 = 5,
    ampcclFloat16 = 6,
    ampcclFloat32 = 7,
    ampcclFloat64 = 8,
    ampcclBfloat16 = 9,
    ampcclNumTypes = 10,
}

/// Reduction operators (values of `ncclRedOp_t`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ampcclRedOp_t {
    ampcclSum = 0,
    ampcclProd = 1,
    ampcclMax = 2,
    ampcclMin = 3,
    ampcclAvg = 4,
    ampcclNumOps = 5,
}

/// A data type as C passes it (`ampcclDataType_t` in the header; any `int` is accepted and
/// checked).
pub type ampcclDataType_raw = c_int;
/// A reduction as C passes it (`ampcclRedOp_t` in the header).
pub type ampcclRedOp_raw = c_int;
/// A result code as C passes it (`ampcclResult_t` in the header).
pub type ampcclResult_raw = c_int;

/// Bytes of [`ampcclUniqueId`].
pub const AMPCCL_UNIQUE_ID_BYTES: usize = 128;
/// Version of this library: `major * 10000 + minor * 100 + patch` (NCCL's encoding).
pub const AMPCCL_VERSION_CODE: c_int = 100;
/// Marks an [`ampcclConfig_t`] built with `AMPCCL_CONFIG_INITIALIZER`.
pub const AMPCCL_API_MAGIC: c_uint = 0xa3cc_1c0f;
/// "Not set" value of an `int` field of [`ampcclConfig_t`] (NCCL's `NCCL_CONFIG_UNDEF_INT`).
pub const AMPCCL_CONFIG_UNDEF_INT: c_int = c_int::MIN;
/// `color` of `ampcclCommSplit` for a rank that joins no new communicator.
pub const AMPCCL_SPLIT_NOCOLOR: c_int = -1;

/// Rendezvous handle (same layout as `ncclUniqueId` and `ampccl::UniqueId`): made by
/// `ampcclGetUniqueId` on one rank and shipped to the others by the application.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ampcclUniqueId {
    pub internal: [c_char; AMPCCL_UNIQUE_ID_BYTES],
}

/// Communicator options (the `ncclConfig_t` fields ampccl uses, and `timeoutS`). Start from
/// `AMPCCL_CONFIG_INITIALIZER` and set what you need.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ampcclConfig_t {
    /// `sizeof(ampcclConfig_t)`, set by the initializer.
    pub size: usize,
    /// `AMPCCL_API_MAGIC`, set by the initializer.
    pub magic: c_uint,
    /// `AMPCCL_VERSION_CODE`, set by the initializer.
    pub version: c_uint,
    /// 1 (default): init calls return when the communicator is ready. 0: they return
    /// `ampcclInProgress` and `ampcclCommGetAsyncError` says when it is ready.
    pub blocking: c_int,
    /// Accepted and ignored (resources are never shared between communicators).
    pub splitShare: c_int,
    /// Name used in log lines (may be NULL).
    pub commName: *const c_char,
    /// Seconds a wait for a peer may last before failing (default: `AMPCCL_TIMEOUT_S`, 300).
    pub timeoutS: c_int,
}

/// Opaque communicator (a handle made by an init or split call).
pub struct ampcclComm {
    pub(crate) shared: std::sync::Arc<crate::comm::CommShared>,
}

/// Opaque stream: an ordered queue of operations (see `ampcclStreamCreate`).
pub struct ampcclStream {
    pub(crate) inner: crate::stream::StreamState,
}

/// Opaque event: a point in a stream (see `ampcclEventRecord`).
pub struct ampcclEvent {
    pub(crate) inner: crate::stream::EventState,
}

/// Communicator handle.
pub type ampcclComm_t = *mut ampcclComm;
/// Stream handle; NULL in a collective call means the communicator's default stream.
pub type ampcclStream_t = *mut ampcclStream;
/// Event handle.
pub type ampcclEvent_t = *mut ampcclEvent;

/// Converts a C data type.
pub(crate) fn data_type(v: ampcclDataType_raw) -> Option<DataType> {
    DataType::from_raw(v)
}

/// Converts a C reduction.
pub(crate) fn reduce_op(v: ampcclRedOp_raw) -> Option<ReduceOp> {
    ReduceOp::from_raw(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{align_of, size_of};

    #[test]
    fn layouts_match_nccl() {
        assert_eq!(size_of::<ampcclUniqueId>(), 128);
        assert_eq!(align_of::<ampcclUniqueId>(), 1);
        assert_eq!(
            size_of::<ampcclUniqueId>(),
            size_of::<ampccl_native::UniqueId>()
        );
        assert_eq!(size_of::<ampcclResult_t>(), size_of::<c_int>());
        assert_eq!(size_of::<ampcclDataType_t>(), size_of::<c_int>());
        assert_eq!(size_of::<ampcclRedOp_t>(), size_of::<c_int>());
        // size_t, 2 x unsigned, 2 x int, pointer, int (+ padding) on LP64.
        assert_eq!(size_of::<ampcclConfig_t>(), 40);
        assert_eq!(align_of::<ampcclConfig_t>(), 8);
        assert_eq!(size_of::<ampcclComm_t>(), size_of::<usize>());
    }

    #[test]
    fn enums_agree_with_the_native_values() {
        for d in DataType::ALL {
            assert_eq!(data_type(d as c_int), Some(d));
        }
        assert_eq!(
            data_type(ampcclDataType_t::ampcclBfloat16 as c_int),
            Some(DataType::Bf16)
        );
        assert_eq!(
            data_type(ampcclDataType_t::ampcclFloat32 as c_int),
            Some(DataType::F32)
        );
        assert_eq!(data_type(ampcclDataType_t::ampcclNumTypes as c_int), None);
        assert_eq!(data_type(99), None);
        assert_eq!(data_type(-1), None);
        assert_eq!(
            reduce_op(ampcclRedOp_t::ampcclAvg as c_int),
            Some(ReduceOp::Avg)
        );
        assert_eq!(
            reduce_op(ampcclRedOp_t::ampcclMin as c_int),
            Some(ReduceOp::Min)
        );
        assert_eq!(reduce_op(ampcclRedOp_t::ampcclNumOps as c_int), None);
    }
}
