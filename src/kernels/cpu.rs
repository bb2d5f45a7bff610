//! The one owner of "which hand-written SIMD paths may run here": the CPU's **tier**,
//! decided once per process.
//!
//! A tier is a named level of one CPU family's instruction sets. Each family's tiers
//! form a chain, each adding to the one before:
//!
//! | family | tiers, lowest first |
//! | --- | --- |
//! | any | `portable` (the compiler's code for the build target, no hand-written SIMD) |
//! | x86-64 | `avx2` (AVX2 + FMA), `avx2-vnni` (+ AVX-VNNI), `avx512` (F, VL, BW, DQ), `avx512-vnni` (+ AVX512_VNNI, and AVX512_BF16 where present), `amx` (+ AMX tiles granted by the kernel) |
//! | aarch64 | `neon`, `neon-dotprod` (+ `sdot`), `neon-i8mm` (+ `smmla`, and `bfdot`/`bfmmla` where present), `sve` |
//!
//! Every kernel with an instruction-set path asks a function here (`has_avx2`,
//! `has_avx512_vnni`, `has_neon`, …) and nothing else in the crate calls
//! `is_x86_feature_detected!`, `is_aarch64_feature_detected!` or `pulp`'s `try_new`
//! for a decision (pulp's SIMD tokens come from [`v3`] and [`v4`]). A feature answers
//! `true` only when the CPU has it **and** the tier in use includes it: the tier of a
//! chain includes every feature introduced at or below it.
//!
//! The tier in use is the highest one the CPU has, unless the environment forces a
//! lower one, read once at the first question:
//!
//! - `STREAMFUSE_ISA=<tier>` (one of the names above): that tier. A name that is not a
//!   tier, or a tier this CPU lacks, is a configuration error: the kernels then run
//!   the portable loops and every flush and eager pack fails with [`check`]'s error,
//!   which names the variable, the value and the tiers this CPU has.
//! - `STREAMFUSE_PORTABLE=1` (any value but empty or `0`): `portable`, as before
//!   tiers had names. It wins over `STREAMFUSE_ISA`.
//!
//! So any machine can test and time every tier below its own, and CI runs the suite
//! once per tier the machine has (`scripts/test.sh`).

use std::fmt;
use std::sync::OnceLock;

/// A level of hand-written SIMD paths for one CPU family (see the module docs for
/// what each includes). The order is the order of each family's chain; `Portable`
/// is below every tier of both families.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Tier {
    /// No hand-written SIMD: the compiler's code for the build target.
    Portable,
    /// x86-64 with AVX2 and FMA (Haswell, Zen 1–3 and later).
    Avx2,
    /// AVX2 with AVX-VNNI (`vpdpbusd` on 256-bit registers: Alder Lake and later
    /// client chips, Zen 5).
    Avx2Vnni,
    /// AVX-512 F, VL, BW and DQ with FMA (Skylake-SP and later Xeons, Zen 4).
    Avx512,
    /// AVX-512 with AVX512_VNNI (and AVX512_BF16 where the CPU has it: Cooper Lake,
    /// Zen 4, Sapphire Rapids).
    Avx512Vnni,
    /// AVX-512 with AMX tiles (AMX-BF16 and/or AMX-INT8), granted to the process by
    /// the kernel (Sapphire Rapids and later Xeons).
    Amx,
    /// aarch64 with Advanced SIMD (NEON), which every aarch64 CPU has.
    Neon,
    /// NEON with the dot-product instructions (`sdot`, `udot`).
    NeonDotprod,
    /// NEON with the int8 matrix multiply (`smmla`), and the bf16 instructions
    /// (`bfdot`, `bfmmla`) where the CPU has them (Graviton 3, Apple M2 and later).
    NeonI8mm,
    /// The Scalable Vector Extension, beside NEON with i8mm.
    Sve,
}

