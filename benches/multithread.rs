//! MLP inference throughput with one and two streams (one thread each, kernels limited
//! to one core per stream). On a 2-core machine the 2-thread rate should be close to
//! twice the 1-thread rate: streams share only the weights, and no lock is held while
//! kernels run.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use streamfuse::Tensor;

#[path = "../tests/support/mod.rs"]
mod support;
use support::data;

const LAYERS: [usize; 4] = [256, 512, 512, 64];
const BATCH: usize = 32;
const PASSES: usize = 64;

fn forward(x: &Tensor, weights: &[(Tensor, Tensor)]) -> Vec<f32> {
    let mut h = x.clone();
    for (w, b) in weights {
        h = h.matmul(w).unwrap().add(b).unwrap().gelu().unwrap();
    }
    h.softmax(-1).unwrap().to_vec::<f32>().unwrap()
}

fn bench(c: &mut Criterion) {
    let weights: Vec<(Tensor, Tensor)> = LAYERS
        .windows(2)
        .enumerate()
        .map(|(i, io)| {
            (
                Tensor::from_vec(data(io[0] * io[1], i as u64), &[io[0], io[1]]).unwrap(),
                Tensor::from_vec(data(io[1], 50 + i as u64), &[io[1]]).unwrap(),
            )
        })
        .collect();
    let mut g = c.benchmark_group("mlp_forward");
    g.throughput(Throughput::Elements(PASSES as u64));
    g.sample_size(20);
    for threads in [1usize, 2] {
        g.bench_function(format!("threads_{threads}"), |b| {
            b.iter(|| {
                std::thread::scope(|s| {
                    for t in 0..threads {
                        let weights = &weights;
                        s.spawn(move || {
                            streamfuse::set_kernel_threads(1);
                            let x = Tensor::from_vec(
                                data(BATCH * LAYERS[0], 99 + t as u64),
                                &[BATCH, LAYERS[0]],
                            )
                            .unwrap();
                            for _ in 0..PASSES / threads {
                                std::hint::black_box(forward(&x, weights));
                            }
                        });
                    }
                })
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
