//! The single-stream engine: laziness, Drop ops, the relative-form key, the queue
//! limit, and errors that leave the stream usable.

use streamfuse::{DType, FlushReason, Tensor};

fn assert_send_sync<T: Send + Sync>() {}

#[test]
fn tensor_is_send_and_sync() {
    assert_send_sync::<Tensor>();
}

#[test]
fn nothing_runs_until_a_read() {
    let x = Tensor::from_vec(vec![1.0f32, -2.0, 3.0], &[3]).unwrap();
    assert!(x.is_ready(), "from_vec data is ready at once");
    let y = x.abs().unwrap().affine(2.0, 1.0).unwrap();
    assert!(!y.is_ready(), "ops are queued, not run");
    assert_eq!(y.to_vec::<f32>().unwrap(), vec![3.0, 5.0, 7.0]);
    assert!(y.is_ready());
    let info = streamfuse::last_flush().unwrap();
    assert_eq!(info.reason, FlushReason::Read(y.id()));
}

#[test]
fn dropped_intermediates_queue_drop_ops() {
    let x = Tensor::from_vec(vec![1.0f32, 2.0], &[2]).unwrap();
    streamfuse::sync().unwrap();
    let a = x.exp().unwrap();
    let b = a.add(&x).unwrap();
    drop(a); // pending: a Drop op joins the segment
    streamfuse::sync().unwrap();
    let info = streamfuse::last_flush().unwrap();
    assert_eq!(info.ops, 3, "exp, add and the drop of the exp");
    assert_eq!(info.reason, FlushReason::Sync);
    let e = 1f32.exp();
    assert_eq!(b.to_vec::<f32>().unwrap(), vec![e + 1.0, 2f32.exp() + 2.0]);
}

fn program(x: &Tensor, w: &Tensor) -> Tensor {
    x.matmul(w).unwrap().relu().unwrap().sum_keepdim(1).unwrap()
}

#[test]
fn the_same_program_has_the_same_segment_key() {
    let w = Tensor::ones(&[4, 2], DType::F32).unwrap();
    streamfuse::sync().unwrap();
    let mut keys = Vec::new();
    for seed in 0..3 {
        let x = Tensor::from_vec(vec![seed as f32; 12], &[3, 4]).unwrap();
        let y = program(&x, &w);
        y.to_vec::<f32>().unwrap();
        keys.push(streamfuse::last_flush().unwrap().key);
    }
    assert_eq!(keys[0], keys[1]);
    assert_eq!(keys[1], keys[2]);
    // Another shape is another segment.
    let x = Tensor::from_vec(vec![1.0f32; 8], &[2, 4]).unwrap();
    program(&x, &w).to_vec::<f32>().unwrap();
    assert_ne!(streamfuse::last_flush().unwrap().key, keys[0]);
}

#[test]
fn a_failed_op_records_nothing() {
    let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], &[3]).unwrap();
    let z = Tensor::from_vec(vec![0.0f32; 2], &[2]).unwrap();
    let y = x.affine(1.0, 1.0).unwrap();
    let before = streamfuse::pending_key();
    let err = y.add(&z).unwrap_err().to_string();
    assert!(
        err.contains("add") && err.contains("[3]") && err.contains("[2]"),
        "{err}"
    );
    assert!(y.matmul(&y).is_err());
    assert!(y.sum(1).is_err());
    assert_eq!(
        streamfuse::pending_key(),
        before,
        "the failed ops queued nothing"
    );
    assert_eq!(y.to_vec::<f32>().unwrap(), vec![2.0, 3.0, 4.0]);
}

#[test]
fn the_queue_limit_flushes_by_itself() {
    streamfuse::set_queue_limit(8);
    let x = Tensor::from_vec(vec![1.0f32; 4], &[4]).unwrap();
    let mut t = x.clone();
    for _ in 0..20 {
        t = t.affine(1.0, 1.0).unwrap();
    }
    streamfuse::set_queue_limit(4096);
    assert_eq!(
        streamfuse::last_flush().map(|i| i.reason),
        Some(FlushReason::QueueLimit)
    );
    assert_eq!(t.to_vec::<f32>().unwrap(), vec![21.0; 4]);
}

