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
    Features {
        avx512,
        avx512_bf16: avx512 && has!("avx512bf16"),
        avx512_vnni: avx512 && has!("avx512vnni"),
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

/// AVX-512 with `vpdpbusd` (four u8 × i8 products summed into i32).
pub fn has_avx512_vnni() -> bool {
    features().avx512_vnni
}
