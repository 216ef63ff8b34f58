//! GPU reduction kernels for every NCCL data type × reduction operator, generated as CUDA C++
//! source, compiled at run time with NVRTC for the device's architecture and loaded into its
//! context.
//!
//! One kernel `ampccl_reduce_<dtype>_<op>(out, srcs, nsrc, n)` computes
//! `out[i] = srcs[0][i] ⊕ srcs[1][i] ⊕ … ⊕ srcs[nsrc-1][i]` strictly in source order, rounding to
//! the element type after every step, so every rank that reduces the same sources in the same
//! (rank) order gets bit-identical results. Semantics follow NCCL: integers wrap (arithmetic is
//! done on the unsigned type, so there is no undefined signed overflow); half and bfloat16 are
//! computed in `float` and rounded to nearest-even after each step; `avg` multiplies each
//! floating-point input by `1/nsrc` before summing (NCCL's pre-multiplied sum) and divides the
//! integer sum by `nsrc` (NCCL's sum-then-divide). The source needs no headers (half/bfloat16
//! conversions are single PTX instructions), so it compiles with a bare NVRTC.

use std::ffi::{CString, c_char, c_void};
use std::sync::OnceLock;

use cudarc::driver::sys;
use cudarc::nvrtc::sys as nvrtc;

use super::{Device, StreamRef, check};
use crate::{DataType, Error, ReduceOp, Result};

/// Most sources one launch reduces (a kernel parameter holds this many pointers).
pub const MAX_SOURCES: usize = 8;

/// Threads per block of a reduction launch.
const BLOCK: u32 = 512;
/// Upper bound on blocks per launch (a grid-stride loop covers the rest). The kernel runs
/// next to NCCL's: on 2×H200, 256 blocks left NCCL's part faster than 1024 (a split allreduce
/// of 1 GiB at alpha 0.92 gained 7.2 % instead of 5.8 %), while 32 made the kernel itself the
/// PCIe path's bottleneck.
const MAX_BLOCKS: u64 = 256;

/// The kernel source: shared helpers, then one instantiation per data type × operator.
fn source() -> String {
    let mut s = String::from(HELPERS);
    for dt in DataType::ALL {
        for op in ReduceOp::ALL {
            s.push_str(&format!(
                "extern \"C\" __global__ void {name}(void* out, Srcs s, int nsrc, unsigned long long n) \
                 {{ reduce_kernel<{ty}, {opty}>(({ty}*)out, s, nsrc, n); }}\n",
                name = kernel_name(dt, op),
                ty = cuda_type(dt),
                opty = op_type(op),
            ));
        }
    }
    s
}

const HELPERS: &str = r#"
typedef unsigned long long u64;
struct Srcs { const void* p[8]; };
struct h16 { unsigned short x; };
struct b16 { unsigned short x; };

// Compute type and conversions: 16-bit floats compute in float, everything else natively.
template <typename T> struct Num { typedef T C; typedef T U;
  static __device__ __forceinline__ C up(T v) { return v; }
  static __device__ __forceinline__ T down(C v) { return v; } };
#define UNSIGNED_AS(T, UT) template <> struct Num<T> { typedef T C; typedef UT U; \
  static __device__ __forceinline__ C up(T v) { return v; } \
  static __device__ __forceinline__ T down(C v) { return v; } };
UNSIGNED_AS(signed char, unsigned char)
UNSIGNED_AS(int, unsigned int)
UNSIGNED_AS(long long, unsigned long long)
template <> struct Num<h16> { typedef float C; typedef float U;
  static __device__ __forceinline__ float up(h16 v) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v.x)); return f; }
  static __device__ __forceinline__ h16 down(float f) { h16 v; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(v.x) : "f"(f)); return v; } };
template <> struct Num<b16> { typedef float C; typedef float U;
  static __device__ __forceinline__ float up(b16 v) { return __uint_as_float(((unsigned)v.x) << 16); }
  static __device__ __forceinline__ b16 down(float f) { b16 v; asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(v.x) : "f"(f)); return v; } };

template <typename T> __device__ __forceinline__ bool is_float() { return false; }
template <> __device__ __forceinline__ bool is_float<float>() { return true; }
template <> __device__ __forceinline__ bool is_float<double>() { return true; }
template <> __device__ __forceinline__ bool is_float<h16>() { return true; }
template <> __device__ __forceinline__ bool is_float<b16>() { return true; }

