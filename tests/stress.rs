//! Many streams at once: 8 threads run random programs that pass tensors to each other
//! through channels and drop them anywhere; every result must equal a single-threaded
//! run of the same programs, and afterwards no buffer and no stream may be left.
//!
//! This file holds one test on purpose: it checks engine-wide counters, which other
//! tests running in the same process would disturb.

use std::collections::HashMap;
use std::sync::Arc;
use std::thread;

use crossbeam::channel::{unbounded, Receiver, Sender};
use streamfuse::Tensor;

const THREADS: usize = 8;
const ROUNDS: usize = 60;
const DIMS: [usize; 2] = [4, 8];

struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn data(&mut self, n: usize) -> Vec<f32> {
        (0..n)
            .map(|_| (self.next() >> 40) as f32 / (1u64 << 24) as f32 - 0.5)
            .collect()
    }
}

struct Shared {
    square: Tensor,
    bias: Tensor,
}

fn shared() -> Shared {
    let mut r = Rng::new(7);
    Shared {
        square: Tensor::from_vec(r.data(64), &[8, 8]).unwrap(),
        bias: Tensor::from_vec(r.data(8), &[8]).unwrap(),
    }
}

/// One random step: a short chain of ops on `x` (from another thread, maybe still
/// pending there), `local` (made on this thread) and the shared weights.
fn step(x: &Tensor, local: &Tensor, w: &Shared, rng: &mut Rng) -> Tensor {
    let mut y = x.clone();
    for _ in 0..1 + rng.below(4) {
        y = match rng.below(8) {
            0 => y.matmul(&w.square).unwrap().affine(0.5, 0.0).unwrap(),
            1 => y.add(&w.bias).unwrap().tanh().unwrap(),
            2 => y.softmax(-1).unwrap(),
            3 => y
                .transpose(0, 1)
                .unwrap()
                .contiguous()
                .unwrap()
                .transpose(0, 1)
                .unwrap(),
            4 => {
                let a = y.narrow(1, 0, 3).unwrap();
                let b = y.narrow(1, 3, 5).unwrap();
                Tensor::cat(&[&b, &a], 1).unwrap()
            }
            5 => y.sub(&y.mean_keepdim(1).unwrap()).unwrap(),
            6 => y.mul(local).unwrap().gelu().unwrap(),
            _ => y.maximum(local).unwrap().affine(0.9, 0.01).unwrap(),
        };
    }
    y
}

/// What one thread observed: values read at chosen rounds, and the final tensor.
type Observed = HashMap<(usize, usize), Vec<f32>>;

fn seed_tensor(t: usize) -> Tensor {
    Tensor::from_vec(Rng::new(1000 + t as u64).data(32), &DIMS).unwrap()
}

/// The work of thread `t` in round `r`, given the tensor received from its neighbour.
/// `hold` keeps some tensors alive for a while, to be dropped later or elsewhere.
fn round(
    t: usize,
    r: usize,
    x: &Tensor,
    w: &Shared,
    hold: &mut Vec<Tensor>,
    seen: &mut Observed,
) -> (Tensor, Vec<Tensor>) {
    let mut rng = Rng::new((t * 1000 + r) as u64 + 1);
    let local = Tensor::from_vec(rng.data(32), &DIMS)
        .unwrap()
        .affine(1.0, 0.25)
        .unwrap();
    let y = step(x, &local, w, &mut rng);
    if rng.below(4) == 0 {
        seen.insert((t, r), y.to_vec::<f32>().unwrap());
    }
    // Tensors to give away: dropped on another thread.
    let mut give = Vec::new();
    if rng.below(2) == 0 {
        give.push(local.exp().unwrap());
    }
    hold.push(y.affine(2.0, 0.0).unwrap());
    if hold.len() > 3 {
        let victim = rng.below(hold.len());
        give.push(hold.swap_remove(victim));
    }
    (y, give)
}

fn single_threaded(w: &Shared) -> Observed {
    let mut seen = Observed::new();
    let mut holds: Vec<Vec<Tensor>> = (0..THREADS).map(|_| Vec::new()).collect();
    let mut current: Vec<Tensor> = (0..THREADS).map(seed_tensor).collect();
    for r in 0..ROUNDS {
        let mut next = Vec::new();
        for t in 0..THREADS {
            let from = &current[(t + THREADS - 1) % THREADS];
            let (y, give) = round(t, r, from, w, &mut holds[t], &mut seen);
            drop(give);
            next.push(y);
        }
        current = next;
    }
    for (t, y) in current.iter().enumerate() {
        seen.insert((t, usize::MAX), y.to_vec::<f32>().unwrap());
    }
    seen
}

