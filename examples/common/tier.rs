//! The line every example prints first: the CPU tier its kernels run on and the tiers
//! this CPU has (`streamfuse::cpu`), so that a figure it prints names the kernels that
//! made it.

/// Prints `cpu tier: avx2 (this CPU has: portable, avx2, avx512)` on stdout; when
/// `STREAMFUSE_ISA` names no tier or one this CPU lacks, prints that error on stderr
/// and exits with status 2 instead (every flush would fail with it).
pub fn announce() {
    if let Err(e) = streamfuse::cpu::check() {
        eprintln!("error: {e}");
        std::process::exit(2);
    }
    let has: Vec<&str> = streamfuse::cpu::available()
        .iter()
        .map(|t| t.name())
        .collect();
    println!(
        "cpu tier: {} (this CPU has: {})",
        streamfuse::cpu::tier(),
        has.join(", ")
    );
}