/// Every tier, in the order of [`Tier`].
const ALL: [Tier; 10] = [
    Tier::Portable,
    Tier::Avx2,
    Tier::Avx2Vnni,
    Tier::Avx512,
    Tier::Avx512Vnni,
    Tier::Amx,
    Tier::Neon,
    Tier::NeonDotprod,
    Tier::NeonI8mm,
    Tier::Sve,
];

impl Tier {
    /// The tier's name, as `STREAMFUSE_ISA` takes it and the examples print it.
    pub fn name(self) -> &'static str {
        match self {
            Tier::Portable => "portable",
            Tier::Avx2 => "avx2",
            Tier::Avx2Vnni => "avx2-vnni",
            Tier::Avx512 => "avx512",
            Tier::Avx512Vnni => "avx512-vnni",
            Tier::Amx => "amx",
            Tier::Neon => "neon",
            Tier::NeonDotprod => "neon-dotprod",
            Tier::NeonI8mm => "neon-i8mm",
            Tier::Sve => "sve",
        }
    }

    /// The tier named `name` (as [`Tier::name`] gives it), or `None`.
    pub fn from_name(name: &str) -> Option<Tier> {
        ALL.into_iter().find(|t| t.name() == name)
    }

    /// Whether `self` includes every feature of `lower`: the same family's chain at or
    /// above it (every tier includes `Portable`).
    fn includes(self, lower: Tier) -> bool {
        lower == Tier::Portable || (same_family(self, lower) && self >= lower)
    }
}

impl fmt::Display for Tier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Whether two tiers other than `Portable` belong to one family's chain.
fn same_family(a: Tier, b: Tier) -> bool {
    let x86 = |t: Tier| (Tier::Avx2..=Tier::Amx).contains(&t);
    x86(a) == x86(b)
}

/// What this CPU has, as detected, each feature at the tier that introduces it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Cpu {
    avx2: bool,
    avx_vnni: bool,
    avx512: bool,
    avx512_vnni: bool,
    avx512_bf16: bool,
    amx_bf16: bool,
    amx_int8: bool,
    neon: bool,
    dotprod: bool,
    i8mm: bool,
    arm_bf16: bool,
    sve: bool,
}

impl Cpu {
    /// Whether this CPU can run every path of `tier`: it has the features that tier
    /// requires (each tier requires its own, and those of the tiers of its chain it
    /// builds on, except that `avx512` does not require AVX-VNNI, which came later).
    fn runs(&self, tier: Tier) -> bool {
        match tier {
            Tier::Portable => true,
            Tier::Avx2 => self.avx2,
            Tier::Avx2Vnni => self.avx2 && self.avx_vnni,
            Tier::Avx512 => self.avx2 && self.avx512,
            Tier::Avx512Vnni => self.runs(Tier::Avx512) && self.avx512_vnni,
            Tier::Amx => self.runs(Tier::Avx512) && (self.amx_bf16 || self.amx_int8),
            Tier::Neon => self.neon,
            Tier::NeonDotprod => self.neon && self.dotprod,
            Tier::NeonI8mm => self.runs(Tier::NeonDotprod) && self.i8mm,
            Tier::Sve => self.runs(Tier::NeonI8mm) && self.sve,
        }
    }

    /// The tiers this CPU runs, lowest first.
    fn tiers(&self) -> Vec<Tier> {
        ALL.into_iter().filter(|&t| self.runs(t)).collect()
    }

    /// The highest tier this CPU runs.
    fn best(&self) -> Tier {
        self.tiers().into_iter().last().unwrap_or(Tier::Portable)
    }

