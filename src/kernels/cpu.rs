//! Which of our hand-written SIMD paths this CPU may run, decided once per process.
//!
//! Each kernel with an instruction-set-specific path asks here instead of calling
//! `is_x86_feature_detected!` itself, so one switch turns every such path off:
//! `STREAMFUSE_PORTABLE=1` in the environment (read once, at the first question) makes
//! every function here answer `false`, and the kernels run their portable loops. CI
//! runs the test suite once that way, so the portable paths are held to the same tests
//! as the fast ones on a machine that has every feature.

use std::sync::OnceLock;

/// The features our kernels use, as detected (and possibly switched off).
#[derive(Clone, Copy, Debug, Default)]
struct Features {
    avx512: bool,
    avx512_bf16: bool,
    avx512_vnni: bool,
    amx_bf16: bool,
    amx_int8: bool,
}

fn features() -> Features {
    static FEATURES: OnceLock<Features> = OnceLock::new();
    *FEATURES.get_or_init(|| {
        if forced_portable() {
            return Features::default();
        }
        detect()
    })
}

#[cfg(target_arch = "x86_64")]
fn detect() -> Features {
    use std::arch::is_x86_feature_detected as has;
    let avx512 = has!("avx512f") && has!("avx512vl") && has!("avx512bw") && has!("fma");
    let (amx_bf16, amx_int8) = if avx512 {
        amx::enable()
    } else {
        (false, false)
    };
    Features {
        avx512,
        avx512_bf16: avx512 && has!("avx512bf16"),
        avx512_vnni: avx512 && has!("avx512vnni"),
        amx_bf16: amx_bf16 && has!("avx512bf16"),
        amx_int8: amx_int8 && has!("avx512vnni"),
    }
}

/// AMX's tile registers: asked of the CPU and, on Linux, of the kernel.
///
/// `is_x86_feature_detected!` does not answer for AMX on stable Rust, so the CPUID
/// bits are read here. A process may use the tile registers only after asking the
/// kernel for them (`arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA)`: the kernel then
/// saves their 8 KiB of state on context switches); without that, the first tile
/// instruction faults. The request covers every thread of the process and is made
/// once, with the rest of the detection.
#[cfg(target_arch = "x86_64")]
mod amx {
    /// Whether AMX-BF16 and AMX-INT8 may run: CPUID reports AMX-TILE and the kernel
    /// granted the tile state to this process, and CPUID reports each.
    pub(super) fn enable() -> (bool, bool) {
        // CPUID leaf 7, sub-leaf 0: EDX bit 22 is AMX-BF16, bit 24 AMX-TILE, bit 25
        // AMX-INT8.
        let leaf7 = std::arch::x86_64::__cpuid_count(7, 0);
        let bit = |b: u32| leaf7.edx & (1 << b) != 0;
        let tiles = bit(24) && request_tile_state();
        (tiles && bit(22), tiles && bit(25))
    }

    #[cfg(target_os = "linux")]
    fn request_tile_state() -> bool {
        extern "C" {
            /// The C library's system-call entry (glibc and musl both have it).
            fn syscall(number: std::ffi::c_long, ...) -> std::ffi::c_long;
        }
        const SYS_ARCH_PRCTL: std::ffi::c_long = 158;
        const ARCH_REQ_XCOMP_PERM: std::ffi::c_long = 0x1023;
        const XFEATURE_XTILEDATA: std::ffi::c_long = 18;
        // SAFETY: arch_prctl with ARCH_REQ_XCOMP_PERM reads only its two integer
        // arguments and changes only which register state the kernel keeps for this
        // process; it fails (a non-zero result) on kernels or CPUs without AMX.
        let r = unsafe { syscall(SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) };
        r == 0
    }

    /// Other systems: not asked, so not used.
    #[cfg(not(target_os = "linux"))]
    fn request_tile_state() -> bool {
        false
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn detect() -> Features {
    Features::default()
}

/// Whether `STREAMFUSE_PORTABLE` asks for the portable loops (any value but empty or
/// `0`).
pub fn forced_portable() -> bool {
    static FORCED: OnceLock<bool> = OnceLock::new();
    *FORCED.get_or_init(|| {
        std::env::var_os("STREAMFUSE_PORTABLE").is_some_and(|v| !v.is_empty() && v != "0")
    })
}

/// AVX-512 F, VL and BW with FMA: the f32 packed tile and the 512-bit paths.
pub fn has_avx512() -> bool {
    features().avx512
}

/// AVX-512 with `vdpbf16ps` (pairs of bf16 multiplied and summed into f32).
pub fn has_avx512_bf16() -> bool {
    features().avx512_bf16
}

/// AMX with bf16 tiles (`tdpbf16ps`), granted to this process, beside AVX-512 with
/// AVX512_BF16 (which the tiles' operand preparation uses).
pub fn has_amx_bf16() -> bool {
    features().amx_bf16
}

/// AMX with int8 tiles (`tdpbsud`), granted to this process, beside AVX-512 with
/// AVX512_VNNI (whose tile takes the rows the AMX tiles do not).
pub fn has_amx_int8() -> bool {
    features().amx_int8
}

/// AVX-512 with `vpdpbusd` (four u8 × i8 products summed into i32).
pub fn has_avx512_vnni() -> bool {
    features().avx512_vnni
}
