//! The instruction sets a kernel is compiled for, chosen at run time: every loop is generic
//! over an [`Isa`] type and [`dispatch`] calls it from a function compiled with AVX2 and F16C
//! (and, for `bf16`, AVX-512 BF16) where the CPU has them, else as compiled (the baseline).

/// The instruction set a [`Job`] is compiled for (see [`dispatch`]).
pub(super) trait Isa {
    /// Whether AVX2 and F16C intrinsics may be used.
    const AVX2: bool;
    /// Whether AVX-512 BF16 (with VL, BW and DQ) intrinsics may be used too.
    const BF16: bool = false;
}

/// The target's baseline (SSE2 on x86-64).
pub(super) struct Baseline;
impl Isa for Baseline {
    const AVX2: bool = false;
}

/// AVX2 and F16C (every CPU with AVX2 so far also has F16C; both are checked).
#[cfg(target_arch = "x86_64")]
pub(super) struct Avx2;
#[cfg(target_arch = "x86_64")]
impl Isa for Avx2 {
    const AVX2: bool = true;
}

/// AVX2 and F16C plus AVX-512 BF16, VL, BW and DQ: only for `bf16` jobs ([`Job::BF16`]),
/// so that no other loop is recompiled for 512-bit vectors.
#[cfg(target_arch = "x86_64")]
pub(super) struct Avx2Bf16;
#[cfg(target_arch = "x86_64")]
impl Isa for Avx2Bf16 {
    const AVX2: bool = true;
    const BF16: bool = true;
}

/// One monomorphized kernel invocation, runnable under different target features.
///
/// A trait rather than a closure because `run` must be `#[inline(always)]`: its body has to be
/// generated inside the AVX2 function of [`dispatch`], not called from it.
pub(super) trait Job {
    /// Whether [`dispatch`] may take the AVX-512 BF16 variant ([`Avx2Bf16`]) for this job.
    const BF16: bool = false;
    fn run<I: Isa>(self);
}

/// Whether [`dispatch`] takes the AVX2 variant (tests can force the baseline per thread).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn use_avx2() -> bool {
    #[cfg(test)]
    if super::tests::LEVEL.get() == super::tests::Level::Baseline {
        return false;
    }
    std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("f16c")
}

/// Whether [`dispatch`] takes the AVX-512 BF16 variant for `bf16` jobs (tests can force a
/// lower one).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn use_bf16() -> bool {
    #[cfg(test)]
    if super::tests::LEVEL.get() != super::tests::Level::Best {
        return false;
    }
    use std::arch::is_x86_feature_detected as has;
    use_avx2()
        && has!("avx512f")
        && has!("avx512vl")
        && has!("avx512bw")
        && has!("avx512dq")
        && has!("avx512bf16")
}

/// Runs `job`, compiled with AVX2 and F16C enabled when the CPU has them (x86-64), else as
/// compiled (SSE2 baseline); a `bf16` job (`J::BF16`) with AVX-512 BF16 too where the CPU has
/// it, whose `vcvtne2ps2bf16` rounds sixteen lanes in one instruction.
#[inline(always)]
pub(super) fn dispatch<J: Job>(job: J) {
    #[cfg(target_arch = "x86_64")]
    {
        /// # Safety
        /// The CPU must support every feature enabled here ([`use_bf16`]).
        #[target_feature(enable = "avx2,f16c,avx512f,avx512vl,avx512bw,avx512dq,avx512bf16")]
        unsafe fn with_bf16<J: Job>(job: J) {
            job.run::<Avx2Bf16>()
        }
        if J::BF16 && use_bf16() {
            // SAFETY: `use_bf16` detected every feature `with_bf16` enables.
            unsafe { with_bf16(job) };
            return;
        }
        /// # Safety
        /// The CPU must support AVX2 and F16C.
        #[target_feature(enable = "avx2,f16c")]
        unsafe fn with_avx2<J: Job>(job: J) {
            job.run::<Avx2>()
        }
        if use_avx2() {
            // SAFETY: the CPU supports AVX2 and F16C, which is all `with_avx2` requires.
            unsafe { with_avx2(job) };
            return;
        }
    }
    job.run::<Baseline>()
}
