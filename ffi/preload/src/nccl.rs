//! The slice of NCCL's C API the interposer speaks: result codes, the unique id, data types and
//! reduction operators (values from `nccl.h`), and the signatures of the functions it wraps or
//! calls.

use std::ffi::{c_int, c_void};

use ampccl_runtime::{DataType, ReduceOp};

/// `ncclResult_t`.
pub type NcclResult = c_int;
pub const SUCCESS: NcclResult = 0;
pub const UNHANDLED_CUDA_ERROR: NcclResult = 1;
pub const SYSTEM_ERROR: NcclResult = 2;
pub const INTERNAL_ERROR: NcclResult = 3;
pub const REMOTE_ERROR: NcclResult = 6;
pub const IN_PROGRESS: NcclResult = 7;

/// `ncclComm_t`.
pub type Comm = *mut c_void;
/// `cudaStream_t`.
pub type Stream = *mut c_void;

/// `ncclUniqueId`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct UniqueId {
    pub internal: [u8; 128],
}

/// `NCCL_SPLIT_NOCOLOR`.
pub const SPLIT_NOCOLOR: c_int = -1;

/// The data type of an `ncclDataType_t` the PCIe path can carry (NCCL's fp8 types and any
/// later addition are left to NCCL alone).
pub fn dtype(v: c_int) -> Option<DataType> {
    DataType::from_raw(v)
}

/// The operator of an `ncclRedOp_t` the PCIe path can compute (user-defined pre-multiplied
/// sums, values ≥ 5, are left to NCCL alone).
pub fn redop(v: c_int) -> Option<ReduceOp> {
    ReduceOp::from_raw(v)
}

pub type InitRank = unsafe extern "C" fn(*mut Comm, c_int, UniqueId, c_int) -> NcclResult;
pub type InitRankConfig =
    unsafe extern "C" fn(*mut Comm, c_int, UniqueId, c_int, *mut c_void) -> NcclResult;
pub type InitRankScalable =
    unsafe extern "C" fn(*mut Comm, c_int, c_int, c_int, *mut UniqueId, *mut c_void) -> NcclResult;
pub type InitAll = unsafe extern "C" fn(*mut Comm, c_int, *const c_int) -> NcclResult;
pub type Split = unsafe extern "C" fn(Comm, c_int, c_int, *mut Comm, *mut c_void) -> NcclResult;
pub type CommFn = unsafe extern "C" fn(Comm) -> NcclResult;
pub type CommInt = unsafe extern "C" fn(Comm, *mut c_int) -> NcclResult;
pub type AsyncError = unsafe extern "C" fn(Comm, *mut NcclResult) -> NcclResult;
pub type GroupFn = unsafe extern "C" fn() -> NcclResult;
pub type AllReduce = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    c_int,
    c_int,
    Comm,
    Stream,
) -> NcclResult;
pub type Gather =
    unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, Comm, Stream) -> NcclResult;
pub type Broadcast = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    c_int,
    c_int,
    Comm,
    Stream,
) -> NcclResult;
pub type Reduce = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    c_int,
    c_int,
    c_int,
    Comm,
    Stream,
) -> NcclResult;
pub type Send =
    unsafe extern "C" fn(*const c_void, usize, c_int, c_int, Comm, Stream) -> NcclResult;
pub type Recv = unsafe extern "C" fn(*mut c_void, usize, c_int, c_int, Comm, Stream) -> NcclResult;