// Operators on the compute type C; U is the type the arithmetic wraps in.
struct OpSum { template <typename C, typename U> static __device__ __forceinline__ C f(C a, C b) { return (C)((U)a + (U)b); } };
struct OpProd { template <typename C, typename U> static __device__ __forceinline__ C f(C a, C b) { return (C)((U)a * (U)b); } };
struct OpMax { template <typename C, typename U> static __device__ __forceinline__ C f(C a, C b) { return a < b ? b : a; } };
struct OpMin { template <typename C, typename U> static __device__ __forceinline__ C f(C a, C b) { return b < a ? b : a; } };
struct OpAvg { template <typename C, typename U> static __device__ __forceinline__ C f(C a, C b) { return (C)((U)a + (U)b); } };

template <typename T, typename Op> struct Pre { static __device__ __forceinline__ typename Num<T>::C f(T v, int) { return Num<T>::up(v); } };
template <typename T> struct Pre<T, OpAvg> { static __device__ __forceinline__ typename Num<T>::C f(T v, int nsrc) {
  typedef typename Num<T>::C C;
  if (is_float<T>()) return Num<T>::up(Num<T>::down(Num<T>::up(v) * (C)(1.0 / nsrc)));
  return Num<T>::up(v); } };
template <typename T, typename Op> struct Post { static __device__ __forceinline__ typename Num<T>::C f(typename Num<T>::C v, int) { return v; } };
template <typename T> struct Post<T, OpAvg> { static __device__ __forceinline__ typename Num<T>::C f(typename Num<T>::C v, int nsrc) {
  if (is_float<T>()) return v;
  return (typename Num<T>::C)(v / (typename Num<T>::C)nsrc); } };

template <typename T, typename Op>
__device__ __forceinline__ void reduce_kernel(T* out, Srcs s, int nsrc, u64 n) {
  typedef Num<T> N; typedef typename N::C C; typedef typename N::U U;
  u64 stride = (u64)gridDim.x * blockDim.x;
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    C acc = Pre<T, Op>::f(((const T*)s.p[0])[i], nsrc);
    for (int k = 1; k < nsrc; ++k)
      acc = N::up(N::down(Op::template f<C, U>(acc, Pre<T, Op>::f(((const T*)s.p[k])[i], nsrc))));
    out[i] = N::down(Post<T, Op>::f(acc, nsrc));
  }
}
"#;

fn cuda_type(dt: DataType) -> &'static str {
    match dt {
        DataType::I8 => "signed char",
        DataType::U8 => "unsigned char",
        DataType::I32 => "int",
        DataType::U32 => "unsigned int",
        DataType::I64 => "long long",
        DataType::U64 => "unsigned long long",
        DataType::F16 => "h16",
        DataType::F32 => "float",
        DataType::F64 => "double",
        DataType::Bf16 => "b16",
    }
}

fn op_type(op: ReduceOp) -> &'static str {
    match op {
        ReduceOp::Sum => "OpSum",
        ReduceOp::Prod => "OpProd",
        ReduceOp::Max => "OpMax",
        ReduceOp::Min => "OpMin",
        ReduceOp::Avg => "OpAvg",
    }
}

fn kernel_name(dt: DataType, op: ReduceOp) -> String {
    format!("ampccl_reduce_{}_{}", dt.name(), op.name())
}

/// Opens NVRTC. `cudarc` looks the library up by name only; when that fails, look next to the
/// CUDA runtime this process already loaded (pip wheels keep `libnvrtc` beside `libcudart`) and
/// in `$AMPCCL_NVRTC` / `/usr/local/cuda/lib64`, and load that file globally so the lookup by
/// name then finds it.
fn nvrtc_available() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    *PRESENT.get_or_init(|| {
        // SAFETY: only tries to open the library.
        if unsafe { nvrtc::is_culib_present() } {
            return true;
        }
        for path in nvrtc_candidates() {
            let Ok(c) = CString::new(path.as_str()) else {
                continue;
            };
            // SAFETY: dlopen of a shared library by path; the handle is kept for the process.
            let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
            // SAFETY: as above.
            if !h.is_null() && unsafe { nvrtc::is_culib_present() } {
                tracing::debug!(path, "NVRTC loaded");
                return true;
            }
        }
        false
    })
}

