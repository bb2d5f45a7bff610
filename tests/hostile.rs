//! Regression tests for issue 10: what a hostile user did to the engine and what it
//! must survive. Each test here failed on the code before the fix (an abort of the
//! whole test binary, a hang caught by the watchdog, or a wrong answer).

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::Duration;

use crossbeam::channel::unbounded;
use streamfuse::{DType, Error, Tensor};

mod emulated;

/// Runs `f` on a thread and fails the test if it does not finish within `secs`
/// (a deadlock would otherwise hang the whole suite).
fn within<R: Send + 'static>(secs: u64, what: &str, f: impl FnOnce() -> R + Send + 'static) -> R {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(Duration::from_secs(secs)) {
        Ok(r) => r,
        Err(_) => panic!("{what}: did not finish within {secs} s (deadlock?)"),
    }
}

/// A small matrix of small integers (products and sums stay exact in f32).
fn ints(rows: usize, cols: usize, seed: usize) -> Tensor {
    let v = (0..rows * cols)
        .map(|i| ((i * 7 + seed * 13) % 9) as f32 - 4.0)
        .collect();
    Tensor::from_vec(v, &[rows, cols]).unwrap()
}

/// `relu(x·w)·w2 + x·w3`, the pending work a worker leaves behind.
fn work(x: &Tensor, w: &Tensor, w2: &Tensor, w3: &Tensor) -> Tensor {
    let h = x.matmul(w).unwrap().relu().unwrap();
    h.matmul(w2).unwrap().add(&x.matmul(w3).unwrap()).unwrap()
}

/// Failure 1: a thread that has run a matmul and ends with matmuls pending used to
/// run them in its thread-local destructor, after gemm's own thread-locals were gone:
/// "fatal runtime error: thread local panicked on drop" aborted the process.
#[test]
fn a_thread_that_ends_with_pending_matmuls_hands_them_over() {
    let (x, w, w2, w3) = (
        ints(64, 96, 1),
        ints(96, 80, 2),
        ints(80, 48, 3),
        ints(96, 48, 4),
    );
    let expected = work(&x, &w, &w2, &w3).to_vec::<f32>().unwrap();
    for threads in [0, 1] {
        let (tx, rx) = unbounded();
        let (x2, w_, w2_, w3_) = (x.clone(), w.clone(), w2.clone(), w3.clone());
        let worker = thread::spawn(move || {
            streamfuse::set_kernel_threads(threads);
            // A matmul run on this thread first: gemm's thread-locals exist.
            x2.matmul(&w_).unwrap().to_vec::<f32>().unwrap();
            let pending = work(&x2, &w_, &w2_, &w3_);
            assert!(!pending.is_ready());
            tx.send(pending).unwrap();
            // Ends with the matmuls still queued on its stream.
        });
        worker.join().expect("the worker ends cleanly");
        let got = rx.recv().unwrap();
        assert!(got.is_ready(), "the hand-over ran before join returned");
        assert_eq!(
            got.to_vec::<f32>().unwrap(),
            expected,
            "kernel threads {threads}"
        );
        // And read from yet another thread.
        let again = thread::spawn(move || got.to_vec::<f32>().unwrap())
            .join()
            .unwrap();
        assert_eq!(again, expected);
    }
}

/// Reads `x·w` from a thread-local destructor and sends the result.
struct ReadsInDestructor {
    x: Tensor,
    w: Tensor,
    out: mpsc::Sender<streamfuse::Result<Vec<f32>>>,
}

impl Drop for ReadsInDestructor {
    fn drop(&mut self) {
        let r = self
            .x
            .matmul(&self.w)
            .and_then(|y| y.gelu())
            .and_then(|y| y.to_vec());
        let _ = self.out.send(r);
    }
}

thread_local! {
    static USER_LOCAL: RefCell<Option<ReadsInDestructor>> = const { RefCell::new(None) };
}