    /// The features `tier` lets run: those this CPU has whose tier `tier` includes.
    fn under(self, tier: Tier) -> Cpu {
        let at = |has: bool, t: Tier| has && tier.includes(t);
        Cpu {
            avx2: at(self.avx2, Tier::Avx2),
            avx_vnni: at(self.avx_vnni, Tier::Avx2Vnni),
            avx512: at(self.avx512, Tier::Avx512),
            avx512_vnni: at(self.avx512_vnni, Tier::Avx512Vnni),
            avx512_bf16: at(self.avx512_bf16, Tier::Avx512Vnni),
            amx_bf16: at(self.amx_bf16, Tier::Amx),
            amx_int8: at(self.amx_int8, Tier::Amx),
            neon: at(self.neon, Tier::Neon),
            dotprod: at(self.dotprod, Tier::NeonDotprod),
            i8mm: at(self.i8mm, Tier::NeonI8mm),
            arm_bf16: at(self.arm_bf16, Tier::NeonI8mm),
            sve: at(self.sve, Tier::Sve),
        }
    }
}

/// The decision, made once: the tier in use, what it lets run, and the configuration
/// error when the environment asked for something this CPU cannot do.
struct Choice {
    tier: Tier,
    cpu: Cpu,
    detected: Cpu,
    error: Option<String>,
}

fn choice() -> &'static Choice {
    static CHOICE: OnceLock<Choice> = OnceLock::new();
    CHOICE.get_or_init(|| {
        let detected = detect();
        let portable =
            std::env::var_os("STREAMFUSE_PORTABLE").is_some_and(|v| !v.is_empty() && v != "0");
        let isa = std::env::var("STREAMFUSE_ISA").ok();
        let c = decide(detected, portable, isa.as_deref());
        match &c.error {
            Some(e) => log::error!("{e}"),
            None => log::debug!("CPU tier {} (of {:?})", c.tier, detected.tiers()),
        }
        c
    })
}

/// The choice for a CPU that has `detected`, given `STREAMFUSE_PORTABLE` (`portable`)
/// and `STREAMFUSE_ISA` (`isa`, when set).
fn decide(detected: Cpu, portable: bool, isa: Option<&str>) -> Choice {
    let has = || {
        let names: Vec<_> = detected.tiers().iter().map(|t| t.name()).collect();
        names.join(", ")
    };
    let (tier, error) = match isa.map(str::trim).filter(|s| !s.is_empty()) {
        _ if portable => (Tier::Portable, None),
        None => (detected.best(), None),
        Some(name) => match Tier::from_name(&name.to_ascii_lowercase()) {
            None => (
                Tier::Portable,
                Some(format!(
                    "STREAMFUSE_ISA={name:?} is not a tier; the tiers are {} (this CPU has {})",
                    ALL.map(|t| t.name()).join(", "),
                    has()
                )),
            ),
            Some(t) if !detected.runs(t) => (
                Tier::Portable,
                Some(format!(
                    "STREAMFUSE_ISA={name} asks for a tier this CPU lacks; it has {}",
                    has()
                )),
            ),
            Some(t) => (t, None),
        },
    };
    Choice {
        tier,
        cpu: detected.under(tier),
        detected,
        error,
    }
}

#[cfg(target_arch = "x86_64")]
fn detect() -> Cpu {
    use std::arch::is_x86_feature_detected as has;
    let avx2 = has!("avx2") && has!("fma");
    let avx512 =
        avx2 && has!("avx512f") && has!("avx512vl") && has!("avx512bw") && has!("avx512dq");
    let (amx_bf16, amx_int8) = if avx512 {
        amx::enable()
    } else {
        (false, false)
    };
    Cpu {
        avx2,
        avx_vnni: avx2 && has!("avxvnni"),
        avx512,
        avx512_vnni: avx512 && has!("avx512vnni"),
        avx512_bf16: avx512 && has!("avx512bf16"),
        amx_bf16: amx_bf16 && has!("avx512bf16"),
        amx_int8: amx_int8 && has!("avx512vnni"),
        ..Cpu::default()
    }
}