fn nvrtc_candidates() -> Vec<String> {
    let mut dirs: Vec<String> = std::env::var("AMPCCL_NVRTC").into_iter().collect();
    if let Ok(maps) = std::fs::read_to_string("/proc/self/maps") {
        for path in maps.lines().filter_map(|l| l.split_whitespace().nth(5)) {
            if (path.contains("libcudart.so") || path.contains("libnccl.so"))
                && let Some(dir) = std::path::Path::new(path).parent()
            {
                dirs.push(dir.display().to_string());
                dirs.push(dir.join("../../cu13/lib").display().to_string());
            }
        }
    }
    dirs.push("/usr/local/cuda/lib64".into());
    let mut out = Vec::new();
    for d in dirs {
        if d.ends_with(".so") || d.contains(".so.") {
            out.push(d);
            continue;
        }
        for name in ["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"] {
            let p = std::path::Path::new(&d).join(name);
            if p.exists() {
                out.push(p.display().to_string());
            }
        }
    }
    out
}

fn nvrtc_check(res: nvrtc::nvrtcResult, what: &str) -> Result<()> {
    if res == nvrtc::nvrtcResult::NVRTC_SUCCESS {
        Ok(())
    } else {
        Err(Error::System(format!("{what}: {res:?}")))
    }
}

/// Compiles the kernel source to PTX for compute capability `cc` (e.g. 90).
fn compile_ptx(cc: i32) -> Result<Vec<u8>> {
    if !nvrtc_available() {
        return Err(Error::System(
            "NVRTC (libnvrtc.so) is not available; set AMPCCL_NVRTC to its path".into(),
        ));
    }
    let src = CString::new(source()).map_err(|e| Error::Internal(e.to_string()))?;
    let name = CString::new("ampccl_reduce.cu").map_err(|e| Error::Internal(e.to_string()))?;
    let mut prog: nvrtc::nvrtcProgram = std::ptr::null_mut();
    // SAFETY: valid NUL-terminated strings; no headers.
    nvrtc_check(
        unsafe {
            nvrtc::nvrtcCreateProgram(
                &mut prog,
                src.as_ptr(),
                name.as_ptr(),
                0,
                std::ptr::null(),
                std::ptr::null(),
            )
        },
        "nvrtcCreateProgram",
    )?;
    let result = (|| {
        let arch = CString::new(format!("--gpu-architecture=compute_{cc}"))
            .map_err(|e| Error::Internal(e.to_string()))?;
        let std = CString::new("--std=c++17").map_err(|e| Error::Internal(e.to_string()))?;
        let opts: [*const c_char; 2] = [arch.as_ptr(), std.as_ptr()];
        // SAFETY: `prog` is live; options are valid C strings.
        let compiled =
            unsafe { nvrtc::nvrtcCompileProgram(prog, opts.len() as i32, opts.as_ptr()) };
        if compiled != nvrtc::nvrtcResult::NVRTC_SUCCESS {
            let mut len = 0usize;
            // SAFETY: out-parameter calls on a live program.
            unsafe { nvrtc::nvrtcGetProgramLogSize(prog, &mut len) };
            let mut log = vec![0u8; len.max(1)];
            // SAFETY: `log` holds `len` bytes.
            unsafe { nvrtc::nvrtcGetProgramLog(prog, log.as_mut_ptr().cast()) };
            let log = String::from_utf8_lossy(&log);
            return Err(Error::System(format!(
                "NVRTC compile failed: {compiled:?}: {}",
                log.trim_end_matches('\0')
            )));
        }
        let mut len = 0usize;
        // SAFETY: out-parameter call on a compiled program.
        nvrtc_check(
            unsafe { nvrtc::nvrtcGetPTXSize(prog, &mut len) },
            "nvrtcGetPTXSize",
        )?;
        let mut ptx = vec![0u8; len];
        // SAFETY: `ptx` holds `len` bytes (NUL included).
        nvrtc_check(
            unsafe { nvrtc::nvrtcGetPTX(prog, ptx.as_mut_ptr().cast()) },
            "nvrtcGetPTX",
        )?;
        Ok(ptx)
    })();
    // SAFETY: destroys the program created above.
    unsafe { nvrtc::nvrtcDestroyProgram(&mut prog) };
    result
}

/// The reduction kernels loaded into one device's primary context.
pub struct ReduceKernels {
    module: sys::CUmodule,
    functions: Vec<sys::CUfunction>,
}

// SAFETY: module and function handles may be used from any thread once loaded.
unsafe impl Send for ReduceKernels {}
// SAFETY: as above; launching is thread-safe in the driver.
unsafe impl Sync for ReduceKernels {}

