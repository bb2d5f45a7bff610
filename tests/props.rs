//! Property tests over random shapes (rank 0..=4, dims 1..=5): broadcasting of every
//! binary op, reductions over every dim, chains of views followed by element-wise ops,
//! and batched matmul with random batch broadcasting, all against the f64 reference.

mod common;

use common::Rng;
use common::*;
use proptest::prelude::*;
use streamfuse::Tensor;

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 64,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// A shape of rank `lo..=hi`, dims 1..=5.
fn shape(lo: usize, hi: usize) -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(1usize..=5, lo..=hi)
}

/// An operand shape that broadcasts to `out`: a suffix of `out` (any length) with
/// some dims replaced by 1.
fn broadcastable_to(out: Vec<usize>) -> impl Strategy<Value = Vec<usize>> {
    let r = out.len();
    (0..=r, prop::collection::vec(any::<bool>(), r)).prop_map(move |(len, ones)| {
        (r - len..r)
            .map(|i| if ones[i] { 1 } else { out[i] })
            .collect::<Vec<usize>>()
    })
}

/// Two shapes that broadcast together: (result shape, a, b).
fn broadcast_pair(max_rank: usize) -> impl Strategy<Value = (Vec<usize>, Vec<usize>, Vec<usize>)> {
    shape(0, max_rank)
        .prop_flat_map(|env| (broadcastable_to(env.clone()), broadcastable_to(env)))
        .prop_map(|(a, b)| {
            (
                broadcast_shape(&a, &b).expect("compatible by construction"),
                a,
                b,
            )
        })
}

/// A shape with a random permutation of its dims.
fn shape_and_perm(min_rank: usize) -> impl Strategy<Value = (Vec<usize>, Vec<usize>)> {
    shape(min_rank, 4).prop_flat_map(|s| {
        let r = s.len();
        (Just(s), Just((0..r).collect::<Vec<usize>>()).prop_shuffle())
    })
}