/// Failure 1, second form: a user's own thread-local destructor that records and
/// reads a matmul. Registered before the engine's stream (destroyed after it) and
/// between the stream and gemm's buffers (destroyed after gemm's buffers, while the
/// stream is still alive): in both cases the matmul must not run on the dying thread.
#[test]
fn a_thread_local_destructor_can_record_and_read_a_matmul() {
    // Large enough that gemm uses its thread-local packing buffers.
    let (x, w) = (ints(64, 96, 5), ints(96, 80, 6));
    let expected = x
        .matmul(&w)
        .unwrap()
        .gelu()
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    for user_first in [true, false] {
        let (tx, rx) = mpsc::channel();
        let (x2, w2) = (x.clone(), w.clone());
        thread::spawn(move || {
            let install = |tx| {
                USER_LOCAL.with(|u| {
                    *u.borrow_mut() = Some(ReadsInDestructor {
                        x: x2.clone(),
                        w: w2.clone(),
                        out: tx,
                    })
                })
            };
            if user_first {
                install(tx);
                x2.matmul(&w2).unwrap().to_vec::<f32>().unwrap();
            } else {
                x2.affine(1.0, 0.0).unwrap().to_vec::<f32>().unwrap(); // the stream first
                install(tx);
                x2.matmul(&w2).unwrap().to_vec::<f32>().unwrap(); // then gemm's buffers
            }
        })
        .join()
        .expect("the thread ends cleanly");
        let got = rx.recv().unwrap().expect("the destructor's read succeeds");
        assert_eq!(
            got, expected,
            "user thread-local registered first: {user_first}"
        );
    }
}

/// Failure 2: a plain thread flushing a large parallel segment held its stream's lock
/// while waiting in `rayon::join`, and rayon jobs reading tensors pending on that
/// stream blocked on the lock: both rayon workers stuck, the flush never finished.
/// (Ten rounds of 2^20 elements, scaled by `STREAMFUSE_TEST_SCALE` down to one round
/// of 2^18: still a parallel segment.)
#[test]
fn rayon_jobs_reading_a_flushing_stream_do_not_deadlock() {
    let (rounds, n) = (emulated::scaled(10, 1), emulated::scaled(1 << 20, 1 << 18));
    within(120, "rayon readers of a flushing stream", move || {
        let x = Tensor::from_vec((0..n).map(|i| (i % 97) as f32 * 0.01).collect(), &[n]).unwrap();
        for round in 0..rounds {
            let big = x
                .exp()
                .unwrap()
                .mul(&x)
                .unwrap()
                .sqrt()
                .unwrap()
                .affine(2.0, 1.0)
                .unwrap();
            let small: Vec<Tensor> = (0..8)
                .map(|k| {
                    x.narrow(0, k * 16, 16)
                        .unwrap()
                        .affine(1.0, round as f64)
                        .unwrap()
                })
                .collect();
            let (tx, rx) = unbounded();
            for (k, t) in small.iter().enumerate() {
                let (t, tx) = (t.clone(), tx.clone());
                rayon::spawn(move || {
                    let _ = tx.send((k, t.to_vec::<f32>()));
                });
            }
            drop(tx);
            let sum: f32 = big.sum(0).unwrap().to_vec::<f32>().unwrap()[0];
            assert!(sum.is_finite());
            let mut seen = 0;
            for (k, v) in rx {
                let v = v.unwrap();
                for (i, got) in v.iter().enumerate() {
                    let want = ((k * 16 + i) % 97) as f32 * 0.01 + round as f32;
                    assert!((got - want).abs() < 1e-5);
                }
                seen += 1;
            }
            assert_eq!(seen, 8);
        }
    });
}

/// Failure 2, second form: the main thread drains tensors pending on rayon workers'
/// streams while those workers keep recording: the drain held a worker's stream lock
/// while waiting for rayon, the worker waited for its own lock, and every other worker
/// was busy, so the drain's rayon job never ran. (Forty reads of 2^19 elements,
/// scaled by `STREAMFUSE_TEST_SCALE` down to two of 2^18.)
#[test]
fn draining_rayon_workers_streams_while_they_record_does_not_deadlock() {
    let (reads, n) = (emulated::scaled(40, 2), emulated::scaled(1 << 19, 1 << 18));
    within(120, "draining rayon workers' streams", move || {
        let x = Tensor::from_vec((0..n).map(|i| (i % 89) as f32 * 0.01).collect(), &[n]).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = unbounded();
        let producers = rayon::current_num_threads();
        for p in 0..producers {
            let (x, tx, stop) = (x.clone(), tx.clone(), stop.clone());
            rayon::spawn(move || {
                // Under emulation kernels run far slower than recording, and a busy
                // recorder's flush at the default queue limit (4096 ops, some 600
                // rounds) takes minutes: a shorter queue under STREAMFUSE_TEST_SCALE.
                streamfuse::set_queue_limit(emulated::scaled(4096, 64));
                let mut round = 0;
                // Busy recording until the reader has what it wants.
                while !stop.load(Ordering::Relaxed) {
                    let t = x
                        .exp()
                        .unwrap()
                        .affine(1.0, (p * 1000 + round) as f64)
                        .unwrap();
                    let t = t.mul(&x).unwrap().sqrt().unwrap();
                    if tx.send((p, round, t)).is_err() {
                        break;
                    }
                    let _ = x.affine(0.5, 0.5).unwrap().exp().unwrap();
                    round += 1;
                }
                streamfuse::set_queue_limit(4096);
            });
        }
        drop(tx);
        for _ in 0..reads {
            let (p, round, t) = rx.recv().unwrap();
            let v = t.narrow(0, 0, 4).unwrap().to_vec::<f32>().unwrap();
            for (i, got) in v.iter().enumerate() {
                let xi = (i % 89) as f32 * 0.01;
                let want = ((xi.exp() + (p * 1000 + round) as f32) * xi).sqrt();
                assert!(
                    (got - want).abs() <= 1e-4 * want.max(1.0),
                    "{got} vs {want}"
                );
            }
        }
        stop.store(true, Ordering::Relaxed);
        drop(rx);
    });
}

