//! Known failure modes of multi-stream lazy engines (each one shipped in burn's fusion
//! streams at some point): every test here fails on a design that frees a shared tensor
//! by queue order, keeps handles in a per-thread table, or loses track of drops.

use std::sync::{Arc, Barrier};
use std::thread;

use crossbeam::channel::unbounded;
use parking_lot::RwLock;
use streamfuse::Tensor;

mod emulated;

fn iota(n: usize, scale: f32) -> Tensor {
    Tensor::from_vec((0..n).map(|i| i as f32 * scale).collect(), &[n]).unwrap()
}

/// Stream A makes a tensor and drops it at once after handing it over; stream B has a
/// read of it queued (not yet run). A free ordered by A's queue alone would run before
/// B's read and B would see garbage.
#[test]
fn a_shared_tensor_is_not_freed_before_another_streams_pending_read() {
    for round in 0..50 {
        let (tx, rx) = unbounded::<Tensor>();
        let barrier = Arc::new(Barrier::new(2));
        let b2 = barrier.clone();
        let a = thread::spawn(move || {
            let x = iota(4096, 1.0).affine(1.0, round as f64).unwrap(); // pending in A
            tx.send(x.clone()).unwrap();
            b2.wait(); // B has queued its read
            drop(x);
            // More work on A reuses freed memory quickly if the free came too early.
            let junk = iota(4096, -1.0).exp().unwrap();
            streamfuse::sync().unwrap();
            drop(junk);
        });
        let x = rx.recv().unwrap();
        let y = x.affine(2.0, 0.0).unwrap(); // drains A up to x, then queues a read here
        drop(x);
        barrier.wait();
        a.join().unwrap();
        let v = y.to_vec::<f32>().unwrap();
        for (i, got) in v.iter().enumerate() {
            assert_eq!(
                *got,
                2.0 * (i as f32 + round as f32),
                "round {round}, element {i}"
            );
        }
    }
}

/// Eight threads read a tensor that one thread keeps replacing with a new (pending)
/// tensor computed from the old one; every value read must be a whole generation.
#[test]
fn eight_readers_and_a_swapper_agree_on_every_generation() {
    let current = Arc::new(RwLock::new(Tensor::full(0.0, &[64, 64]).unwrap()));
    let swapper = {
        let current = current.clone();
        thread::spawn(move || {
            for _ in 0..200 {
                let next = current.read().affine(1.0, 1.0).unwrap();
                *current.write() = next; // the old one may be dropped here, pending reads elsewhere
            }
        })
    };
    let readers: Vec<_> = (0..8)
        .map(|_| {
            let current = current.clone();
            thread::spawn(move || {
                let mut last = 0.0f32;
                for _ in 0..100 {
                    let t = current.read().clone();
                    let v = t.mul(&t).unwrap().sqrt().unwrap().to_vec::<f32>().unwrap();
                    let g = v[0];
                    assert!(
                        v.iter().all(|&x| x == g),
                        "a torn generation: {g} and others"
                    );
                    assert!(g >= last, "generations go forward: {g} after {last}");
                    last = g;
                }
            })
        })
        .collect();
    swapper.join().unwrap();
    for r in readers {
        r.join().unwrap();
    }
    assert_eq!(current.read().to_vec::<f32>().unwrap()[0], 200.0);
}

/// Tensors made (and still pending) on one thread, dropped on others: the Drop goes to
/// the home stream; nothing panics and the home thread's results stay right.
#[test]
fn tensors_can_be_dropped_on_any_thread() {
    let (tx, rx) = unbounded::<Vec<Tensor>>();
    let dropper = thread::spawn(move || {
        for batch in rx {
            drop(batch);
        }
    });
    let base = iota(256, 0.5);
    let mut keep = Vec::new();
    for i in 0..100 {
        let a = base.affine(1.0, i as f64).unwrap();
        let b = a.exp().unwrap();
        keep.push(a.add(&base).unwrap());
        tx.send(vec![a, b]).unwrap(); // still pending here; dropped over there
    }
    drop(tx);
    dropper.join().unwrap();
    for (i, t) in keep.iter().enumerate() {
        let v = t.to_vec::<f32>().unwrap();
        assert_eq!(v[3], 1.5 + i as f32 + 1.5);
    }
    // A tensor dropped on a thread that has already ended its own stream.
    let t = iota(8, 1.0).affine(3.0, 0.0).unwrap();
    thread::spawn(move || {
        let u = t.add(&t).unwrap();
        assert_eq!(u.to_vec::<f32>().unwrap()[1], 6.0);
        drop(t);
    })
    .join()
    .unwrap();
}

/// Two threads that each read the other's pending tensors, many times over, in
/// whatever interleaving the scheduler picks: must finish (no deadlock) and agree.
#[test]
fn two_streams_draining_each_other_do_not_deadlock() {
    let (to_b, from_a) = unbounded::<Tensor>();
    let (to_a, from_b) = unbounded::<Tensor>();
    let a = thread::spawn(move || {
        let mut x = iota(128, 1.0);
        for _ in 0..300 {
            to_b.send(x.affine(1.0, 1.0).unwrap()).unwrap();
            let y = from_b.recv().unwrap();
            x = y.affine(1.0, 0.0).unwrap();
        }
        x.to_vec::<f32>().unwrap()
    });
    let b = thread::spawn(move || {
        for _ in 0..300 {
            let x = from_a.recv().unwrap();
            to_a.send(x.affine(1.0, 1.0).unwrap()).unwrap();
        }
    });
    b.join().unwrap();
    let v = a.join().unwrap();
    assert_eq!(v[0], 600.0);
    assert_eq!(v[127], 727.0);
}

/// Ops recorded inside rayon jobs: each worker thread has its own stream, and a worker
/// that flushes must not pick up another job of its own thread while its stream is
/// locked (kernels on workers run serially). (Eight rounds of 2^20 elements a job,
/// scaled by `STREAMFUSE_TEST_SCALE` down to one round of 2^18: still parallel
/// kernels.)
#[test]
fn rayon_jobs_can_record_and_read_tensors() {
    use rayon::prelude::*;
    // More workers than cores, so that workers wait inside parallel kernels.
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(4)
        .build()
        .unwrap();
    let (rounds, n) = (emulated::scaled(8, 1), emulated::scaled(1 << 20, 1 << 18));
    let mut sums = Vec::new();
    for _round in 0..rounds {
        sums = pool.install(|| {
            (0..64)
                .into_par_iter()
                .map(|i| {
                    let x = Tensor::full(i as f32 / 64.0, &[n]).unwrap();
                    let y = x.exp().unwrap().add(&x).unwrap();
                    let v = y.to_vec::<f32>().unwrap();
                    v[v.len() / 2]
                })
                .collect()
        });
    }
    for (i, s) in sums.iter().enumerate() {
        let v = i as f32 / 64.0;
        assert!((s - (v.exp() + v)).abs() < 1e-4, "job {i}: {s}");
    }
}
