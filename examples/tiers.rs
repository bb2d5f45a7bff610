//! Prints the CPU tiers this machine runs, lowest first, one per line (the names
//! `STREAMFUSE_ISA` takes), and marks the one in use: `scripts/test.sh` runs the suite
//! once per tier it lists.

fn main() {
    let used = streamfuse::cpu::tier();
    for t in streamfuse::cpu::available() {
        if t == used {
            println!("{t} *");
        } else {
            println!("{t}");
        }
    }
    if let Err(e) = streamfuse::cpu::check() {
        eprintln!("{e}");
        std::process::exit(2);
    }
}