/// Indices computed at run time that are out of range for a dim of size 4.
fn bad_indices() -> Tensor {
    Tensor::from_vec(vec![0.0f32, 1.0, 2.0], &[3])
        .unwrap()
        .affine(1.0, 10.0)
        .unwrap()
        .to_dtype(DType::U32)
        .unwrap()
}

/// Failure 3: an index error reached tensors that do not depend on the failing op,
/// because they were computed in the same fused kernel.
#[test]
fn an_index_error_reaches_exactly_the_tensors_computed_from_it() {
    let x = ints(4, 8, 7);
    let g = ints(3, 8, 8).affine(0.125, 0.0).unwrap();
    let bad = x.index_select(&bad_indices(), 0).unwrap(); // [3, 8], fails when run
    let h = g.exp().unwrap();
    let o1 = bad.add(&h).unwrap();
    let hg = h.mul(&g).unwrap();
    let g_vals = g.to_vec::<f32>().unwrap();
    let want_h: Vec<f32> = g_vals.iter().map(|v| v.exp()).collect();
    let got_h = h.to_vec::<f32>().unwrap();
    for (a, b) in got_h.iter().zip(&want_h) {
        assert!((a - b).abs() <= 1e-6 * b.abs(), "h: {a} vs {b}");
    }
    let got_hg = hg.to_vec::<f32>().unwrap();
    for ((a, h), g) in got_hg.iter().zip(&got_h).zip(&g_vals) {
        assert_eq!(*a, h * g);
    }
    let index_error = |r: streamfuse::Result<Vec<f32>>| match r {
        Err(Error::Kernel { op, msg }) => assert!(
            op == "index_select" && msg.contains("out of range"),
            "{op}: {msg}"
        ),
        other => panic!("expected the index error, got {other:?}"),
    };
    index_error(o1.to_vec::<f32>());
    index_error(bad.to_vec::<f32>());
    // The stream stays usable; its sync reports the error once.
    assert!(streamfuse::sync().is_err());
    assert_eq!(
        g.affine(2.0, 0.0).unwrap().to_vec::<f32>().unwrap()[0],
        2.0 * g_vals[0]
    );
}

/// Failure 3 in a chain: a matmul whose operand failed is the chain's head; values
/// the chain's program computes from other inputs are still made.
#[test]
fn a_failed_matmul_operand_does_not_poison_the_rest_of_its_chain() {
    let x = ints(4, 8, 1);
    let w = ints(8, 6, 2);
    let g = ints(3, 6, 3).affine(0.25, 0.0).unwrap();
    let bad = x.index_select(&bad_indices(), 0).unwrap(); // [3, 8]
    let h = g.tanh().unwrap(); // [3, 6], same dims as the product
    let o = bad.matmul(&w).unwrap().add(&h).unwrap();
    let want: Vec<f32> = g
        .to_vec::<f32>()
        .unwrap()
        .iter()
        .map(|v| v.tanh())
        .collect();
    let got = h.to_vec::<f32>().unwrap();
    for (a, b) in got.iter().zip(&want) {
        assert!((a - b).abs() <= 1e-6, "{a} vs {b}");
    }
    assert!(matches!(
        o.to_vec::<f32>(),
        Err(Error::Kernel {
            op: "index_select",
            ..
        })
    ));
    let _ = streamfuse::sync();
}