fn multi_threaded(w: &Shared) -> Observed {
    let (senders, receivers): (Vec<Sender<Tensor>>, Vec<Receiver<Tensor>>) =
        (0..THREADS).map(|_| unbounded()).unzip();
    let (trash_tx, trash_rx) = unbounded::<Vec<Tensor>>();
    // A thread that only drops what it is given.
    let trash = thread::spawn(move || {
        for batch in trash_rx {
            drop(batch);
        }
    });
    // Round 0 input of thread t comes from "thread t-1": send the seeds.
    for t in 0..THREADS {
        senders[(t + 1) % THREADS].send(seed_tensor(t)).unwrap();
    }
    let w = Arc::new(Shared {
        square: w.square.clone(),
        bias: w.bias.clone(),
    });
    let handles: Vec<_> = receivers
        .into_iter()
        .enumerate()
        .map(|(t, rx)| {
            let tx = senders[(t + 1) % THREADS].clone();
            let trash = trash_tx.clone();
            let w = w.clone();
            thread::spawn(move || {
                let mut seen = Observed::new();
                let mut hold = Vec::new();
                let mut last = None;
                for r in 0..ROUNDS {
                    let x = rx.recv().unwrap();
                    let (y, give) = round(t, r, &x, &w, &mut hold, &mut seen);
                    drop(x);
                    trash.send(give).unwrap();
                    if r + 1 < ROUNDS {
                        tx.send(y).unwrap();
                    } else {
                        last = Some(y);
                    }
                }
                seen.insert((t, usize::MAX), last.unwrap().to_vec::<f32>().unwrap());
                // Leave held tensors to the thread's end (dropped with pending work).
                drop(hold);
                seen
            })
        })
        .collect();
    drop(senders);
    drop(trash_tx);
    let mut seen = Observed::new();
    for h in handles {
        seen.extend(h.join().expect("worker panicked"));
    }
    trash.join().unwrap();
    seen
}

/// Threads that end with work still queued on tensors shared with other threads: the
/// closing stream must run (and so release) everything, leaving no buffer behind.
fn threads_exit_with_shared_tensors_tracked() {
    let (tx, rx) = unbounded::<Tensor>();
    let maker = thread::spawn(move || {
        let base = Tensor::from_vec(vec![1.0f32; 1024], &[1024]).unwrap();
        for i in 0..16 {
            tx.send(base.affine(1.0, i as f64).unwrap()).unwrap(); // pending here
        }
        // Ends with queued ops and a shared `base`.
        let _unread = base.exp().unwrap();
    });
    let reader = thread::spawn(move || {
        let mut queued = Vec::new();
        for t in rx {
            queued.push(t.mul(&t).unwrap()); // drains the maker, queues a read here
        }
        // Ends without reading anything.
        queued.truncate(3);
        queued
    });
    maker.join().unwrap();
    let survivors = reader.join().unwrap();
    assert_eq!(survivors[2].to_vec::<f32>().unwrap()[0], 9.0);
}

#[test]
fn eight_threads_passing_tensors_match_one_thread_and_leave_nothing() {
    let before = streamfuse::stats();
    let w = shared();
    let expected = single_threaded(&w);
    streamfuse::sync().unwrap();
    for attempt in 0..3 {
        let got = multi_threaded(&w);
        assert_eq!(got.len(), expected.len());
        let mut mismatches = 0;
        for (k, v) in &expected {
            let g = &got[k];
            if g.iter()
                .zip(v)
                .any(|(a, b)| (a - b).abs() > 1e-5 * (1.0 + b.abs()) || a.is_nan())
            {
                mismatches += 1;
                eprintln!("attempt {attempt}: mismatch at (thread, round) {k:?}: {g:?} vs {v:?}");
            }
        }
        assert_eq!(mismatches, 0);
    }
    threads_exit_with_shared_tensors_tracked();
    streamfuse::sync().unwrap();
    let after = streamfuse::stats();
    assert_eq!(
        after.live_streams,
        before.live_streams.max(1),
        "streams left: {after:?}"
    );
    // Only the shared weights (two buffers) and the main thread's own tensors remain.
    drop(expected);
    drop(w);
    streamfuse::sync().unwrap();
    let end = streamfuse::stats();
    assert_eq!(
        end.live_buffers, before.live_buffers,
        "buffers left: {end:?}"
    );
}
