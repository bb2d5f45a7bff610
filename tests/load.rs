//! The load cap (`set_load_aware`, `runtime/load.rs`) seen from the public API: beside
//! another busy process, a flush that could split its kernels between every core uses
//! fewer threads (`FlushInfo::kernel_threads`), with the same results; with the cap off
//! it uses them all. Its own test binary, so no other test turns the cap off meanwhile.
//! Linux only, as the cap.
#![cfg(target_os = "linux")]

use std::process::{Child, Command};
use std::time::{Duration, Instant};

use streamfuse::Tensor;

/// A product large enough to be split between threads, and its output's bits.
fn product() -> (Vec<u32>, usize) {
    let (m, k, n) = (256, 384, 384);
    let a: Vec<f32> = (0..m * k)
        .map(|i| ((i * 7 % 23) as f32 - 11.0) / 8.0)
        .collect();
    let b: Vec<f32> = (0..k * n)
        .map(|i| ((i * 5 % 19) as f32 - 9.0) / 16.0)
        .collect();
    let a = Tensor::from_vec(a, &[m, k]).unwrap();
    let b = Tensor::from_vec(b, &[k, n]).unwrap();
    let out = a
        .matmul(&b)
        .unwrap()
        .gelu()
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    let threads = streamfuse::last_flush().unwrap().kernel_threads;
    (out.iter().map(|x| x.to_bits()).collect(), threads)
}

/// A busy loop in another process, stopped when dropped.
struct Busy(Child);

impl Drop for Busy {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_busy_neighbour_caps_the_kernel_threads_and_changes_no_result() {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let (quiet, all) = product();
    if cores < 2 || all < 2 {
        return; // one core: nothing to cap
    }
    let Ok(child) = Command::new("sh")
        .args(["-c", "while :; do :; done"])
        .spawn()
    else {
        return; // no shell to make the load with
    };
    let _busy = Busy(child);
    // The cap follows looks at least 100 ms apart; give it a few seconds.
    let start = Instant::now();
    let capped = loop {
        let (bits, threads) = product();
        assert_eq!(bits, quiet, "the cap changed a result ({threads} threads)");
        if threads < all {
            break threads;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "still {threads} kernel threads after 10 s beside a busy loop"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(capped >= 1);
    let stats = streamfuse::stats();
    assert!(
        stats.kernel_threads_allowed < stats.kernel_threads,
        "{stats:?}"
    );
    // Off: the whole budget again, whatever the load.
    streamfuse::set_load_aware(false);
    let (bits, threads) = product();
    let stats = streamfuse::stats();
    streamfuse::set_load_aware(true);
    assert_eq!(bits, quiet);
    assert_eq!(threads, all);
    assert_eq!(stats.kernel_threads_allowed, stats.kernel_threads);
}