#[test]
fn a_kernel_error_surfaces_at_the_next_read_and_sync() {
    let table = Tensor::from_vec((0..12).map(|v| v as f32).collect(), &[4, 3]).unwrap();
    // Indices computed lazily: the range check can only happen when the kernel runs.
    let idx = Tensor::from_vec(vec![1.0f32, 7.0], &[2])
        .unwrap()
        .to_dtype(DType::U32)
        .unwrap();
    let picked = table.index_select(&idx, 0).unwrap();
    let also = picked.sum(1).unwrap();
    let err = also.to_vec::<f32>().unwrap_err().to_string();
    assert!(err.contains("index_select") && err.contains('7'), "{err}");
    assert!(
        streamfuse::sync().is_err(),
        "the stream reports the fault once"
    );
    streamfuse::sync().unwrap();
    // The stream is still usable, and other tensors are intact.
    let ok = table.sum(0).unwrap();
    assert_eq!(ok.to_vec::<f32>().unwrap(), vec![18.0, 22.0, 26.0]);
}

#[test]
fn known_indices_are_checked_when_recorded() {
    let table = Tensor::from_vec(vec![0.0f32; 6], &[3, 2]).unwrap();
    let idx = Tensor::from_vec(vec![0i64, -1], &[2]).unwrap();
    let err = table.index_select(&idx, 0).unwrap_err().to_string();
    assert!(err.contains("index_select") && err.contains("-1"), "{err}");
}

#[test]
fn ranks_above_the_maximum_are_errors() {
    let dims = [1usize; streamfuse::MAX_RANK + 1];
    assert!(Tensor::zeros(&dims, DType::F32).is_err());
    let x = Tensor::from_vec(vec![1.0f32], &dims[..streamfuse::MAX_RANK]).unwrap();
    let e = x.unsqueeze(0).unwrap_err().to_string();
    assert!(e.contains("unsqueeze") && e.contains("maximum"), "{e}");
    assert!(x.reshape(&dims).is_err());
    assert!(x.broadcast_as(&dims).is_err());
    assert_eq!(x.to_vec::<f32>().unwrap(), vec![1.0]);
}

#[test]
fn a_long_element_wise_chain_is_split_into_several_fused_kernels() {
    streamfuse::set_queue_limit(100_000);
    let one = Tensor::ones(&[4], DType::F32).unwrap();
    let mut x = Tensor::zeros(&[4], DType::F32).unwrap();
    for _ in 0..3000 {
        x = x.add(&one).unwrap();
    }
    assert_eq!(x.to_vec::<f32>().unwrap(), vec![3000.0; 4]);
    let info = streamfuse::last_flush().unwrap();
    assert!(info.kernels > 1, "{info:?}");
    streamfuse::set_queue_limit(4096);
}

#[test]
fn zero_sized_shapes_with_huge_dims_are_errors_not_overflows() {
    assert!(Tensor::zeros(&[usize::MAX / 2 + 1, 0], DType::F32).is_err());
    assert!(Tensor::zeros(&[0, usize::MAX, 4], DType::F32).is_err());
    let a = Tensor::zeros(&[1 << 59, 0], DType::F32).unwrap();
    let e = Tensor::cat(&[&a, &a, &a, &a, &a, &a, &a, &a, &a], 0)
        .unwrap_err()
        .to_string();
    assert!(e.contains("cat"), "{e}");
    assert_eq!(a.to_vec::<f32>().unwrap(), Vec::<f32>::new());
}

#[test]
fn engine_statistics_count_plan_cache_hits_misses_and_plan_sizes() {
    // Other tests of this binary run at the same time, so only increases are checked.
    let x = Tensor::from_vec(vec![1.0f32, -2.0, 3.0, -4.0, 5.0, 6.0], &[2, 3]).unwrap();
    let w = Tensor::from_vec(vec![0.5f32; 12], &[3, 4]).unwrap();
    let before = streamfuse::stats();
    program(&x, &w).to_vec::<f32>().unwrap();
    let after_first = streamfuse::stats();
    program(&x, &w).to_vec::<f32>().unwrap();
    let after = streamfuse::stats();
    assert!(after.plan_cache.hits > before.plan_cache.hits, "{after:?}");
    assert!(after.plan_cache.misses + after.plan_cache.hits >= before.plan_cache.misses + 2);
    assert!(after.plan_cache.plans >= 1 && after.plan_cache.kernels >= after.plan_cache.plans);
    assert!(after.plan_cache.ops >= after.plan_cache.kernels);
    assert!(
        after.ops_recorded >= after_first.ops_recorded + 3,
        "{after:?}"
    );
    assert!(after.segments >= before.segments + 2);
}