proptest! {
    #![proptest_config(config())]

    /// Every binary op with random broadcast-compatible operand shapes.
    #[test]
    fn binary_ops_broadcast((out, da, db) in broadcast_pair(4), op in 0usize..6, seed in any::<u64>()) {
        let name = BINARY_OPS[op];
        let (a, ra) = rand_pair(&da, seed, -3.0, 3.0);
        // positive rhs for div keeps the quotient well conditioned
        let (lo, hi) = if name == "div" { (0.5, 3.0) } else { (-3.0, 3.0) };
        let (b, rb) = rand_pair(&db, seed ^ 0xABCD, lo, hi);
        let t = apply_binary(name, &a, &b).unwrap();
        let e = ref_binary(name, &ra, &rb);
        prop_assert_eq!(&e.dims, &out);
        prop_assert_eq!(t.dims(), &out[..]);
        assert_close(&read_f32(&t), &e.data, 1e-6);
        // operand order swapped
        let t2 = apply_binary(name, &b, &a).unwrap();
        prop_assert_eq!(t2.dims(), &out[..]);
        assert_close(&read_f32(&t2), &ref_binary(name, &rb, &ra).data, 1e-6);
    }

    /// Binary ops on integer dtypes with broadcasting (values small enough to be exact).
    #[test]
    fn binary_ops_broadcast_i64((out, da, db) in broadcast_pair(4), op in 0usize..6, seed in any::<u64>()) {
        let name = BINARY_OPS[op];
        let mut rng = Rng::new(seed);
        let va: Vec<i64> = (0..numel(&da)).map(|_| rng.below(41) as i64 - 20).collect();
        let vb: Vec<i64> = (0..numel(&db)).map(|_| {
            let v = rng.below(20) as i64 + 1;
            if rng.below(2) == 0 { v } else { -v }
        }).collect();
        let a = Tensor::from_vec(va.clone(), &da).unwrap();
        let b = Tensor::from_vec(vb.clone(), &db).unwrap();
        let t = apply_binary(name, &a, &b).unwrap();
        let ra = Ref::new(va.iter().map(|&v| v as f64).collect(), &da);
        let rb = Ref::new(vb.iter().map(|&v| v as f64).collect(), &db);
        let e = if name == "div" {
            ra.zip(&rb, |x, y| (x / y).trunc())
        } else {
            ref_binary(name, &ra, &rb)
        };
        prop_assert_eq!(t.dims(), &out[..]);
        let got = t.to_vec::<i64>().unwrap();
        let want: Vec<i64> = e.data.iter().map(|&v| v as i64).collect();
        prop_assert_eq!(got, want);
    }

    /// Reductions over every dim, keepdim and not, with positive and negative dims, on
    /// contiguous inputs and on a permuted view.
    #[test]
    fn reductions_every_dim((dims, perm) in shape_and_perm(1), seed in any::<u64>(), permuted in any::<bool>()) {
        let (t0, r0) = rand_pair(&dims, seed, -3.0, 3.0);
        let (t, r) = if permuted {
            (t0.permute(&perm).unwrap(), r0.permute(&perm))
        } else {
            (t0, r0)
        };
        let rank = dims.len();
        for d in 0..rank {
            let di = d as isize;
            let neg = d as i64 - rank as i64;
            check(&t.sum(d).unwrap(), &r.sum(di, false), 1e-5);
            check(&t.sum_keepdim(neg).unwrap(), &r.sum(di, true), 1e-5);
            check(&t.mean(neg).unwrap(), &r.mean(di, false), 1e-5);
            check(&t.mean_keepdim(d).unwrap(), &r.mean(di, true), 1e-5);
            check(&t.max(d).unwrap(), &r.max(di, false), 0.0);
            check(&t.max_keepdim(neg).unwrap(), &r.max(di, true), 0.0);
            check_u32(&t.argmax(d).unwrap(), &r.argmax(di));
            check_u32(&t.argmax(neg).unwrap(), &r.argmax(di));
            check_tol(&t.softmax(d).unwrap(), &r.softmax(di), 1e-5, 1e-6);
        }
    }

    /// Reductions of an element-wise expression (a reduction with a fused prologue).
    #[test]
    fn reductions_of_expressions(dims in shape(1, 4), seed in any::<u64>(), d in 0usize..4) {
        let d = d % dims.len();
        let (t, r) = rand_pair(&dims, seed, -2.0, 2.0);
        let x = t.mul(&t).unwrap().affine(0.5, -1.0).unwrap();
        let rx = r.mul(&r).round_f32().affine(0.5, -1.0).round_f32();
        check(&x.sum(d).unwrap(), &rx.sum(d as isize, false), 1e-5);
        check(&x.max_keepdim(d).unwrap(), &rx.max(d as isize, true), 0.0);
        check_tol(&x.exp().unwrap().mean(d).unwrap(), &rx.exp().mean(d as isize, false), 1e-5, 1e-6);
    }

    /// permute, then an element-wise op with a broadcast operand.
    #[test]
    fn permute_then_elementwise((dims, perm) in shape_and_perm(0), seed in any::<u64>(), op in 0usize..6) {
        let name = BINARY_OPS[op];
        let (t, r) = rand_pair(&dims, seed, -3.0, 3.0);
        let v = t.permute(&perm).unwrap();
        let rv = r.permute(&perm);
        prop_assert_eq!(v.dims(), &rv.dims[..]);
        // rhs: the last dim of the permuted shape (or a scalar)
        let last: Vec<usize> = rv.dims.last().map(|&d| vec![d]).unwrap_or_default();
        let (b, rb) = rand_pair(&last, seed ^ 1, 0.5, 2.0);
        check(&apply_binary(name, &v, &b).unwrap(), &ref_binary(name, &rv, &rb), 1e-6);
        check(&v.affine(2.0, 1.0).unwrap(), &rv.affine(2.0, 1.0), 1e-6);
        check(&v, &rv, 0.0);
    }

    /// transpose of two random dims, then a unary op, then a binary op with the source
    /// transposed back.
    #[test]
    fn transpose_then_elementwise(dims in shape(1, 4), seed in any::<u64>(), a in 0usize..4, b in 0usize..4, negative in any::<bool>()) {
        let rank = dims.len();
        let (a, b) = (a % rank, b % rank);
        let (t, r) = rand_pair(&dims, seed, -3.0, 3.0);
        let v = if negative {
            t.transpose(a as i64 - rank as i64, b as i64 - rank as i64).unwrap()
        } else {
            t.transpose(a, b).unwrap()
        };
        let rv = r.transpose(a as isize, b as isize);
        check(&v.tanh().unwrap(), &rv.tanh(), 1e-6);
        let back = v.transpose(a, b).unwrap();
        check(&back.sub(&t).unwrap(), &Ref::full(0.0, &dims), 0.0);
        check(&v.mul(&v).unwrap(), &rv.mul(&rv), 1e-6);
    }

    /// narrow along a random dim, then an element-wise op and a reduction.
    #[test]
    fn narrow_then_elementwise(dims in shape(1, 4), seed in any::<u64>(), d in 0usize..4, s in 0usize..5, l in 1usize..=5) {
        let d = d % dims.len();
        let start = s % dims[d];
        let len = 1 + (l - 1) % (dims[d] - start);
        let (t, r) = rand_pair(&dims, seed, -3.0, 3.0);
        let v = t.narrow(d, start, len).unwrap();
        let rv = r.narrow(d as isize, start, len);
        check(&v, &rv, 0.0);
        check(&v.exp().unwrap(), &rv.exp(), 1e-6);
        check(&v.add(&v.abs().unwrap()).unwrap(), &rv.add(&rv.abs()), 1e-6);
        check(&v.sum_keepdim(d).unwrap(), &rv.sum(d as isize, true), 1e-5);
        // narrow twice (the second relative to the first)
        let v2 = v.narrow(d, 0, 1).unwrap();
        check(&v2.neg().unwrap(), &rv.narrow(d as isize, 0, 1).neg(), 0.0);
    }

    /// reshape of a (possibly non-contiguous) view to a random shape of the same size.
    #[test]
    fn reshape_of_views((dims, perm) in shape_and_perm(0), seed in any::<u64>(), narrow in any::<bool>()) {
        let (t, r) = rand_pair(&dims, seed, -3.0, 3.0);
        let mut v = t.permute(&perm).unwrap();
        let mut rv = r.permute(&perm);
        if narrow && !rv.dims.is_empty() && rv.dims[0] > 1 {
            v = v.narrow(0, 1, rv.dims[0] - 1).unwrap();
            rv = rv.narrow(0, 1, rv.dims[0] - 1);
        }
        let mut rng = Rng::new(seed ^ 77);
        let target = random_shape_with_numel(rv.numel(), 4, &mut rng);
        let w = v.reshape(&target).unwrap();
        let rw = rv.reshape(&target);
        check(&w, &rw, 0.0);
        check(&w.affine(-1.0, 0.5).unwrap(), &rw.affine(-1.0, 0.5), 1e-6);
        // and reshape back, then compare with the view element-wise
        let back = w.reshape(&rv.dims).unwrap();
        check(&back.sub(&v).unwrap(), &Ref::full(0.0, &rv.dims), 0.0);
    }

    /// unsqueeze at every insertion point (positive and negative), then squeeze it back.
    #[test]
    fn unsqueeze_squeeze(dims in shape(0, 4), seed in any::<u64>()) {
        let (t, r) = rand_pair(&dims, seed, -3.0, 3.0);
        let rank = dims.len();
        for d in 0..=rank {
            let u = t.unsqueeze(d).unwrap();
            let ru = r.unsqueeze(d);
            check(&u, &ru, 0.0);
            // negative insertion point: -1 appends
            let neg = d as i64 - rank as i64 - 1;
            let un = t.unsqueeze(neg).unwrap();
            prop_assert_eq!(un.dims(), &ru.dims[..]);
            let s = u.squeeze(d).unwrap();
            check(&s.relu().unwrap(), &r.relu(), 0.0);
            // the same dim counted from the end of the unsqueezed tensor
            let s2 = un.squeeze(neg).unwrap();
            check(&s2, &r, 0.0);
        }
        // squeeze every unit dim of the source
        for d in 0..rank {
            if dims[d] == 1 {
                let s = t.squeeze(d).unwrap();
                check(&s.exp().unwrap(), &r.squeeze(d as isize).exp(), 1e-6);
            }
        }
    }

    /// broadcast_as to a random compatible target, then an element-wise op with a tensor
    /// of the target shape.
    #[test]
    fn broadcast_as_then_elementwise((target, src) in shape(0, 4).prop_flat_map(|t| (Just(t.clone()), broadcastable_to(t))), seed in any::<u64>(), transpose_first in any::<bool>()) {
        let (t, r) = rand_pair(&src, seed, -3.0, 3.0);
        // optionally start from a transposed view of the same shape
        let (t, r) = if transpose_first && src.len() >= 2 {
            let mut sw = src.clone();
            let k = sw.len();
            sw.swap(k - 1, k - 2);
            let (t2, r2) = rand_pair(&sw, seed, -3.0, 3.0);
            (t2.transpose(-1, -2).unwrap(), r2.transpose(-1, -2))
        } else {
            (t, r)
        };
        let v = t.broadcast_as(&target).unwrap();
        let rv = r.broadcast_as(&target);
        check(&v, &rv, 0.0);
        let (o, ro) = rand_pair(&target, seed ^ 5, -3.0, 3.0);
        check(&v.mul(&o).unwrap(), &rv.mul(&ro), 1e-6);
        check(&v.contiguous().unwrap().sigmoid().unwrap(), &rv.sigmoid(), 1e-6);
    }

    /// Batched matmul with random broadcast-compatible batch dims, optionally with a
    /// transposed rhs.
    #[test]
    fn matmul_batch_broadcast((_batch, ba, bb) in broadcast_pair(3), m in 1usize..=6, k in 1usize..=6, n in 1usize..=6, seed in any::<u64>(), rhs_t in any::<bool>()) {
        let mut da = ba.clone();
        da.extend([m, k]);
        let (a, ra) = rand_pair(&da, seed, -1.0, 1.0);
        let (b, rb) = if rhs_t {
            let mut db = bb.clone();
            db.extend([n, k]);
            let (b, rb) = rand_pair(&db, seed ^ 9, -1.0, 1.0);
            (b.transpose(-1, -2).unwrap(), rb.transpose(-1, -2))
        } else {
            let mut db = bb.clone();
            db.extend([k, n]);
            rand_pair(&db, seed ^ 9, -1.0, 1.0)
        };
        let t = a.matmul(&b).unwrap();
        let e = ra.matmul(&rb);
        prop_assert_eq!(t.dims(), &e.dims[..]);
        check_tol(&t, &e, 1e-5, 1e-5);
        // with an element-wise epilogue
        check_tol(&t.relu().unwrap(), &e.relu(), 1e-5, 1e-5);
    }

    /// cat of 1..=3 random pieces along a random dim.
    #[test]
    fn cat_random(dims in shape(1, 4), seed in any::<u64>(), d in 0usize..4, sizes in prop::collection::vec(1usize..=3, 1..=3)) {
        let d = d % dims.len();
        let mut parts = Vec::new();
        let mut rparts = Vec::new();
        for (i, &s) in sizes.iter().enumerate() {
            let mut pd = dims.clone();
            pd[d] = s;
            let (t, r) = rand_pair(&pd, seed.wrapping_add(i as u64), -3.0, 3.0);
            parts.push(t);
            rparts.push(r);
        }
        let refs: Vec<&Tensor> = parts.iter().collect();
        let rrefs: Vec<&Ref> = rparts.iter().collect();
        let c = Tensor::cat(&refs, d).unwrap();
        let rc = Ref::cat(&rrefs, d as isize);
        check(&c, &rc, 0.0);
        check(&c.abs().unwrap(), &rc.abs(), 0.0);
    }

    /// index_select with random in-range indices along a random dim.
    #[test]
    fn index_select_random(dims in shape(1, 4), seed in any::<u64>(), d in 0usize..4, n in 1usize..=6, use_i64 in any::<bool>()) {
        let d = d % dims.len();
        let (t, r) = rand_pair(&dims, seed, -3.0, 3.0);
        let mut rng = Rng::new(seed ^ 3);
        let idx: Vec<usize> = (0..n).map(|_| rng.below(dims[d] as u64) as usize).collect();
        let it = if use_i64 {
            Tensor::from_vec(idx.iter().map(|&v| v as i64).collect(), &[n]).unwrap()
        } else {
            Tensor::from_vec(idx.iter().map(|&v| v as u32).collect(), &[n]).unwrap()
        };
        let out = t.index_select(&it, d).unwrap();
        let e = r.index_select(&idx, d as isize);
        check(&out, &e, 0.0);
        check(&out.affine(3.0, 0.0).unwrap(), &e.affine(3.0, 0.0), 1e-6);
    }

    /// A random chain of 1..=6 view ops (permute, transpose, narrow, unsqueeze, squeeze,
    /// broadcast_as, reshape, contiguous), then element-wise ops and a reduction.
    #[test]
    fn random_view_chains(dims in shape(0, 4), seed in any::<u64>(), steps in 1usize..=6) {
        let (t0, r0) = rand_pair(&dims, seed, -3.0, 3.0);
        let mut rng = Rng::new(seed ^ 0x5EED);
        let (mut t, mut r) = (t0, r0);
        let mut trail = Vec::new();
        for _ in 0..steps {
            let rank = r.rank();
            match rng.below(8) {
                0 if rank >= 1 => {
                    let mut perm: Vec<usize> = (0..rank).collect();
                    for i in (1..rank).rev() {
                        perm.swap(i, rng.below(i as u64 + 1) as usize);
                    }
                    trail.push(format!("permute({perm:?})"));
                    t = t.permute(&perm).unwrap();
                    r = r.permute(&perm);
                }
                1 if rank >= 1 => {
                    let a = rng.below(rank as u64) as usize;
                    let b = rng.below(rank as u64) as usize;
                    trail.push(format!("transpose({a}, {b})"));
                    t = t.transpose(a, b).unwrap();
                    r = r.transpose(a as isize, b as isize);
                }
                2 if rank >= 1 => {
                    let d = rng.below(rank as u64) as usize;
                    let size = r.dims[d];
                    let start = rng.below(size as u64) as usize;
                    let len = 1 + rng.below((size - start) as u64) as usize;
                    trail.push(format!("narrow({d}, {start}, {len})"));
                    t = t.narrow(d, start, len).unwrap();
                    r = r.narrow(d as isize, start, len);
                }
                3 if rank < 5 => {
                    let d = rng.below(rank as u64 + 1) as usize;
                    trail.push(format!("unsqueeze({d})"));
                    t = t.unsqueeze(d).unwrap();
                    r = r.unsqueeze(d);
                }
                4 if r.dims.contains(&1) => {
                    let d = r.dims.iter().position(|&x| x == 1).unwrap();
                    trail.push(format!("squeeze({d})"));
                    t = t.squeeze(d).unwrap();
                    r = r.squeeze(d as isize);
                }
                5 if r.numel() <= 200 => {
                    // expand every 1-dim to a random size, maybe add a leading dim
                    let mut target: Vec<usize> = r
                        .dims
                        .iter()
                        .map(|&x| if x == 1 { 1 + rng.below(3) as usize } else { x })
                        .collect();
                    if rank < 5 && rng.below(2) == 0 {
                        target.insert(0, 1 + rng.below(3) as usize);
                    }
                    trail.push(format!("broadcast_as({target:?})"));
                    t = t.broadcast_as(&target).unwrap();
                    r = r.broadcast_as(&target);
                }
                6 => {
                    let target = random_shape_with_numel(r.numel(), 4, &mut rng);
                    trail.push(format!("reshape({target:?})"));
                    t = t.reshape(&target).unwrap();
                    r = r.reshape(&target);
                }
                _ => {
                    trail.push("contiguous".to_string());
                    t = t.contiguous().unwrap();
                }
            }
        }
        prop_assert_eq!(t.dims(), &r.dims[..], "after {:?}", trail);
        let v = read_f32(&t);
        assert_close(&v, &r.data, 0.0);
        let (o, ro) = rand_pair(&r.dims, seed ^ 11, -1.0, 1.0);
        check(&t.mul(&o).unwrap().add(&t).unwrap(), &ro.mul(&r).round_f32().add(&r), 1e-6);
        if r.rank() >= 1 {
            let d = rng.below(r.rank() as u64) as usize;
            check(&t.sum(d).unwrap(), &r.sum(d as isize, false), 1e-5);
            check_u32(&t.argmax(d).unwrap(), &r.argmax(d as isize));
        }
    }

    /// A random DAG of element-wise ops (what fusion turns into one kernel): leaves of
    /// random broadcast-compatible shapes, nodes that reuse earlier nodes (several
    /// consumers), an occasional cast round trip, and several nodes read at the end in
    /// random order.
    #[test]
    fn random_elementwise_dags(out in shape(0, 4), seed in any::<u64>(), n_nodes in 2usize..=12) {
        let mut rng = Rng::new(seed);
        let mut nodes: Vec<(Tensor, Ref)> = Vec::new();
        for i in 0..3 {
            // a leaf: a suffix of `out` with some dims set to 1
            let r = out.len();
            let len = rng.below(r as u64 + 1) as usize;
            let dims: Vec<usize> = (r - len..r)
                .map(|d| if rng.below(3) == 0 { 1 } else { out[d] })
                .collect();
            nodes.push(rand_pair(&dims, seed.wrapping_add(i), -2.0, 2.0));
        }
        let mut trail = Vec::new();
        for _ in 0..n_nodes {
            let a = rng.below(nodes.len() as u64) as usize;
            let b = rng.below(nodes.len() as u64) as usize;
            let (ta, ra) = (&nodes[a].0, &nodes[a].1);
            let (tb, rb) = (&nodes[b].0, &nodes[b].1);
            let op = rng.below(13);
            trail.push((op, a, b));
            let node = match op {
                0 => (ta.add(tb).unwrap(), ra.add(rb)),
                1 => (ta.sub(tb).unwrap(), ra.sub(rb)),
                2 => (ta.mul(tb).unwrap(), ra.mul(rb)),
                3 => (ta.maximum(tb).unwrap(), ra.maximum(rb)),
                4 => (ta.minimum(tb).unwrap(), ra.minimum(rb)),
                5 => {
                    // a / (1 + |b|)
                    let d = tb.abs().unwrap().affine(1.0, 1.0).unwrap();
                    (ta.div(&d).unwrap(), ra.div(&rb.abs().affine(1.0, 1.0)))
                }
                6 => (ta.tanh().unwrap(), ra.tanh()),
                7 => (ta.sigmoid().unwrap(), ra.sigmoid()),
                8 => (ta.affine(0.5, -0.25).unwrap(), ra.affine(0.5, -0.25)),
                9 => (ta.neg().unwrap().relu().unwrap(), ra.neg().relu()),
                10 => (ta.abs().unwrap().sqrt().unwrap(), ra.abs().sqrt()),
                11 => (ta.gelu().unwrap(), ra.gelu()),
                _ => {
                    // cast round trip through i64 of a scaled leaf (leaves hold exact
                    // f32 values, so x * 4 is exact and the truncation is unambiguous)
                    let (tl, rl) = (&nodes[a % 3].0, &nodes[a % 3].1);
                    let t = tl.affine(4.0, 0.0).unwrap().to_dtype(streamfuse::DType::I64).unwrap();
                    let t = t.to_dtype(streamfuse::DType::F32).unwrap();
                    (t, rl.affine(4.0, 0.0).map(f64::trunc))
                }
            };
            nodes.push(node);
        }
        // read the last node and a few others, in random order
        let mut reads: Vec<usize> = vec![nodes.len() - 1];
        for _ in 0..3 {
            reads.push(rng.below(nodes.len() as u64) as usize);
        }
        reads.reverse();
        for &i in &reads {
            let (t, r) = &nodes[i];
            prop_assert_eq!(t.dims(), &r.dims[..], "node {} after {:?}", i, trail);
            let v = read_f32(t);
            assert_close_tol(&v, &r.data, 1e-4, 1e-4);
        }
    }
}