#[cfg(target_arch = "aarch64")]
fn detect() -> Cpu {
    use std::arch::is_aarch64_feature_detected as has;
    let neon = has!("neon");
    Cpu {
        neon,
        dotprod: neon && has!("dotprod"),
        i8mm: neon && has!("i8mm"),
        arm_bf16: neon && has!("bf16"),
        sve: neon && has!("sve"),
        ..Cpu::default()
    }
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
fn detect() -> Cpu {
    Cpu::default()
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

/// The tier in use (the portable tier when the environment's request is an error).
pub(crate) fn tier() -> Tier {
    choice().tier
}

/// The tiers this CPU runs, lowest first (what `STREAMFUSE_ISA` may name here).
pub fn available() -> Vec<Tier> {
    choice().detected.tiers()
}

/// `Ok` unless `STREAMFUSE_ISA` names no tier or a tier this CPU lacks; then the error
/// says which, and the tiers this CPU has. Flushes and eager packs fail with it, so a
/// mistyped benchmark setting cannot pass for a measurement of the tier it named.
pub(crate) fn check() -> Result<(), super::KernelError> {
    match &choice().error {
        None => Ok(()),
        Some(e) => Err(super::KernelError(e.clone())),
    }
}

/// Whether the tier in use is `portable` (`STREAMFUSE_PORTABLE=1`, `STREAMFUSE_ISA=portable`,
/// a CPU with nothing we use, or a configuration error).
pub fn forced_portable() -> bool {
    tier() == Tier::Portable
}

/// AVX2 with FMA: the 256-bit paths.
pub fn has_avx2() -> bool {
    choice().cpu.avx2
}

/// AVX-VNNI: `vpdpbusd` on 256-bit registers (VEX-encoded).
pub(crate) fn has_avx_vnni() -> bool {
    choice().cpu.avx_vnni
}

/// AVX-512 F, VL, BW and DQ with FMA: the f32 packed tile and the 512-bit paths.
pub fn has_avx512() -> bool {
    choice().cpu.avx512
}

/// AVX-512 with `vdpbf16ps` (pairs of bf16 multiplied and summed into f32).
pub fn has_avx512_bf16() -> bool {
    choice().cpu.avx512_bf16
}

/// AVX-512 with `vpdpbusd` (four u8 × i8 products summed into i32).
pub fn has_avx512_vnni() -> bool {
    choice().cpu.avx512_vnni
}

/// AMX with bf16 tiles (`tdpbf16ps`), granted to this process, beside AVX-512 with
/// AVX512_BF16 (which the tiles' operand preparation uses).
pub(crate) fn has_amx_bf16() -> bool {
    choice().cpu.amx_bf16
}

/// AMX with int8 tiles (`tdpbsud`), granted to this process, beside AVX-512 with
/// AVX512_VNNI (whose tile takes the rows the AMX tiles do not).
#[cfg(target_arch = "x86_64")]
pub(crate) fn has_amx_int8() -> bool {
    choice().cpu.amx_int8
}

/// aarch64 Advanced SIMD (NEON), unless the portable tier is forced.
pub fn has_neon() -> bool {
    choice().cpu.neon
}

/// aarch64 `sdot`/`udot` (four i8 products summed into i32 per lane).
pub fn has_dotprod() -> bool {
    choice().cpu.dotprod
}

/// aarch64 `smmla` (a 2 × 8 by 8 × 2 int8 product into four i32 per instruction).
pub fn has_i8mm() -> bool {
    choice().cpu.i8mm
}

/// aarch64 `bfdot`/`bfmmla` (bf16 pairs summed into f32).
pub fn has_arm_bf16() -> bool {
    choice().cpu.arm_bf16
}

/// Whether this CPU has aarch64's bf16 instructions, whatever the environment forces
/// (no tier names them: they come with `neon-i8mm` where present): what the tile that
/// uses them asserts before it runs, and what its tests ask.
pub(crate) fn cpu_has_arm_bf16() -> bool {
    choice().detected.arm_bf16
}

/// aarch64 SVE.
#[allow(dead_code)] // (until its kernels land)
pub(crate) fn has_sve() -> bool {
    choice().cpu.sve
}

/// pulp's AVX2 token, when the tier includes AVX2 (the one place that makes it).
#[cfg(target_arch = "x86_64")]
pub(crate) fn v3() -> Option<pulp::x86::V3> {
    if has_avx2() {
        pulp::x86::V3::try_new()
    } else {
        None
    }
}

/// pulp's AVX-512 token, when the tier includes AVX-512 (the one place that makes it).
#[cfg(target_arch = "x86_64")]
pub(crate) fn v4() -> Option<pulp::x86::V4> {
    if has_avx512() {
        pulp::x86::V4::try_new()
    } else {
        None
    }
}

/// Whether this CPU runs `tier`, whatever the environment forces: for the tests of a
/// vector function itself, which hold it to its scalar reference on any tier.
pub(crate) fn cpu_runs(tier: Tier) -> bool {
    choice().detected.runs(tier)
}

/// pulp's AVX2 token when this CPU runs the `avx2` tier, whatever the environment
/// forces ([`cpu_runs`]): for tests that run an AVX2 path directly.
#[cfg(all(test, target_arch = "x86_64"))]
pub(crate) fn v3_of_cpu() -> Option<pulp::x86::V3> {
    if cpu_runs(Tier::Avx2) {
        pulp::x86::V3::try_new()
    } else {
        None
    }
}

/// pulp's AVX-512 token when this CPU runs the `avx512` tier, whatever the environment
/// forces ([`cpu_runs`]): for tests that run an AVX-512 path directly.
#[cfg(all(test, target_arch = "x86_64"))]
pub(crate) fn v4_of_cpu() -> Option<pulp::x86::V4> {
    if cpu_runs(Tier::Avx512) {
        pulp::x86::V4::try_new()
    } else {
        None
    }
}

/// Whether the CPU is AMD's (CPUID's vendor string `AuthenticAMD`), for the few sizes
/// measured to differ between AMD's caches and Intel's (the f32 chains' panels in
/// `kernels::chain`). Not part of the tier: forcing a tier does not change it.
pub(crate) fn is_amd() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static AMD: OnceLock<bool> = OnceLock::new();
        *AMD.get_or_init(|| {
            // CPUID leaf 0: the vendor string in EBX, EDX, ECX.
            let r = std::arch::x86_64::__cpuid(0);
            [r.ebx, r.edx, r.ecx].map(u32::to_le_bytes).concat() == b"AuthenticAMD"
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Runs `op` compiled for the widest SIMD level of pulp's that the tier in use
/// includes (AVX-512, AVX2 or NEON), or its scalar form: the dispatch of every `pulp`
/// kernel (norms, softmax, the slice loops of `math`), instead of `pulp::Arch`'s own
/// detection, so a forced tier holds for them too.
#[inline]
pub(crate) fn dispatch<Op: pulp::WithSimd>(op: Op) -> Op::Output {
    use pulp::Simd;
    #[cfg(target_arch = "x86_64")]
    {
        if let Some(simd) = v4() {
            return Simd::vectorize(simd, op);
        }
        if let Some(simd) = v3() {
            return Simd::vectorize(simd, op);
        }
    }
    #[cfg(target_arch = "aarch64")]
    {
        if has_neon() {
            if let Some(simd) = pulp::aarch64::Neon::try_new() {
                return Simd::vectorize(simd, op);
            }
        }
    }
    Simd::vectorize(pulp::Scalar::new(), op)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn skylake() -> Cpu {
        Cpu {
            avx2: true,
            avx512: true,
            ..Cpu::default()
        }
    }

    fn sapphire_rapids() -> Cpu {
        Cpu {
            avx2: true,
            avx_vnni: true,
            avx512: true,
            avx512_vnni: true,
            avx512_bf16: true,
            amx_bf16: true,
            amx_int8: true,
            ..Cpu::default()
        }
    }

    fn graviton3() -> Cpu {
        Cpu {
            neon: true,
            dotprod: true,
            i8mm: true,
            arm_bf16: true,
            sve: true,
            ..Cpu::default()
        }
    }

    #[test]
    fn names_round_trip() {
        for t in ALL {
            assert_eq!(Tier::from_name(t.name()), Some(t));
            assert_eq!(t.to_string(), t.name());
        }
        assert_eq!(Tier::from_name("avx3"), None);
    }

    #[test]
    fn best_tier_of_known_cpus() {
        assert_eq!(Cpu::default().best(), Tier::Portable);
        assert_eq!(skylake().best(), Tier::Avx512);
        assert_eq!(
            skylake().tiers(),
            [Tier::Portable, Tier::Avx2, Tier::Avx512]
        );
        assert_eq!(sapphire_rapids().best(), Tier::Amx);
        assert_eq!(graviton3().best(), Tier::Sve);
        let zen3 = Cpu {
            avx2: true,
            ..Cpu::default()
        };
        assert_eq!(zen3.best(), Tier::Avx2);
    }

    #[test]
    fn a_forced_tier_turns_off_what_it_does_not_include() {
        let c = decide(sapphire_rapids(), false, Some("avx2"));
        assert_eq!((c.tier, c.error), (Tier::Avx2, None));
        assert!(c.cpu.avx2 && !c.cpu.avx_vnni && !c.cpu.avx512 && !c.cpu.amx_int8);

        let c = decide(sapphire_rapids(), false, Some("avx512-vnni"));
        assert!(c.cpu.avx512_vnni && c.cpu.avx512_bf16 && c.cpu.avx_vnni && !c.cpu.amx_bf16);

        let c = decide(graviton3(), false, Some("neon-dotprod"));
        assert!(c.cpu.neon && c.cpu.dotprod && !c.cpu.i8mm && !c.cpu.arm_bf16 && !c.cpu.sve);

        let c = decide(graviton3(), false, Some("portable"));
        assert_eq!(c.cpu, Cpu::default());
    }

    #[test]
    fn portable_wins_and_no_request_is_the_best_tier() {
        let c = decide(sapphire_rapids(), true, Some("amx"));
        assert_eq!((c.tier, c.cpu), (Tier::Portable, Cpu::default()));
        assert!(c.error.is_none());
        assert_eq!(decide(skylake(), false, None).tier, Tier::Avx512);
        assert_eq!(decide(skylake(), false, Some("")).tier, Tier::Avx512);
    }

    #[test]
    fn a_tier_the_cpu_lacks_is_an_error_naming_what_it_has() {
        let c = decide(skylake(), false, Some("amx"));
        assert_eq!((c.tier, c.cpu), (Tier::Portable, Cpu::default()));
        let e = c.error.unwrap();
        assert!(
            e.contains("STREAMFUSE_ISA=amx") && e.contains("portable, avx2, avx512"),
            "{e}"
        );

        let e = decide(skylake(), false, Some("neon")).error.unwrap();
        assert!(e.contains("lacks"), "{e}");

        let e = decide(skylake(), false, Some("avx9")).error.unwrap();
        assert!(
            e.contains("\"avx9\" is not a tier") && e.contains("neon-i8mm"),
            "{e}"
        );
    }

    /// The vendor read from CPUID is the kernel's (`/proc/cpuinfo`, where there is
    /// one). x86 only: under emulation another architecture's `/proc/cpuinfo` is the
    /// host's.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_vendor_is_the_kernels() {
        let Ok(info) = std::fs::read_to_string("/proc/cpuinfo") else {
            return;
        };
        if let Some(line) = info.lines().find(|l| l.starts_with("vendor_id")) {
            assert_eq!(is_amd(), line.contains("AuthenticAMD"), "{line}");
        }
    }

    /// The process's own choice agrees with its environment.
    #[test]
    fn this_process() {
        let avail = available();
        assert!(avail.contains(&Tier::Portable));
        if check().is_ok() {
            assert!(avail.contains(&tier()));
        } else {
            assert_eq!(tier(), Tier::Portable);
        }
    }
}