impl ReduceKernels {
    /// Compiles and loads every kernel for `device`; its context must be current.
    pub fn load(device: &Device) -> Result<ReduceKernels> {
        let ptx = compile_ptx(device.compute_capability()?)?;
        let mut module: sys::CUmodule = std::ptr::null_mut();
        // SAFETY: `ptx` is NUL-terminated PTX text.
        check(
            unsafe { sys::cuModuleLoadData(&mut module, ptx.as_ptr().cast()) },
            "cuModuleLoadData",
        )?;
        let mut functions = Vec::with_capacity(DataType::ALL.len() * ReduceOp::ALL.len());
        for dt in DataType::ALL {
            for op in ReduceOp::ALL {
                let name = CString::new(kernel_name(dt, op))
                    .map_err(|e| Error::Internal(e.to_string()))?;
                let mut f: sys::CUfunction = std::ptr::null_mut();
                // SAFETY: `module` is loaded; `name` is a kernel it defines.
                check(
                    unsafe { sys::cuModuleGetFunction(&mut f, module, name.as_ptr()) },
                    "cuModuleGetFunction",
                )?;
                functions.push(f);
            }
        }
        Ok(ReduceKernels { module, functions })
    }

    /// `ALL` lists data types and operators in the order of their NCCL values, which is the
    /// order `load` fills `functions` in (checked by a test).
    fn function(&self, dt: DataType, op: ReduceOp) -> sys::CUfunction {
        self.functions[dt as usize * ReduceOp::ALL.len() + op as usize]
    }

    /// Enqueues `out[i] = srcs[0][i] ⊕ … ⊕ srcs[k-1][i]` for `i < count` on `stream`.
    ///
    /// # Safety
    /// `out` and every source must be device-accessible addresses of at least `count` elements
    /// of `dt`, valid until the stream passes the kernel; `out` may equal a source (elementwise).
    pub unsafe fn launch(
        &self,
        stream: StreamRef,
        dt: DataType,
        op: ReduceOp,
        out: u64,
        srcs: &[u64],
        count: usize,
    ) -> Result<()> {
        if srcs.is_empty() || srcs.len() > MAX_SOURCES {
            return Err(Error::InvalidArgument(format!(
                "{} reduction sources (1..={MAX_SOURCES})",
                srcs.len()
            )));
        }
        if count == 0 {
            return Ok(());
        }
        let mut table = [0u64; MAX_SOURCES];
        table[..srcs.len()].copy_from_slice(srcs);
        let mut out = out;
        let mut nsrc = srcs.len() as i32;
        let mut n = count as u64;
        let mut params: [*mut c_void; 4] = [
            (&mut out as *mut u64).cast(),
            (&mut table as *mut [u64; MAX_SOURCES]).cast(),
            (&mut nsrc as *mut i32).cast(),
            (&mut n as *mut u64).cast(),
        ];
        let blocks = n.div_ceil(u64::from(BLOCK)).min(MAX_BLOCKS) as u32;
        // SAFETY: the parameters match the kernel's signature (pointer, 8-pointer struct, int,
        // u64) and live until the call returns (the driver copies them); the caller guarantees
        // the memory.
        check(
            unsafe {
                sys::cuLaunchKernel(
                    self.function(dt, op),
                    blocks,
                    1,
                    1,
                    BLOCK,
                    1,
                    1,
                    0,
                    stream.0,
                    params.as_mut_ptr(),
                    std::ptr::null_mut(),
                )
            },
            "cuLaunchKernel(reduce)",
        )
    }
}

impl Drop for ReduceKernels {
    fn drop(&mut self) {
        // SAFETY: loaded in `load`; the owner keeps the context current when dropping.
        unsafe { sys::cuModuleUnload(self.module) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn source_names_every_kernel_once() {
        let src = source();
        for dt in DataType::ALL {
            for op in ReduceOp::ALL {
                let name = kernel_name(dt, op);
                assert_eq!(src.matches(&format!(" {name}(")).count(), 1, "{name}");
            }
        }
    }

    #[test]
    fn kernel_table_is_indexed_by_nccl_values() {
        for (i, dt) in DataType::ALL.into_iter().enumerate() {
            assert_eq!(dt as usize, i);
        }
        for (i, op) in ReduceOp::ALL.into_iter().enumerate() {
            assert_eq!(op as usize, i);
        }
    }

    #[test]
    fn without_a_driver_nothing_panics() {
        if available_for_test() {
            return;
        }
        assert!(Device::new(0).is_err());
        assert!(super::super::CudaStream::new().is_err());
    }

    fn available_for_test() -> bool {
        super::super::available()
    }
}
