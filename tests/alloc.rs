//! Heap allocations of a repeated forward pass, counted with a counting global
//! allocator (this file holds one test so that no other test allocates meanwhile).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use streamfuse::Tensor;

struct Counting;

static ALLOCS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards every call to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn t(dims: &[usize], seed: u64) -> Tensor {
    let n: usize = dims.iter().product();
    let v = (0..n)
        .map(|i| ((i as u64 * 2654435761 + seed) % 1000) as f32 / 1000.0 - 0.5)
        .collect();
    Tensor::from_vec(v, dims).unwrap()
}

fn encoder(x: &Tensor, p: &[Tensor]) -> Tensor {
    let (b, s, h, heads) = (x.dims()[0], x.dims()[1], 32, 4);
    let d = h / heads;
    let split = |t: Tensor| {
        t.reshape(&[b, s, heads, d])
            .unwrap()
            .transpose(1, 2)
            .unwrap()
    };
    let q = split(x.matmul(&p[0]).unwrap().add(&p[1]).unwrap());
    let k = split(x.matmul(&p[2]).unwrap().add(&p[3]).unwrap());
    let v = split(x.matmul(&p[4]).unwrap().add(&p[5]).unwrap());
    let att = q
        .matmul(&k.transpose(2, 3).unwrap())
        .unwrap()
        .affine(0.35, 0.0)
        .unwrap()
        .softmax(-1)
        .unwrap();
    let ctx = att
        .matmul(&v)
        .unwrap()
        .transpose(1, 2)
        .unwrap()
        .reshape(&[b, s, h])
        .unwrap();
    let h1 = ctx
        .matmul(&p[6])
        .unwrap()
        .add(&p[7])
        .unwrap()
        .add(x)
        .unwrap()
        .layer_norm(&p[8], &p[9], 1e-12)
        .unwrap();
    let ff = h1
        .matmul(&p[10])
        .unwrap()
        .add(&p[11])
        .unwrap()
        .gelu()
        .unwrap();
    ff.matmul(&p[12])
        .unwrap()
        .add(&p[13])
        .unwrap()
        .add(&h1)
        .unwrap()
        .layer_norm(&p[14], &p[15], 1e-12)
        .unwrap()
}

#[test]
fn allocations_of_a_repeated_bert_layer_forward_pass() {
    let dims: [&[usize]; 16] = [
        &[32, 32],
        &[32],
        &[32, 32],
        &[32],
        &[32, 32],
        &[32],
        &[32, 32],
        &[32],
        &[32],
        &[32],
        &[32, 64],
        &[64],
        &[64, 32],
        &[32],
        &[32],
        &[32],
    ];
    let p: Vec<Tensor> = dims
        .iter()
        .enumerate()
        .map(|(i, d)| t(d, i as u64))
        .collect();
    let x = t(&[2, 8, 32], 99);
    let mut out = vec![0f32; 0];
    for _ in 0..3 {
        out = encoder(&x, &p).to_vec::<f32>().unwrap(); // warm up: pools, plan cache
    }
    let info = streamfuse::last_flush().unwrap();
    assert!(info.cache_hit);
    let before = ALLOCS.load(Ordering::Relaxed);
    let y = encoder(&x, &p);
    let recorded = ALLOCS.load(Ordering::Relaxed);
    streamfuse::sync().unwrap();
    let ran = ALLOCS.load(Ordering::Relaxed);
    let again = y.to_vec::<f32>().unwrap();
    assert_eq!(again, out);
    let (rec, run) = (recorded - before, ran - recorded);
    let ops = streamfuse::last_flush().unwrap().ops;
    eprintln!(
        "one forward pass after warm-up: {rec} allocations while recording {ops} ops, {run} while running {} kernels",
        info.kernels
    );
    // Recording allocates the user's handles and the queued op descriptions; running a
    // cached plan allocates only small bookkeeping vectors. Bounds, not zero: see the
    // closing note of the fusion issue.
    assert!(rec <= 12 * ops, "{rec} allocations for {ops} ops");
    assert!(
        run <= 16 * info.kernels + 32,
        "{run} allocations for {} kernels",
        info.kernels
    );
}
