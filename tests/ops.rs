//! Every public op against the f64 reference on hand-picked shapes, including
//! non-contiguous inputs, integer dtypes, casts and chains of ops read once.

mod common;

use common::Rng;
use common::*;
use streamfuse::{DType, Tensor};

const TOL: f64 = 1e-5;

// ---------------------------------------------------------------------------------
// the reference itself
// ---------------------------------------------------------------------------------

#[test]
fn reference_erf_and_gelu_known_values() {
    // values from high-precision tables
    let cases = [
        (0.0, 0.0),
        (0.1, 0.1124629160182849),
        (0.5, 0.5204998778130465),
        (1.0, 0.8427007929497149),
        (1.5, 0.9661051464753108),
        (2.0, 0.9953222650189527),
        (3.0, 0.9999779095030014),
        (4.0, 0.9999999845827421),
        (-1.0, -0.8427007929497149),
    ];
    for (x, e) in cases {
        assert!(
            (erf(x) - e).abs() < 1e-14,
            "erf({x}) = {} expected {e}",
            erf(x)
        );
    }
    assert!((gelu(1.0) - 0.8413447460685429).abs() < 1e-14);
    assert!((gelu(-1.0) - (-0.15865525393145707)).abs() < 1e-14);
}

#[test]
fn reference_views_and_matmul_sanity() {
    let r = Ref::new((0..6).map(|v| v as f64).collect(), &[2, 3]);
    assert_eq!(r.transpose(0, 1).data, vec![0., 3., 1., 4., 2., 5.]);
    assert_eq!(r.narrow(1, 1, 2).data, vec![1., 2., 4., 5.]);
    assert_eq!(r.sum(0, false).data, vec![3., 5., 7.]);
    assert_eq!(r.sum(-1, true).dims, vec![2, 1]);
    let id = Ref::new(vec![1., 0., 0., 0., 1., 0., 0., 0., 1.], &[3, 3]);
    assert_eq!(r.matmul(&id), r);
    assert_eq!(Ref::cat(&[&r, &r], 0).dims, vec![4, 3]);
    assert_eq!(r.index_select(&[2, 0], 1).data, vec![2., 0., 5., 3.]);
    assert_eq!(broadcast_shape(&[2, 1, 3], &[4, 1]), Some(vec![2, 4, 3]));
}

// ---------------------------------------------------------------------------------
// creation, read back, casts
// ---------------------------------------------------------------------------------

#[test]
fn from_vec_round_trip_all_dtypes() {
    let f = Tensor::from_vec(vec![1.5f32, -2.0, 3.25, 0.0, 7.0, -0.5], &[2, 3]).unwrap();
    assert_eq!(f.dims(), &[2, 3]);
    assert_eq!(f.dtype(), DType::F32);
    assert_eq!(
        f.to_vec::<f32>().unwrap(),
        vec![1.5, -2.0, 3.25, 0.0, 7.0, -0.5]
    );

    let u = Tensor::from_vec(vec![1u32, 2, 3, u32::MAX], &[4]).unwrap();
    assert_eq!(u.dtype(), DType::U32);
    assert_eq!(u.to_vec::<u32>().unwrap(), vec![1, 2, 3, u32::MAX]);

    let i = Tensor::from_vec(vec![-5i64, 0, i64::MAX, i64::MIN], &[2, 1, 2]).unwrap();
    assert_eq!(i.dtype(), DType::I64);
    assert_eq!(i.dims(), &[2, 1, 2]);
    assert_eq!(i.to_vec::<i64>().unwrap(), vec![-5, 0, i64::MAX, i64::MIN]);

    // rank 0
    let s = Tensor::from_vec(vec![4.0f32], &[]).unwrap();
    assert_eq!(s.dims(), &[] as &[usize]);
    assert_eq!(s.to_vec::<f32>().unwrap(), vec![4.0]);

    // reading twice gives the same values
    assert_eq!(
        f.to_vec::<f32>().unwrap(),
        vec![1.5, -2.0, 3.25, 0.0, 7.0, -0.5]
    );
}

#[test]
fn zeros_ones_full() {
    for dt in [DType::F32, DType::U32, DType::I64] {
        let z = Tensor::zeros(&[2, 3], dt).unwrap();
        let o = Tensor::ones(&[3, 1, 2], dt).unwrap();
        assert_eq!(z.dtype(), dt);
        assert_eq!(o.dtype(), dt);
        assert_eq!(z.dims(), &[2, 3]);
        assert_eq!(o.dims(), &[3, 1, 2]);
        match dt {
            DType::F32 => {
                assert_eq!(z.to_vec::<f32>().unwrap(), vec![0.0; 6]);
                assert_eq!(o.to_vec::<f32>().unwrap(), vec![1.0; 6]);
            }
            DType::U32 => {
                assert_eq!(z.to_vec::<u32>().unwrap(), vec![0; 6]);
                assert_eq!(o.to_vec::<u32>().unwrap(), vec![1; 6]);
            }
            DType::I64 => {
                assert_eq!(z.to_vec::<i64>().unwrap(), vec![0; 6]);
                assert_eq!(o.to_vec::<i64>().unwrap(), vec![1; 6]);
            }
            _ => unreachable!("weight-only dtypes are not filled"),
        }
    }
    let f = Tensor::full(2.5, &[4, 2]).unwrap();
    assert_eq!(f.dtype(), DType::F32);
    assert_eq!(f.to_vec::<f32>().unwrap(), vec![2.5; 8]);
    let s = Tensor::full(-1.0, &[]).unwrap();
    assert_eq!(s.to_vec::<f32>().unwrap(), vec![-1.0]);
    // created tensors feed ops
    let x = Tensor::ones(&[2, 3], DType::F32).unwrap();
    let y = x.add(&Tensor::full(2.0, &[3]).unwrap()).unwrap();
    assert_eq!(y.to_vec::<f32>().unwrap(), vec![3.0; 6]);
}

#[test]
fn casts_between_all_dtypes() {
    let f = Tensor::from_vec(vec![0.0f32, 1.0, 2.9, 7.5, 100.0, 3.0], &[2, 3]).unwrap();
    let u = f.to_dtype(DType::U32).unwrap();
    assert_eq!(u.dtype(), DType::U32);
    assert_eq!(u.dims(), &[2, 3]);
    assert_eq!(u.to_vec::<u32>().unwrap(), vec![0, 1, 2, 7, 100, 3]);

    let g = Tensor::from_vec(vec![-3.7f32, -0.5, 0.5, 3.7], &[4]).unwrap();
    let i = g.to_dtype(DType::I64).unwrap();
    assert_eq!(i.to_vec::<i64>().unwrap(), vec![-3, 0, 0, 3]);

    let i2 = Tensor::from_vec(vec![-7i64, 0, 123456, 5], &[2, 2]).unwrap();
    assert_eq!(
        i2.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap(),
        vec![-7.0, 0.0, 123456.0, 5.0]
    );
    let nonneg = Tensor::from_vec(vec![0i64, 9, 4000000000], &[3]).unwrap();
    assert_eq!(
        nonneg
            .to_dtype(DType::U32)
            .unwrap()
            .to_vec::<u32>()
            .unwrap(),
        vec![0, 9, 4000000000]
    );

    let u2 = Tensor::from_vec(vec![0u32, 5, 4000000000], &[3]).unwrap();
    assert_eq!(
        u2.to_dtype(DType::I64).unwrap().to_vec::<i64>().unwrap(),
        vec![0, 5, 4000000000]
    );
    assert_eq!(
        u2.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap(),
        vec![0.0, 5.0, 4e9]
    );

    // same dtype: identity
    assert_eq!(
        u2.to_dtype(DType::U32).unwrap().to_vec::<u32>().unwrap(),
        vec![0, 5, 4000000000]
    );
    assert_eq!(
        f.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap(),
        f.to_vec::<f32>().unwrap()
    );
}

#[test]
fn cast_f32_to_u32_saturates_negatives() {
    // the IR documents `as` semantics: negative floats saturate at 0
    let f = Tensor::from_vec(vec![-1.5f32, -100.0, 2.0], &[3]).unwrap();
    assert_eq!(
        f.to_dtype(DType::U32).unwrap().to_vec::<u32>().unwrap(),
        vec![0, 0, 2]
    );
}

#[test]
fn cast_of_non_contiguous_view_and_round_trip() {
    let r = Ref::new((0..12).map(|v| v as f64).collect(), &[3, 4]);
    let t = tensor(&r);
    let v = t.transpose(0, 1).unwrap().to_dtype(DType::I64).unwrap();
    check_i64(&v, &r.transpose(0, 1));
    let back = v.to_dtype(DType::F32).unwrap().affine(2.0, 0.5).unwrap();
    check(&back, &r.transpose(0, 1).affine(2.0, 0.5), 0.0);
    let narrowed = t.narrow(1, 1, 2).unwrap().to_dtype(DType::U32).unwrap();
    check_u32(&narrowed, &r.narrow(1, 1, 2));
}

// ---------------------------------------------------------------------------------
// binary ops
// ---------------------------------------------------------------------------------

const SHAPE_PAIRS: &[(&[usize], &[usize])] = &[
    (&[2, 3], &[2, 3]),
    (&[2, 3], &[3]),
    (&[3], &[2, 3]),
    (&[4, 1], &[1, 5]),
    (&[2, 1, 3], &[4, 1]),
    (&[], &[2, 3]),
    (&[2, 3], &[]),
    (&[], &[]),
    (&[1], &[3, 1, 2]),
    (&[2, 3, 4, 5], &[3, 1, 5]),
    (&[7], &[7]),
    (&[1, 1], &[1]),
];

#[test]
fn binary_f32_broadcasting() {
    for name in BINARY_OPS {
        for (k, (da, db)) in SHAPE_PAIRS.iter().enumerate() {
            let (ta, ra) = rand_pair(da, 10 + k as u64, -3.0, 3.0);
            // keep divisors away from zero
            let (tb, rb) = rand_pair(db, 100 + k as u64, 0.5, 2.5);
            let tb_signed = tb.affine(1.0, -1.5).unwrap();
            let rb_signed = rb.affine(1.0, -1.5).round_f32();
            let b = if name == "div" {
                (&tb, &rb)
            } else {
                (&tb_signed, &rb_signed)
            };
            let out = apply_binary(name, &ta, b.0)
                .unwrap_or_else(|e| panic!("{name} {da:?} {db:?}: {e}"));
            let expected = ref_binary(name, &ra, b.1);
            assert_eq!(out.dims(), &expected.dims[..], "{name} {da:?} {db:?}");
            let v = read_f32(&out);
            assert_close(&v, &expected.data, TOL);
        }
    }
}

#[test]
fn binary_same_tensor_both_sides() {
    let (t, r) = rand_pair(&[3, 4], 1, -2.0, 2.0);
    check(&t.add(&t).unwrap(), &r.add(&r), TOL);
    check(&t.mul(&t).unwrap(), &r.mul(&r), TOL);
    check(&t.sub(&t).unwrap(), &Ref::full(0.0, &[3, 4]), 0.0);
}

#[test]
fn binary_non_contiguous_inputs() {
    let (a, ra) = rand_pair(&[4, 3], 2, -2.0, 2.0);
    let (b, rb) = rand_pair(&[3, 6], 3, 0.5, 2.0);
    // transposed lhs [3,4] with narrowed rhs [3,4]
    let at = a.transpose(0, 1).unwrap();
    let bn = b.narrow(1, 1, 4).unwrap();
    let rat = ra.transpose(0, 1);
    let rbn = rb.narrow(1, 1, 4);
    for name in BINARY_OPS {
        let out = apply_binary(name, &at, &bn).unwrap_or_else(|e| panic!("{name}: {e}"));
        let v = read_f32(&out);
        assert_close(&v, &ref_binary(name, &rat, &rbn).data, TOL);
    }
    // broadcast view as an input, against a transposed view
    let (c, rc) = rand_pair(&[4], 4, -1.0, 1.0);
    let cb = c.broadcast_as(&[3, 4]).unwrap();
    check(
        &cb.mul(&at).unwrap(),
        &rc.broadcast_as(&[3, 4]).mul(&rat),
        TOL,
    );
    // a permuted 3-D view with a broadcast operand
    let (d, rd) = rand_pair(&[2, 3, 4], 5, -1.0, 1.0);
    let dp = d.permute(&[2, 0, 1]).unwrap(); // [4,2,3]
    let (e, re) = rand_pair(&[2, 1], 6, -1.0, 1.0);
    check(&dp.add(&e).unwrap(), &rd.permute(&[2, 0, 1]).add(&re), TOL);
    // a narrowed view along the first dim (non-zero offset) of a broadcast
    let dn = d.narrow(0, 1, 1).unwrap();
    check(&dn.sub(&d).unwrap(), &rd.narrow(0, 1, 1).sub(&rd), TOL);
}

#[test]
fn binary_u32() {
    let a = Tensor::from_vec(vec![10u32, 20, 30, 7, 8, 9], &[2, 3]).unwrap();
    let b = Tensor::from_vec(vec![3u32, 5, 7], &[3]).unwrap();
    assert_eq!(
        a.add(&b).unwrap().to_vec::<u32>().unwrap(),
        vec![13, 25, 37, 10, 13, 16]
    );
    assert_eq!(
        a.sub(&b).unwrap().to_vec::<u32>().unwrap(),
        vec![7, 15, 23, 4, 3, 2]
    );
    assert_eq!(
        a.mul(&b).unwrap().to_vec::<u32>().unwrap(),
        vec![30, 100, 210, 21, 40, 63]
    );
    assert_eq!(
        a.div(&b).unwrap().to_vec::<u32>().unwrap(),
        vec![3, 4, 4, 2, 1, 1]
    );
    assert_eq!(
        a.maximum(&b).unwrap().to_vec::<u32>().unwrap(),
        vec![10, 20, 30, 7, 8, 9]
    );
    assert_eq!(
        a.minimum(&b).unwrap().to_vec::<u32>().unwrap(),
        vec![3, 5, 7, 3, 5, 7]
    );
    let big = Tensor::from_vec(vec![4_000_000_000u32], &[1]).unwrap();
    let out = big.maximum(&b).unwrap();
    assert_eq!(out.dtype(), DType::U32);
    assert_eq!(out.to_vec::<u32>().unwrap(), vec![4_000_000_000; 3]);
    // on a transposed view
    let at = a.transpose(0, 1).unwrap(); // [3,2]: 10 7 / 20 8 / 30 9
    let col = Tensor::from_vec(vec![1u32, 2, 3], &[3, 1]).unwrap();
    assert_eq!(
        at.add(&col).unwrap().to_vec::<u32>().unwrap(),
        vec![11, 8, 22, 10, 33, 12]
    );
}

#[test]
fn binary_i64() {
    let a = Tensor::from_vec(vec![-7i64, 7, 100, -100, 0, 5], &[3, 2]).unwrap();
    let b = Tensor::from_vec(vec![2i64, -3], &[2]).unwrap();
    assert_eq!(
        a.add(&b).unwrap().to_vec::<i64>().unwrap(),
        vec![-5, 4, 102, -103, 2, 2]
    );
    assert_eq!(
        a.sub(&b).unwrap().to_vec::<i64>().unwrap(),
        vec![-9, 10, 98, -97, -2, 8]
    );
    assert_eq!(
        a.mul(&b).unwrap().to_vec::<i64>().unwrap(),
        vec![-14, -21, 200, 300, 0, -15]
    );
    // integer division truncates toward zero
    assert_eq!(
        a.div(&b).unwrap().to_vec::<i64>().unwrap(),
        vec![-3, -2, 50, 33, 0, -1]
    );
    assert_eq!(
        a.maximum(&b).unwrap().to_vec::<i64>().unwrap(),
        vec![2, 7, 100, -3, 2, 5]
    );
    assert_eq!(
        a.minimum(&b).unwrap().to_vec::<i64>().unwrap(),
        vec![-7, -3, 2, -100, 0, -3]
    );
    // values beyond f32/f64 precision survive integer arithmetic
    let big = Tensor::from_vec(vec![(1i64 << 60) + 1], &[]).unwrap();
    let one = Tensor::from_vec(vec![1i64], &[]).unwrap();
    assert_eq!(
        big.add(&one).unwrap().to_vec::<i64>().unwrap(),
        vec![(1i64 << 60) + 2]
    );
}

#[test]
fn integer_division_by_zero_gives_zero_and_sub_wraps() {
    // documented in the IR (ir::Element): integer division by zero gives zero, never a
    // panic; integer arithmetic wraps.
    let a = Tensor::from_vec(vec![5u32, 0], &[2]).unwrap();
    let z = Tensor::from_vec(vec![0u32, 0], &[2]).unwrap();
    assert_eq!(a.div(&z).unwrap().to_vec::<u32>().unwrap(), vec![0, 0]);
    let one = Tensor::from_vec(vec![1u32], &[1]).unwrap();
    let two = Tensor::from_vec(vec![2u32], &[1]).unwrap();
    assert_eq!(
        one.sub(&two).unwrap().to_vec::<u32>().unwrap(),
        vec![u32::MAX]
    );
    let i = Tensor::from_vec(vec![-5i64], &[1]).unwrap();
    let iz = Tensor::from_vec(vec![0i64], &[1]).unwrap();
    assert_eq!(i.div(&iz).unwrap().to_vec::<i64>().unwrap(), vec![0]);
    assert_stream_usable();
}

#[test]
fn maximum_minimum_propagate_nan() {
    let a = Tensor::from_vec(vec![f32::NAN, 1.0, 2.0], &[3]).unwrap();
    let b = Tensor::from_vec(vec![0.0f32, f32::NAN, 3.0], &[3]).unwrap();
    let mx = a.maximum(&b).unwrap().to_vec::<f32>().unwrap();
    let mn = a.minimum(&b).unwrap().to_vec::<f32>().unwrap();
    assert!(mx[0].is_nan() && mx[1].is_nan() && mx[2] == 3.0, "{mx:?}");
    assert!(mn[0].is_nan() && mn[1].is_nan() && mn[2] == 2.0, "{mn:?}");
}

// ---------------------------------------------------------------------------------
// unary ops
// ---------------------------------------------------------------------------------

#[test]
fn unary_f32_contiguous() {
    for (k, (name, lo, hi)) in UNARY_OPS.into_iter().enumerate() {
        for dims in [&[3usize, 4][..], &[], &[2, 3, 5], &[37]] {
            let (t, r) = rand_pair(dims, 200 + k as u64, lo, hi);
            let out = apply_unary(name, &t).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(out.dims(), dims, "{name}");
            assert_eq!(out.dtype(), DType::F32, "{name}");
            let v = read_f32(&out);
            let e = ref_unary(name, &r);
            assert_close_tol(&v, &e.data, 1e-5, 1e-6);
        }
    }
}

#[test]
fn unary_f32_non_contiguous() {
    for (k, (name, lo, hi)) in UNARY_OPS.into_iter().enumerate() {
        let (t, r) = rand_pair(&[4, 3, 5], 300 + k as u64, lo, hi);
        // transposed
        let v = read_f32(&apply_unary(name, &t.transpose(0, 2).unwrap()).unwrap());
        assert_close_tol(&v, &ref_unary(name, &r.transpose(0, 2)).data, 1e-5, 1e-6);
        // narrowed in the middle dim (gaps, offset)
        let v = read_f32(&apply_unary(name, &t.narrow(1, 1, 2).unwrap()).unwrap());
        assert_close_tol(&v, &ref_unary(name, &r.narrow(1, 1, 2)).data, 1e-5, 1e-6);
        // broadcast (stride 0)
        let row = t
            .narrow(0, 2, 1)
            .unwrap()
            .narrow(1, 0, 1)
            .unwrap()
            .reshape(&[5])
            .unwrap();
        let rrow = r.narrow(0, 2, 1).narrow(1, 0, 1).reshape(&[5]);
        let b = row.broadcast_as(&[3, 5]).unwrap();
        let v = read_f32(&apply_unary(name, &b).unwrap_or_else(|e| panic!("{name}: {e}")));
        assert_close_tol(
            &v,
            &ref_unary(name, &rrow.broadcast_as(&[3, 5])).data,
            1e-5,
            1e-6,
        );
    }
}

#[test]
fn unary_special_values() {
    let t = Tensor::from_vec(vec![0.0f32, -0.0, 1.0, -1.0, 20.0, -20.0], &[6]).unwrap();
    let r = Ref::from_f32(&[0.0, -0.0, 1.0, -1.0, 20.0, -20.0], &[6]);
    check_tol(&t.gelu().unwrap(), &r.gelu(), 1e-6, 1e-6);
    check_tol(&t.gelu_tanh().unwrap(), &r.gelu_tanh(), 1e-6, 1e-6);
    check_tol(&t.sigmoid().unwrap(), &r.sigmoid(), 1e-6, 1e-7);
    check_tol(&t.silu().unwrap(), &r.silu(), 1e-6, 1e-6);
    check_tol(&t.tanh().unwrap(), &r.tanh(), 1e-6, 1e-7);
    let p = Tensor::from_vec(vec![0.0f32, 1.0, 4.0], &[3]).unwrap();
    let l = read_f32(&p.log().unwrap());
    assert_eq!(l[0], f32::NEG_INFINITY);
    assert_eq!(l[1], 0.0);
    let rc = read_f32(&p.recip().unwrap());
    assert_eq!(rc[0], f32::INFINITY);
    assert_eq!(rc[2], 0.25);
    assert_eq!(read_f32(&p.sqrt().unwrap()), vec![0.0, 1.0, 2.0]);
    let big = Tensor::from_vec(vec![100.0f32, -100.0], &[2]).unwrap();
    let e = read_f32(&big.exp().unwrap());
    assert_eq!(e[0], f32::INFINITY);
    assert!((0.0..1e-40).contains(&e[1]), "exp(-100) = {}", e[1]);
    let s = read_f32(&big.sigmoid().unwrap());
    assert!((s[0] - 1.0).abs() < 1e-7 && s[1].abs() < 1e-30, "{s:?}");
}

#[test]
fn gelu_is_the_erf_form_not_the_tanh_form() {
    // erf and tanh forms differ by ~1e-4 around |x| ~ 2; the erf form must match tightly
    let xs = [-3.0f32, -2.0, -1.5, -0.5, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0];
    let t = Tensor::from_vec(xs.to_vec(), &[xs.len()]).unwrap();
    let r = Ref::from_f32(&xs, &[xs.len()]);
    // the two forms differ by >= 1e-4 at these points; 1e-6 separates them
    check_tol(&t.gelu().unwrap(), &r.gelu(), 1e-5, 1e-6);
    check_tol(&t.gelu_tanh().unwrap(), &r.gelu_tanh(), 1e-5, 1e-6);
    assert!((r.gelu().data[0] - r.gelu_tanh().data[0]).abs() > 1e-4);
}

#[test]
fn powf_integer_exponent_of_negative_base() {
    // x^e with an integer exponent is defined for negative x: (-2)^2 = 4, (-2)^3 = -8
    let t = Tensor::from_vec(vec![-2.0f32, -0.5, 3.0], &[3]).unwrap();
    assert_close(&read_f32(&t.powf(2.0).unwrap()), &[4.0, 0.25, 9.0], 1e-6);
    assert_close(
        &read_f32(&t.powf(3.0).unwrap()),
        &[-8.0, -0.125, 27.0],
        1e-6,
    );
}

#[test]
fn powf_zero_base_and_zero_exponent() {
    let t = Tensor::from_vec(vec![0.0f32, 2.0, 5.0], &[3]).unwrap();
    assert_eq!(read_f32(&t.powf(0.0).unwrap()), vec![1.0, 1.0, 1.0]);
    assert_close(&read_f32(&t.powf(2.0).unwrap()), &[0.0, 4.0, 25.0], 1e-6);
    assert_close(&read_f32(&t.powf(1.0).unwrap()), &[0.0, 2.0, 5.0], 1e-6);
}

// ---------------------------------------------------------------------------------
// matmul
// ---------------------------------------------------------------------------------

#[test]
fn matmul_shapes() {
    let cases: &[(&[usize], &[usize])] = &[
        (&[3, 4], &[4, 5]),
        (&[1, 1], &[1, 1]),
        (&[1, 7], &[7, 1]),
        (&[5, 1], &[1, 6]),
        (&[2, 3, 4], &[2, 4, 5]),
        (&[2, 3, 4], &[4, 5]),
        (&[3, 4], &[2, 4, 5]),
        (&[2, 1, 3, 4], &[5, 4, 6]),
        (&[1, 3, 4], &[2, 4, 2]),
        (&[2, 2, 2, 3, 4], &[2, 1, 4, 2]),
        (&[33, 65], &[65, 17]),
        (&[64, 64], &[64, 64]),
        (&[3, 130, 70], &[70, 40]),
    ];
    for (k, (da, db)) in cases.iter().enumerate() {
        let (a, ra) = rand_pair(da, 400 + k as u64, -1.0, 1.0);
        let (b, rb) = rand_pair(db, 500 + k as u64, -1.0, 1.0);
        let out = a
            .matmul(&b)
            .unwrap_or_else(|e| panic!("matmul {da:?} x {db:?}: {e}"));
        let e = ra.matmul(&rb);
        assert_eq!(out.dims(), &e.dims[..], "matmul {da:?} x {db:?}");
        let v = read_f32(&out);
        assert_close_tol(&v, &e.data, 1e-4, 1e-4);
    }
}

#[test]
fn matmul_non_contiguous_operands() {
    let (a, ra) = rand_pair(&[4, 6], 1, -1.0, 1.0);
    let (b, rb) = rand_pair(&[5, 6], 2, -1.0, 1.0);
    // a @ b^T (the usual linear layer)
    check_tol(
        &a.matmul(&b.transpose(0, 1).unwrap()).unwrap(),
        &ra.matmul(&rb.transpose(0, 1)),
        1e-5,
        1e-5,
    );
    // a^T @ a
    check_tol(
        &a.transpose(0, 1).unwrap().matmul(&a).unwrap(),
        &ra.transpose(0, 1).matmul(&ra),
        1e-5,
        1e-5,
    );
    // narrowed operands (column slices: row stride larger than width)
    let an = a.narrow(1, 1, 4).unwrap(); // [4,4]
    let bn = b.narrow(0, 1, 4).unwrap().narrow(1, 2, 3).unwrap(); // [4,3]
    check_tol(
        &an.matmul(&bn).unwrap(),
        &ra.narrow(1, 1, 4)
            .matmul(&rb.narrow(0, 1, 4).narrow(1, 2, 3)),
        1e-5,
        1e-5,
    );
    // batched with a permuted lhs and a broadcast rhs
    let (c, rc) = rand_pair(&[3, 2, 4], 3, -1.0, 1.0);
    let cp = c.permute(&[1, 0, 2]).unwrap(); // [2,3,4]
    let (d, rd) = rand_pair(&[4, 5], 4, -1.0, 1.0);
    let db = d.broadcast_as(&[2, 4, 5]).unwrap();
    check_tol(
        &cp.matmul(&db).unwrap(),
        &rc.permute(&[1, 0, 2]).matmul(&rd),
        1e-5,
        1e-5,
    );
    // batched transposed rhs (k^T in attention)
    let (q, rq) = rand_pair(&[2, 3, 5, 8], 5, -1.0, 1.0);
    let (kk, rk) = rand_pair(&[2, 3, 7, 8], 6, -1.0, 1.0);
    check_tol(
        &q.matmul(&kk.transpose(-2, -1).unwrap()).unwrap(),
        &rq.matmul(&rk.transpose(-2, -1)),
        1e-5,
        1e-5,
    );
}

#[test]
fn matmul_epilogue_chain() {
    let (x, rx) = rand_pair(&[6, 10], 7, -1.0, 1.0);
    let (w, rw) = rand_pair(&[10, 12], 8, -1.0, 1.0);
    let (b, rb) = rand_pair(&[12], 9, -1.0, 1.0);
    let (res, rres) = rand_pair(&[6, 12], 10, -1.0, 1.0);
    let y = x
        .matmul(&w)
        .unwrap()
        .add(&b)
        .unwrap()
        .relu()
        .unwrap()
        .add(&res)
        .unwrap();
    let ry = rx.matmul(&rw).add(&rb).relu().add(&rres);
    check_tol(&y, &ry, 1e-5, 1e-5);
    let g = x.matmul(&w).unwrap().add(&b).unwrap().gelu().unwrap();
    check_tol(&g, &rx.matmul(&rw).add(&rb).gelu(), 1e-5, 1e-5);
}

/// A weight used again and again (packed at its second use, or at once by `prepack`):
/// every use gives the reference's product, alone or heading a chain, through its own
/// layout or a transposed view, for row counts of one request and of a batch.
#[test]
fn matmul_by_a_reused_weight() {
    let (w, rw) = rand_pair(&[48, 70], 11, -1.0, 1.0);
    let (b, rb) = rand_pair(&[70], 12, -1.0, 1.0);
    let (wt, rwt) = rand_pair(&[70, 48], 13, -1.0, 1.0);
    let wt = wt.transpose(0, 1).unwrap();
    let rwt = rwt.transpose(0, 1);
    for round in 0..3 {
        for (i, rows) in [1usize, 5, 29, 300].into_iter().enumerate() {
            let seed = 20 + 10 * round + i as u64;
            let (x, rx) = rand_pair(&[rows, 48], seed, -1.0, 1.0);
            check_tol(&x.matmul(&w).unwrap(), &rx.matmul(&rw), 1e-5, 1e-5);
            let y = x.matmul(&w).unwrap().add(&b).unwrap().gelu().unwrap();
            check_tol(&y, &rx.matmul(&rw).add(&rb).gelu(), 1e-5, 1e-5);
            check_tol(&x.matmul(&wt).unwrap(), &rx.matmul(&rwt), 1e-5, 1e-5);
            // A batch of matrices against the same weight (broadcast over the batch).
            let (x3, rx3) = rand_pair(&[2, rows, 48], seed + 5, -1.0, 1.0);
            check_tol(&x3.matmul(&w).unwrap(), &rx3.matmul(&rw), 1e-5, 1e-5);
        }
    }
    // Prepacked at once, then used.
    let (v, rv) = rand_pair(&[64, 96], 14, -1.0, 1.0);
    v.prepack().unwrap();
    let (x, rx) = rand_pair(&[7, 64], 15, -1.0, 1.0);
    check_tol(&x.matmul(&v).unwrap(), &rx.matmul(&rv), 1e-5, 1e-5);
    // Not matrices, or not f32: nothing to do, no error.
    Tensor::from_vec(vec![1u32, 2], &[2])
        .unwrap()
        .prepack()
        .unwrap();
    rand_pair(&[2, 3, 4], 16, 0.0, 1.0).0.prepack().unwrap();
}

/// A weight kept only packed (`Tensor::weight`): products by it (alone, heading a
/// chain, from a batch, from a transposed left operand) match the reference, and it is
/// an ordinary tensor otherwise: its elements read back exactly, other ops and other
/// views of it (unpacked once) give the same results as from `from_vec`.
#[test]
fn matmul_by_a_weight_kept_packed() {
    let (_, rw) = rand_pair(&[40, 72], 31, -1.0, 1.0);
    let data: Vec<f32> = rw.data.iter().map(|&x| x as f32).collect();
    let w = Tensor::weight(data.clone(), &[40, 72]).unwrap();
    let (b, rb) = rand_pair(&[72], 32, -1.0, 1.0);
    for (i, rows) in [1usize, 3, 14, 28, 33, 200].into_iter().enumerate() {
        let (x, rx) = rand_pair(&[rows, 40], 40 + i as u64, -1.0, 1.0);
        check_tol(&x.matmul(&w).unwrap(), &rx.matmul(&rw), 1e-5, 1e-5);
        let y = x.matmul(&w).unwrap().add(&b).unwrap().gelu().unwrap();
        check_tol(&y, &rx.matmul(&rw).add(&rb).gelu(), 1e-5, 1e-5);
        let (x3, rx3) = rand_pair(&[2, rows, 40], 50 + i as u64, -1.0, 1.0);
        check_tol(&x3.matmul(&w).unwrap(), &rx3.matmul(&rw), 1e-5, 1e-5);
        let (xt, rxt) = rand_pair(&[40, rows], 60 + i as u64, -1.0, 1.0);
        check_tol(
            &xt.transpose(0, 1).unwrap().matmul(&w).unwrap(),
            &rxt.transpose(0, 1).matmul(&rw),
            1e-5,
            1e-5,
        );
    }
    // The elements, another op, another view as a right operand.
    assert_eq!(w.to_vec::<f32>().unwrap(), data);
    check_tol(&w.add(&w).unwrap(), &rw.add(&rw), 1e-6, 1e-6);
    let (x, rx) = rand_pair(&[5, 72], 70, -1.0, 1.0);
    check_tol(
        &x.matmul(&w.transpose(0, 1).unwrap()).unwrap(),
        &rx.matmul(&rw.transpose(0, 1)),
        1e-5,
        1e-5,
    );
    // Shared by threads.
    std::thread::scope(|s| {
        for t in 0..4 {
            let (w, rw) = (&w, &rw);
            s.spawn(move || {
                let (x, rx) = rand_pair(&[9, 40], 80 + t, -1.0, 1.0);
                check_tol(&x.matmul(w).unwrap(), &rx.matmul(rw), 1e-5, 1e-5);
            });
        }
    });
    // One column (a classifier's single logit) or one row: a dim of one element,
    // whose stride a view may give as 0, still finds the packed form.
    for (k, n) in [(40, 1), (1, 72), (1, 1)] {
        let (_, rw) = rand_pair(&[k, n], 90 + n as u64, -1.0, 1.0);
        let w = Tensor::weight(rw.data.iter().map(|&x| x as f32).collect(), &[k, n]).unwrap();
        for rows in [1usize, 5] {
            let (x, rx) = rand_pair(&[rows, k], 95 + rows as u64, -1.0, 1.0);
            check_tol(&x.matmul(&w).unwrap(), &rx.matmul(&rw), 1e-5, 1e-5);
            let (x3, rx3) = rand_pair(&[2, rows, k], 97 + rows as u64, -1.0, 1.0);
            check_tol(&x3.matmul(&w).unwrap(), &rx3.matmul(&rw), 1e-5, 1e-5);
        }
    }
    // Not a matrix, or the wrong number of elements: errors that say so.
    let e = expect_err(Tensor::weight(vec![1.0; 8], &[2, 2, 2]), "rank-3 weight");
    assert!(e.to_string().contains("[k, n]"), "{e}");
    expect_err(Tensor::weight(vec![1.0; 5], &[2, 3]), "wrong length");
    assert_stream_usable();
}

// ---------------------------------------------------------------------------------
// reductions
// ---------------------------------------------------------------------------------

#[test]
fn reductions_every_dim_f32() {
    let (t, r) = rand_pair(&[2, 3, 4], 11, -3.0, 3.0);
    for d in 0..3usize {
        let di = d as isize;
        let neg = d as i64 - 3;
        check(&t.sum(d).unwrap(), &r.sum(di, false), TOL);
        check(&t.sum_keepdim(d).unwrap(), &r.sum(di, true), TOL);
        check(&t.mean(d).unwrap(), &r.mean(di, false), TOL);
        check(&t.mean_keepdim(d).unwrap(), &r.mean(di, true), TOL);
        check(&t.max(d).unwrap(), &r.max(di, false), 0.0);
        check(&t.max_keepdim(d).unwrap(), &r.max(di, true), 0.0);
        check_u32(&t.argmax(d).unwrap(), &r.argmax(di));
        // negative dims address the same dim
        check(&t.sum(neg).unwrap(), &r.sum(di, false), TOL);
        check(&t.mean_keepdim(neg).unwrap(), &r.mean(di, true), TOL);
        check(&t.max(neg).unwrap(), &r.max(di, false), 0.0);
        check_u32(&t.argmax(neg).unwrap(), &r.argmax(di));
    }
    // literal dims of different integer types
    check(&t.sum(-1).unwrap(), &r.sum(2, false), TOL);
    check(&t.sum(1i32).unwrap(), &r.sum(1, false), TOL);
    check(&t.sum(1isize).unwrap(), &r.sum(1, false), TOL);
    check(&t.sum(-2i64).unwrap(), &r.sum(1, false), TOL);
}

#[test]
fn reductions_rank_one_to_scalar() {
    let (t, r) = rand_pair(&[7], 12, -3.0, 3.0);
    let s = t.sum(0).unwrap();
    assert_eq!(s.dims(), &[] as &[usize]);
    check(&s, &r.sum(0, false), TOL);
    check(&t.sum_keepdim(0).unwrap(), &r.sum(0, true), TOL);
    check(&t.mean(0).unwrap(), &r.mean(0, false), TOL);
    check(&t.max(0).unwrap(), &r.max(0, false), 0.0);
    check_u32(&t.argmax(0).unwrap(), &r.argmax(0));
}

#[test]
fn reductions_long_rows() {
    // long rows exercise blocked/vectorised paths
    let (t, r) = rand_pair(&[3, 1000], 13, -1.0, 1.0);
    check_tol(&t.sum(1).unwrap(), &r.sum(1, false), 1e-4, 1e-4);
    check_tol(&t.mean(1).unwrap(), &r.mean(1, false), 1e-4, 1e-5);
    check(&t.max(1).unwrap(), &r.max(1, false), 0.0);
    check_u32(&t.argmax(1).unwrap(), &r.argmax(1));
    check_tol(&t.sum(0).unwrap(), &r.sum(0, false), 1e-5, 1e-5);
}

#[test]
fn max_and_argmax_of_all_negative_values() {
    // an accumulator starting at 0 instead of -inf would give 0 / a wrong index
    let t = Tensor::from_vec(vec![-5.0f32, -2.0, -9.0, -3.0, -1.5, -1.0], &[2, 3]).unwrap();
    assert_eq!(read_f32(&t.max(1).unwrap()), vec![-2.0, -1.0]);
    assert_eq!(t.argmax(1).unwrap().to_vec::<u32>().unwrap(), vec![1, 2]);
    assert_eq!(read_f32(&t.max(0).unwrap()), vec![-3.0, -1.5, -1.0]);
    assert_eq!(t.argmax(0).unwrap().to_vec::<u32>().unwrap(), vec![1, 1, 1]);
    let inf = Tensor::from_vec(vec![f32::NEG_INFINITY, f32::NEG_INFINITY], &[2]).unwrap();
    assert_eq!(read_f32(&inf.max(0).unwrap()), vec![f32::NEG_INFINITY]);
    assert_eq!(inf.argmax(0).unwrap().to_vec::<u32>().unwrap(), vec![0]);
}

#[test]
fn argmax_ties_pick_the_first() {
    let t = Tensor::from_vec(vec![1.0f32, 3.0, 3.0, 0.0, 2.0, 2.0, 2.0, 2.0], &[2, 4]).unwrap();
    assert_eq!(t.argmax(1).unwrap().to_vec::<u32>().unwrap(), vec![1, 0]);
    let u = Tensor::from_vec(vec![4u32, 4, 1, 4], &[4]).unwrap();
    assert_eq!(u.argmax(0).unwrap().to_vec::<u32>().unwrap(), vec![0]);
    // along dim 0 of a transposed view
    let tt = t.transpose(0, 1).unwrap(); // [4,2]
    assert_eq!(tt.argmax(0).unwrap().to_vec::<u32>().unwrap(), vec![1, 0]);
}

#[test]
fn reductions_non_contiguous() {
    let (t, r) = rand_pair(&[3, 4, 5], 14, -3.0, 3.0);
    let views: Vec<(Tensor, Ref)> = vec![
        (t.transpose(0, 2).unwrap(), r.transpose(0, 2)),
        (t.permute(&[1, 2, 0]).unwrap(), r.permute(&[1, 2, 0])),
        (t.narrow(2, 1, 3).unwrap(), r.narrow(2, 1, 3)),
        (
            t.narrow(0, 1, 1)
                .unwrap()
                .broadcast_as(&[2, 1, 4, 5])
                .unwrap(),
            r.narrow(0, 1, 1).broadcast_as(&[2, 1, 4, 5]),
        ),
    ];
    for (v, rv) in &views {
        for d in 0..rv.rank() {
            let di = d as isize;
            check(&v.sum(d).unwrap(), &rv.sum(di, false), TOL);
            check(&v.mean_keepdim(d).unwrap(), &rv.mean(di, true), TOL);
            check(&v.max_keepdim(d).unwrap(), &rv.max(di, true), 0.0);
            check_u32(&v.argmax(d).unwrap(), &rv.argmax(di));
        }
    }
}

#[test]
fn reductions_integer_dtypes() {
    let u = Tensor::from_vec(vec![3u32, 9, 1, 4, 4, 8], &[2, 3]).unwrap();
    let s = u.sum(1).unwrap();
    assert_eq!(s.dtype(), DType::U32);
    assert_eq!(s.to_vec::<u32>().unwrap(), vec![13, 16]);
    assert_eq!(u.sum_keepdim(0).unwrap().dims(), &[1, 3]);
    assert_eq!(
        u.sum_keepdim(0).unwrap().to_vec::<u32>().unwrap(),
        vec![7, 13, 9]
    );
    assert_eq!(u.max(1).unwrap().to_vec::<u32>().unwrap(), vec![9, 8]);
    assert_eq!(
        u.max_keepdim(0).unwrap().to_vec::<u32>().unwrap(),
        vec![4, 9, 8]
    );
    assert_eq!(u.argmax(1).unwrap().to_vec::<u32>().unwrap(), vec![1, 2]);
    assert_eq!(u.argmax(0).unwrap().to_vec::<u32>().unwrap(), vec![1, 0, 1]);

    let i = Tensor::from_vec(vec![-3i64, -9, -1, -4, 5, -8], &[2, 3]).unwrap();
    let s = i.sum(1).unwrap();
    assert_eq!(s.dtype(), DType::I64);
    assert_eq!(s.to_vec::<i64>().unwrap(), vec![-13, -7]);
    assert_eq!(i.max(1).unwrap().to_vec::<i64>().unwrap(), vec![-1, 5]);
    assert_eq!(i.max(0).unwrap().to_vec::<i64>().unwrap(), vec![-3, 5, -1]);
    assert_eq!(i.argmax(1).unwrap().to_vec::<u32>().unwrap(), vec![2, 1]);
    let a = i.argmax(0).unwrap();
    assert_eq!(a.dtype(), DType::U32);
    assert_eq!(a.to_vec::<u32>().unwrap(), vec![0, 1, 0]);
    // large i64 values are summed exactly
    let big = Tensor::from_vec(vec![1i64 << 60, 1, 1], &[3]).unwrap();
    assert_eq!(
        big.sum(0).unwrap().to_vec::<i64>().unwrap(),
        vec![(1i64 << 60) + 2]
    );
}

// ---------------------------------------------------------------------------------
// softmax and norms
// ---------------------------------------------------------------------------------

#[test]
fn softmax_every_dim() {
    let (t, r) = rand_pair(&[2, 3, 4], 15, -3.0, 3.0);
    for d in 0..3usize {
        check_tol(&t.softmax(d).unwrap(), &r.softmax(d as isize), 1e-5, 1e-6);
        check_tol(
            &t.softmax(d as i64 - 3).unwrap(),
            &r.softmax(d as isize),
            1e-5,
            1e-6,
        );
    }
    check_tol(&t.softmax(-1).unwrap(), &r.softmax(-1), 1e-5, 1e-6);
    // rank 1 and long rows
    let (u, ru) = rand_pair(&[513], 16, -5.0, 5.0);
    check_tol(&u.softmax(0).unwrap(), &ru.softmax(0), 1e-5, 1e-7);
}

#[test]
fn softmax_is_stable_for_large_values() {
    let t = Tensor::from_vec(
        vec![1000.0f32, 1001.0, 1002.0, -1000.0, -1001.0, -1002.0],
        &[2, 3],
    )
    .unwrap();
    let r = Ref::from_f32(
        &[1000.0, 1001.0, 1002.0, -1000.0, -1001.0, -1002.0],
        &[2, 3],
    );
    check_tol(&t.softmax(1).unwrap(), &r.softmax(1), 1e-5, 1e-7);
    // -inf entries (masked) get probability 0
    let m = Tensor::from_vec(vec![0.0f32, f32::NEG_INFINITY, 1.0], &[3]).unwrap();
    let rm = Ref::from_f32(&[0.0, f32::NEG_INFINITY, 1.0], &[3]);
    check_tol(&m.softmax(0).unwrap(), &rm.softmax(0), 1e-6, 1e-7);
}

#[test]
fn softmax_non_contiguous() {
    let (t, r) = rand_pair(&[4, 6], 17, -3.0, 3.0);
    check_tol(
        &t.transpose(0, 1).unwrap().softmax(1).unwrap(),
        &r.transpose(0, 1).softmax(1),
        1e-5,
        1e-6,
    );
    check_tol(
        &t.narrow(1, 2, 3).unwrap().softmax(-1).unwrap(),
        &r.narrow(1, 2, 3).softmax(-1),
        1e-5,
        1e-6,
    );
    let b = t.narrow(0, 1, 1).unwrap().broadcast_as(&[3, 6]).unwrap();
    check_tol(
        &b.softmax(0).unwrap(),
        &r.narrow(0, 1, 1).broadcast_as(&[3, 6]).softmax(0),
        1e-5,
        1e-6,
    );
    // softmax of a computed (fused) input
    let x = t.affine(0.5, 1.0).unwrap().mul(&t).unwrap();
    check_tol(
        &x.softmax(-1).unwrap(),
        &r.affine(0.5, 1.0).round_f32().mul(&r).softmax(-1),
        1e-5,
        1e-6,
    );
}

#[test]
fn layer_norm_and_rms_norm() {
    for (k, dims) in [&[2usize, 3, 8][..], &[5, 64], &[16], &[1, 1, 300]]
        .iter()
        .enumerate()
    {
        let h = *dims.last().unwrap();
        let (x, rx) = rand_pair(dims, 600 + k as u64, -2.0, 3.0);
        let (w, rw) = rand_pair(&[h], 700 + k as u64, 0.5, 1.5);
        let (b, rb) = rand_pair(&[h], 800 + k as u64, -0.5, 0.5);
        for eps in [1e-5, 1e-12, 0.1] {
            check_tol(
                &x.layer_norm(&w, &b, eps).unwrap(),
                &rx.layer_norm(&rw, &rb, eps),
                1e-5,
                1e-5,
            );
            check_tol(
                &x.rms_norm(&w, eps).unwrap(),
                &rx.rms_norm(&rw, eps),
                1e-5,
                1e-5,
            );
        }
    }
}

/// Rotary embedding worked out by hand on one position: x = [1, 2, 3, 4] rotated by
/// cos = [0.5, 0], sin = [0.25, 1] is [1·.5 − 3·.25, 2·0 − 4·1, 3·.5 + 1·.25, 4·0 + 2·1].
#[test]
fn rotary_by_hand() {
    let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[1, 4]).unwrap();
    let cos = Tensor::from_vec(vec![0.5f32, 0.0], &[1, 2]).unwrap();
    let sin = Tensor::from_vec(vec![0.25f32, 1.0], &[1, 2]).unwrap();
    let out = x.rotary(&cos, &sin).unwrap();
    assert_eq!(read_f32(&out), [-0.25, -4.0, 1.75, 2.0]);
    // Position 0 of an angle-0 table (cos 1, sin 0) leaves x as it is.
    let one = Tensor::from_vec(vec![1.0f32, 1.0], &[1, 2]).unwrap();
    let zero = Tensor::zeros(&[1, 2], DType::F32).unwrap();
    assert_eq!(
        read_f32(&x.rotary(&one, &zero).unwrap()),
        [1.0, 2.0, 3.0, 4.0]
    );
}

/// Both forms ([.., seq, dh] and [.., seq, heads, dh]), a transposed x (the usual
/// [b, heads, seq, dh] -> [b, seq, heads, dh] view) and a product feeding it, against
/// the f64 reference.
#[test]
fn rotary_both_forms_and_views() {
    for (k, (dims, heads_form)) in [
        (&[2usize, 5, 8][..], false),
        (&[7, 4][..], false),
        (&[2, 3, 4, 16][..], true),
        (&[1, 6, 2, 64][..], true),
    ]
    .into_iter()
    .enumerate()
    {
        let r = dims.len();
        let pos = if heads_form { r - 3 } else { r - 2 };
        let (seq, half) = (dims[pos], dims[r - 1] / 2);
        let (x, rx) = rand_pair(dims, 900 + k as u64, -2.0, 2.0);
        let (c, rc) = rand_pair(&[seq, half], 910 + k as u64, -1.0, 1.0);
        let (s, rs) = rand_pair(&[seq, half], 920 + k as u64, -1.0, 1.0);
        check_tol(
            &x.rotary(&c, &s).unwrap(),
            &rx.rotary(&rc, &rs, heads_form),
            1e-6,
            1e-6,
        );
    }
    // x stored [b, heads, seq, dh], read as [b, seq, heads, dh].
    let (x, rx) = rand_pair(&[2, 3, 5, 8], 930, -2.0, 2.0);
    let (c, rc) = rand_pair(&[5, 4], 931, -1.0, 1.0);
    let (s, rs) = rand_pair(&[5, 4], 932, -1.0, 1.0);
    let xt = x.transpose(1, 2).unwrap();
    let want = rx.transpose(1, 2).rotary(&rc, &rs, true);
    check_tol(&xt.rotary(&c, &s).unwrap(), &want, 1e-6, 1e-6);
    // The output of a product (a planned segment with a chain before the op).
    let (w, rw) = rand_pair(&[8, 8], 933, -0.5, 0.5);
    let (q, rq) = rand_pair(&[5, 8], 934, -1.0, 1.0);
    let got = q
        .matmul(&w)
        .unwrap()
        .add(&q)
        .unwrap()
        .rotary(&c, &s)
        .unwrap();
    let want = rq.matmul(&rw).add(&rq).rotary(&rc, &rs, false);
    check_tol(&got, &want, 1e-5, 1e-5);
}

/// Bad arguments are errors naming the op and the shapes.
#[test]
fn rotary_argument_errors() {
    let x = Tensor::zeros(&[2, 5, 8], DType::F32).unwrap();
    let t = Tensor::zeros(&[5, 4], DType::F32).unwrap();
    let cases = [
        (
            Tensor::zeros(&[8], DType::F32).unwrap(),
            t.clone(),
            t.clone(),
            "[8]",
        ),
        (
            Tensor::zeros(&[5, 7], DType::F32).unwrap(),
            t.clone(),
            t.clone(),
            "even",
        ),
        (
            x.clone(),
            Tensor::zeros(&[5, 3], DType::F32).unwrap(),
            t.clone(),
            "[5, 3]",
        ),
        (
            x.clone(),
            Tensor::zeros(&[6, 4], DType::F32).unwrap(),
            Tensor::zeros(&[6, 4], DType::F32).unwrap(),
            "[2, 5, 8]",
        ),
        (
            x.clone(),
            t.clone(),
            Tensor::zeros(&[5, 4], DType::U32).unwrap(),
            "u32",
        ),
    ];
    for (x, c, s, needle) in cases {
        let msg = assert_err_names(x.rotary(&c, &s), "rotary");
        assert!(msg.contains(needle), "{msg}");
    }
    assert_stream_usable();
}

#[test]
fn norms_non_contiguous_and_constant_rows() {
    let (x, rx) = rand_pair(&[8, 3], 18, -2.0, 2.0);
    let (w, rw) = rand_pair(&[3], 19, 0.5, 1.5);
    let (b, rb) = rand_pair(&[3], 20, -0.5, 0.5);
    let xt = x.transpose(0, 1).unwrap(); // [3,8] non-contiguous
    let (w8, rw8) = rand_pair(&[8], 21, 0.5, 1.5);
    let (b8, rb8) = rand_pair(&[8], 22, -0.5, 0.5);
    check_tol(
        &xt.layer_norm(&w8, &b8, 1e-5).unwrap(),
        &rx.transpose(0, 1).layer_norm(&rw8, &rb8, 1e-5),
        1e-5,
        1e-5,
    );
    check_tol(
        &xt.rms_norm(&w8, 1e-5).unwrap(),
        &rx.transpose(0, 1).rms_norm(&rw8, 1e-5),
        1e-5,
        1e-5,
    );
    // weight and bias as views
    let wv = w8.narrow(0, 0, 3).unwrap();
    check_tol(
        &x.layer_norm(&wv, &b, 1e-5).unwrap(),
        &rx.layer_norm(&rw8.narrow(0, 0, 3), &rb, 1e-5),
        1e-5,
        1e-5,
    );
    check_tol(
        &x.layer_norm(&w, &b, 1e-5).unwrap(),
        &rx.layer_norm(&rw, &rb, 1e-5),
        1e-5,
        1e-5,
    );
    // constant rows: variance 0, output = bias
    let c = Tensor::full(3.0, &[2, 3]).unwrap();
    check_tol(
        &c.layer_norm(&w, &b, 1e-5).unwrap(),
        &Ref::full(3.0, &[2, 3]).layer_norm(&rw, &rb, 1e-5),
        1e-5,
        1e-5,
    );
    // large offset: a one-pass E[x^2]-E[x]^2 variance would lose precision here
    let (y, ry) = rand_pair(&[4, 32], 23, -1.0, 1.0);
    let y_off = y.affine(1.0, 1000.0).unwrap();
    let ry_off = ry.affine(1.0, 1000.0).round_f32();
    let (w32, rw32) = rand_pair(&[32], 24, 0.5, 1.5);
    let (b32, rb32) = rand_pair(&[32], 25, -0.5, 0.5);
    check_tol(
        &y_off.layer_norm(&w32, &b32, 1e-5).unwrap(),
        &ry_off.layer_norm(&rw32, &rb32, 1e-5),
        1e-3,
        1e-3,
    );
}

// ---------------------------------------------------------------------------------
// views
// ---------------------------------------------------------------------------------

#[test]
fn views_materialise_correctly() {
    let (t, r) = rand_pair(&[2, 3, 4], 26, -3.0, 3.0);
    check(&t.reshape(&[6, 4]).unwrap(), &r.reshape(&[6, 4]), 0.0);
    check(&t.reshape(&[24]).unwrap(), &r.reshape(&[24]), 0.0);
    check(&t.reshape(&[4, 1, 6]).unwrap(), &r.reshape(&[4, 1, 6]), 0.0);
    check(&t.transpose(0, 1).unwrap(), &r.transpose(0, 1), 0.0);
    check(&t.transpose(-1, 0).unwrap(), &r.transpose(2, 0), 0.0);
    check(&t.transpose(1, 1).unwrap(), &r, 0.0);
    for perm in [
        [0, 1, 2],
        [2, 1, 0],
        [1, 2, 0],
        [2, 0, 1],
        [0, 2, 1],
        [1, 0, 2],
    ] {
        check(&t.permute(&perm).unwrap(), &r.permute(&perm), 0.0);
    }
    check(&t.narrow(0, 1, 1).unwrap(), &r.narrow(0, 1, 1), 0.0);
    check(&t.narrow(1, 0, 2).unwrap(), &r.narrow(1, 0, 2), 0.0);
    check(&t.narrow(-1, 1, 3).unwrap(), &r.narrow(2, 1, 3), 0.0);
    check(&t.narrow(2, 3, 1).unwrap(), &r.narrow(2, 3, 1), 0.0);
    for d in 0..=3usize {
        check(&t.unsqueeze(d).unwrap(), &r.unsqueeze(d), 0.0);
    }
    let u = t.unsqueeze(1).unwrap();
    check(&u.squeeze(1).unwrap(), &r, 0.0);
    check(&u.squeeze(-3).unwrap(), &r, 0.0);
    check(
        &t.broadcast_as(&[2, 2, 3, 4]).unwrap(),
        &r.broadcast_as(&[2, 2, 3, 4]),
        0.0,
    );
    check(
        &t.narrow(1, 1, 1).unwrap().broadcast_as(&[2, 5, 4]).unwrap(),
        &r.narrow(1, 1, 1).broadcast_as(&[2, 5, 4]),
        0.0,
    );
    check(&t.contiguous().unwrap(), &r, 0.0);
    check(
        &t.transpose(0, 2).unwrap().contiguous().unwrap(),
        &r.transpose(0, 2),
        0.0,
    );
}

#[test]
fn unsqueeze_negative_counts_from_the_end() {
    // -1 inserts a new last dim (as torch/numpy expand_dims do)
    let (t, r) = rand_pair(&[2, 3], 27, -1.0, 1.0);
    let u = t.unsqueeze(-1).unwrap();
    check(&u, &r.unsqueeze(2), 0.0);
    let u0 = t.unsqueeze(-3).unwrap();
    check(&u0, &r.unsqueeze(0), 0.0);
}

#[test]
fn views_of_views() {
    let (t, r) = rand_pair(&[4, 5, 6], 28, -3.0, 3.0);
    // reshape of a non-contiguous view must copy, not reinterpret
    let v = t.transpose(0, 2).unwrap().reshape(&[6, 20]).unwrap();
    check(&v, &r.transpose(0, 2).reshape(&[6, 20]), 0.0);
    let v = t.narrow(1, 1, 3).unwrap().reshape(&[12, 6]).unwrap();
    check(&v, &r.narrow(1, 1, 3).reshape(&[12, 6]), 0.0);
    let v = t
        .permute(&[1, 0, 2])
        .unwrap()
        .narrow(0, 2, 2)
        .unwrap()
        .transpose(1, 2)
        .unwrap()
        .reshape(&[2, 24])
        .unwrap();
    check(
        &v,
        &r.permute(&[1, 0, 2])
            .narrow(0, 2, 2)
            .transpose(1, 2)
            .reshape(&[2, 24]),
        0.0,
    );
    // reshape splitting the last dim of a contiguous narrow (stays a view)
    let v = t.narrow(0, 1, 2).unwrap().reshape(&[2, 5, 2, 3]).unwrap();
    check(&v, &r.narrow(0, 1, 2).reshape(&[2, 5, 2, 3]), 0.0);
    // narrow of narrow, broadcast of a narrowed view, then squeeze
    let v = t
        .narrow(2, 1, 4)
        .unwrap()
        .narrow(2, 2, 1)
        .unwrap()
        .squeeze(2)
        .unwrap();
    check(&v, &r.narrow(2, 1, 4).narrow(2, 2, 1).squeeze(2), 0.0);
    let v = t
        .narrow(0, 3, 1)
        .unwrap()
        .broadcast_as(&[2, 4, 5, 6])
        .unwrap()
        .transpose(0, 3)
        .unwrap();
    check(
        &v,
        &r.narrow(0, 3, 1)
            .broadcast_as(&[2, 4, 5, 6])
            .transpose(0, 3),
        0.0,
    );
    // views of a computed tensor, then an element-wise op
    let c = t.exp().unwrap();
    let v = c
        .transpose(0, 1)
        .unwrap()
        .narrow(2, 0, 3)
        .unwrap()
        .affine(2.0, -1.0)
        .unwrap();
    check_tol(
        &v,
        &r.exp()
            .round_f32()
            .transpose(0, 1)
            .narrow(2, 0, 3)
            .affine(2.0, -1.0),
        1e-6,
        1e-6,
    );
}

#[test]
fn views_integer_dtypes() {
    let u = Tensor::from_vec((0u32..12).collect(), &[3, 4]).unwrap();
    let r = Ref::new((0..12).map(|v| v as f64).collect(), &[3, 4]);
    check_u32(&u.transpose(0, 1).unwrap(), &r.transpose(0, 1));
    check_u32(&u.narrow(1, 1, 2).unwrap(), &r.narrow(1, 1, 2));
    check_u32(
        &u.transpose(0, 1).unwrap().reshape(&[2, 6]).unwrap(),
        &r.transpose(0, 1).reshape(&[2, 6]),
    );
    check_u32(
        &u.narrow(0, 2, 1)
            .unwrap()
            .broadcast_as(&[2, 4])
            .unwrap()
            .contiguous()
            .unwrap(),
        &r.narrow(0, 2, 1).broadcast_as(&[2, 4]),
    );
    let i = Tensor::from_vec((0i64..12).map(|v| -v).collect(), &[2, 3, 2]).unwrap();
    let ri = Ref::new((0..12).map(|v| -(v as f64)).collect(), &[2, 3, 2]);
    check_i64(&i.permute(&[2, 0, 1]).unwrap(), &ri.permute(&[2, 0, 1]));
    check_i64(
        &i.unsqueeze(0)
            .unwrap()
            .squeeze(0)
            .unwrap()
            .narrow(1, 1, 2)
            .unwrap(),
        &ri.narrow(1, 1, 2),
    );
}

// ---------------------------------------------------------------------------------
// cat and index_select
// ---------------------------------------------------------------------------------

#[test]
fn cat_along_every_dim() {
    let (a, ra) = rand_pair(&[2, 3, 4], 29, -1.0, 1.0);
    for d in 0..3usize {
        let mut db = vec![2, 3, 4];
        db[d] = 1;
        let mut dc = vec![2, 3, 4];
        dc[d] = 5;
        let (b, rb) = rand_pair(&db, 30 + d as u64, -1.0, 1.0);
        let (c, rc) = rand_pair(&dc, 40 + d as u64, -1.0, 1.0);
        check(
            &Tensor::cat(&[&a, &b, &c], d).unwrap(),
            &Ref::cat(&[&ra, &rb, &rc], d as isize),
            0.0,
        );
        check(
            &Tensor::cat(&[&b, &a], d as i64 - 3).unwrap(),
            &Ref::cat(&[&rb, &ra], d as isize),
            0.0,
        );
    }
    // one input
    check(&Tensor::cat(&[&a], 1).unwrap(), &ra, 0.0);
    // the same tensor twice
    check(
        &Tensor::cat(&[&a, &a], -1).unwrap(),
        &Ref::cat(&[&ra, &ra], 2),
        0.0,
    );
}

#[test]
fn cat_non_contiguous_and_integer() {
    let (a, ra) = rand_pair(&[4, 3], 50, -1.0, 1.0);
    let (b, rb) = rand_pair(&[3, 6], 51, -1.0, 1.0);
    let at = a.transpose(0, 1).unwrap(); // [3,4]
    let bn = b.narrow(1, 2, 3).unwrap(); // [3,3]
    let (c, rc) = rand_pair(&[3], 52, -1.0, 1.0);
    let cb = c.unsqueeze(1).unwrap().broadcast_as(&[3, 2]).unwrap();
    let out = Tensor::cat(&[&at, &bn, &cb], 1).unwrap();
    check(
        &out,
        &Ref::cat(
            &[
                &ra.transpose(0, 1),
                &rb.narrow(1, 2, 3),
                &rc.unsqueeze(1).broadcast_as(&[3, 2]),
            ],
            1,
        ),
        0.0,
    );
    // followed by an element-wise op
    check_tol(
        &out.tanh().unwrap(),
        &Ref::cat(
            &[
                &ra.transpose(0, 1),
                &rb.narrow(1, 2, 3),
                &rc.unsqueeze(1).broadcast_as(&[3, 2]),
            ],
            1,
        )
        .tanh(),
        1e-6,
        1e-7,
    );

    let u1 = Tensor::from_vec(vec![1u32, 2, 3, 4], &[2, 2]).unwrap();
    let u2 = Tensor::from_vec(vec![5u32, 6], &[2, 1]).unwrap();
    let u = Tensor::cat(&[&u1, &u2], 1).unwrap();
    assert_eq!(u.dtype(), DType::U32);
    assert_eq!(u.to_vec::<u32>().unwrap(), vec![1, 2, 5, 3, 4, 6]);
    let i1 = Tensor::from_vec(vec![-1i64, -2], &[2]).unwrap();
    let i2 = Tensor::from_vec(vec![i64::MAX], &[1]).unwrap();
    assert_eq!(
        Tensor::cat(&[&i1, &i2], 0)
            .unwrap()
            .to_vec::<i64>()
            .unwrap(),
        vec![-1, -2, i64::MAX]
    );
}

#[test]
fn index_select_u32_and_i64() {
    let (t, r) = rand_pair(&[5, 4, 3], 53, -3.0, 3.0);
    let cases: &[(usize, &[usize])] = &[
        (0, &[4, 0, 2]),
        (0, &[1, 1, 1, 1, 1, 1]),
        (1, &[3, 0]),
        (2, &[2]),
        (2, &[0, 1, 2, 2, 1, 0]),
    ];
    for &(d, idx) in cases {
        let iu = Tensor::from_vec(idx.iter().map(|&v| v as u32).collect(), &[idx.len()]).unwrap();
        let ii = Tensor::from_vec(idx.iter().map(|&v| v as i64).collect(), &[idx.len()]).unwrap();
        let e = r.index_select(idx, d as isize);
        check(&t.index_select(&iu, d).unwrap(), &e, 0.0);
        check(&t.index_select(&ii, d).unwrap(), &e, 0.0);
        check(&t.index_select(&iu, d as i64 - 3).unwrap(), &e, 0.0);
    }
}

#[test]
fn index_select_views_lazy_indices_and_integer_source() {
    let (t, r) = rand_pair(&[4, 6], 54, -3.0, 3.0);
    // non-contiguous source
    let tt = t.transpose(0, 1).unwrap(); // [6,4]
    let idx = Tensor::from_vec(vec![5u32, 0, 3], &[3]).unwrap();
    check(
        &tt.index_select(&idx, 0).unwrap(),
        &r.transpose(0, 1).index_select(&[5, 0, 3], 0),
        0.0,
    );
    check(
        &t.narrow(1, 2, 4)
            .unwrap()
            .index_select(&idx.narrow(0, 1, 2).unwrap(), 1)
            .unwrap(),
        &r.narrow(1, 2, 4).index_select(&[0, 3], 1),
        0.0,
    );
    // indices computed lazily: argmax of each row (an embedding-style gather)
    let am = t.argmax(1).unwrap(); // U32 [4], each in 0..6
    let expected_idx: Vec<usize> = r.argmax(1).data.iter().map(|&v| v as usize).collect();
    check(
        &tt.index_select(&am, 0).unwrap(),
        &r.transpose(0, 1).index_select(&expected_idx, 0),
        0.0,
    );
    // indices computed through a cast
    let fi = Tensor::from_vec(vec![0.0f32, 1.0, 1.0], &[3])
        .unwrap()
        .affine(2.0, 1.0)
        .unwrap()
        .to_dtype(DType::I64)
        .unwrap(); // 1,3,3
    check(
        &t.index_select(&fi, 0).unwrap(),
        &r.index_select(&[1, 3, 3], 0),
        0.0,
    );
    // embedding lookup on integer source
    let table = Tensor::from_vec((0i64..12).collect(), &[4, 3]).unwrap();
    let ids = Tensor::from_vec(vec![3i64, 0, 3], &[3]).unwrap();
    assert_eq!(
        table
            .index_select(&ids, 0)
            .unwrap()
            .to_vec::<i64>()
            .unwrap(),
        vec![9, 10, 11, 0, 1, 2, 9, 10, 11]
    );
    let ut = Tensor::from_vec((0u32..6).collect(), &[2, 3]).unwrap();
    let uid = Tensor::from_vec(vec![2u32, 2, 0], &[3]).unwrap();
    assert_eq!(
        ut.index_select(&uid, 1).unwrap().to_vec::<u32>().unwrap(),
        vec![2, 2, 0, 5, 5, 3]
    );
}

#[test]
fn zero_sized_tensors() {
    let (t, r) = rand_pair(&[4, 6], 54, -3.0, 3.0);
    // empty narrow at the end of a dim
    check(&t.narrow(1, 6, 0).unwrap(), &r.narrow(1, 6, 0), 0.0);
    // empty index list
    let empty = Tensor::from_vec(Vec::<u32>::new(), &[0]).unwrap();
    let e = t.index_select(&empty, 0).unwrap();
    assert_eq!(e.dims(), &[0, 6]);
    assert_eq!(read_f32(&e), Vec::<f32>::new());
    // element-wise op and a reduction over a zero-sized tensor
    let z = Tensor::zeros(&[0, 3], DType::F32).unwrap();
    assert_eq!(read_f32(&z.exp().unwrap()), Vec::<f32>::new());
    assert_eq!(read_f32(&z.sum(0).unwrap()), vec![0.0; 3]);
    assert_stream_usable();
}

// ---------------------------------------------------------------------------------
// chains, laziness, reuse
// ---------------------------------------------------------------------------------

#[test]
fn long_chain_single_read() {
    let (x, rx) = rand_pair(&[4, 8], 55, -1.0, 1.0);
    let (w, rw) = rand_pair(&[8, 6], 56, -1.0, 1.0);
    let (b, rb) = rand_pair(&[6], 57, -1.0, 1.0);
    let (s, rs) = rand_pair(&[4, 1], 58, 0.5, 1.5);
    let y = x
        .matmul(&w)
        .unwrap()
        .add(&b)
        .unwrap()
        .gelu()
        .unwrap()
        .mul(&s)
        .unwrap()
        .softmax(-1)
        .unwrap()
        .affine(10.0, -1.0)
        .unwrap()
        .maximum(&Tensor::zeros(&[6], DType::F32).unwrap())
        .unwrap()
        .transpose(0, 1)
        .unwrap()
        .sum_keepdim(1)
        .unwrap()
        .sqrt()
        .unwrap();
    let ry = rx
        .matmul(&rw)
        .add(&rb)
        .gelu()
        .mul(&rs)
        .softmax(-1)
        .affine(10.0, -1.0)
        .maximum(&Ref::full(0.0, &[6]))
        .transpose(0, 1)
        .sum(1, true)
        .sqrt();
    check_tol(&y, &ry, 1e-4, 1e-5);
}

#[test]
fn many_outputs_read_in_any_order() {
    let (x, rx) = rand_pair(&[3, 5], 59, -2.0, 2.0);
    let a = x.exp().unwrap();
    let b = a.add(&x).unwrap();
    let c = b.sum(1).unwrap();
    let d = b.max(0).unwrap();
    let e = a.mul(&b).unwrap().argmax(1).unwrap();
    let ra = rx.exp().round_f32();
    let rb = ra.add(&rx).round_f32();
    // read the last first, then the intermediates
    check_u32(&e, &ra.mul(&rb).argmax(1));
    check_tol(&d, &rb.max(0, false), 1e-6, 1e-6);
    check_tol(&a, &rx.exp(), 1e-6, 1e-6);
    check_tol(&c, &rb.sum(1, false), 1e-5, 1e-5);
    check_tol(&b, &rx.exp().add(&rx), 1e-6, 1e-6);
    // more ops on tensors that were already read
    let f = c.unsqueeze(1).unwrap().add(&b).unwrap();
    check_tol(&f, &rb.sum(1, true).add(&rb), 1e-5, 1e-5);
    streamfuse::sync().unwrap();
    check_tol(&a, &rx.exp(), 1e-6, 1e-6);
}

#[test]
fn dropped_intermediates_do_not_disturb_results() {
    let (x, rx) = rand_pair(&[16, 16], 60, -1.0, 1.0);
    let mut acc = x.affine(1.0, 0.0).unwrap();
    let mut racc = rx.clone();
    for i in 0..20 {
        let tmp = acc.mul(&x).unwrap();
        let tmp2 = tmp.tanh().unwrap();
        drop(tmp);
        acc = tmp2.add(&x).unwrap();
        racc = racc.mul(&rx).tanh().add(&rx);
        if i % 7 == 3 {
            streamfuse::sync().unwrap();
        }
    }
    check_tol(&acc, &racc, 1e-4, 1e-5);
}

#[test]
fn repeated_identical_programs_give_identical_results() {
    // the second run replays a cached plan over different tensors
    let run = |seed: u64| {
        let (x, rx) = rand_pair(&[6, 10], seed, -1.0, 1.0);
        let (w, rw) = rand_pair(&[10, 4], seed + 1, -1.0, 1.0);
        let y = x.matmul(&w).unwrap().relu().unwrap().softmax(1).unwrap();
        let ry = rx.matmul(&rw).relu().softmax(1);
        check_tol(&y, &ry, 1e-5, 1e-6);
        read_f32(&y)
    };
    let first = run(61);
    for _ in 0..3 {
        assert_eq!(run(61), first);
    }
    let other = run(70);
    assert_ne!(other, first);
}

#[test]
fn threads_share_weights_each_on_its_own_stream() {
    let (w, rw) = rand_pair(&[8, 8], 71, -1.0, 1.0);
    let w = std::sync::Arc::new(w);
    let rw = std::sync::Arc::new(rw);
    let handles: Vec<_> = (0..4u64)
        .map(|i| {
            let w = w.clone();
            let rw = rw.clone();
            std::thread::spawn(move || {
                for j in 0..5 {
                    let (x, rx) = rand_pair(&[3, 8], 100 * i + j, -1.0, 1.0);
                    let y = x.matmul(&w).unwrap().tanh().unwrap().sum(1).unwrap();
                    check_tol(&y, &rx.matmul(&rw).tanh().sum(1, false), 1e-5, 1e-5);
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}

// ---------------------------------------------------------------------------------
// larger shapes (blocked and parallel kernel paths)
// ---------------------------------------------------------------------------------

#[test]
fn large_elementwise_with_views_and_broadcast() {
    let (a, ra) = rand_pair(&[300, 1000], 80, -2.0, 2.0);
    let (b, rb) = rand_pair(&[1000], 81, 0.5, 1.5);
    let (c, rc) = rand_pair(&[1000, 300], 82, -1.0, 1.0);
    let y = a
        .mul(&b)
        .unwrap()
        .add(&c.transpose(0, 1).unwrap())
        .unwrap()
        .tanh()
        .unwrap();
    let ry = ra.mul(&rb).add(&rc.transpose(0, 1)).tanh();
    check_tol(&y, &ry, 1e-5, 1e-6);
    let n = a.narrow(1, 3, 997).unwrap().exp().unwrap();
    check_tol(&n, &ra.narrow(1, 3, 997).exp(), 1e-5, 1e-6);
}

#[test]
fn large_reductions_softmax_and_norms() {
    let (a, ra) = rand_pair(&[64, 768], 83, -2.0, 2.0);
    check_tol(&a.sum(0).unwrap(), &ra.sum(0, false), 1e-4, 1e-4);
    check_tol(&a.mean(1).unwrap(), &ra.mean(1, false), 1e-4, 1e-5);
    check(&a.max(0).unwrap(), &ra.max(0, false), 0.0);
    check_u32(&a.argmax(1).unwrap(), &ra.argmax(1));
    check_u32(&a.argmax(0).unwrap(), &ra.argmax(0));
    check_tol(&a.softmax(-1).unwrap(), &ra.softmax(-1), 1e-5, 1e-7);
    check_tol(&a.softmax(0).unwrap(), &ra.softmax(0), 1e-5, 1e-7);
    let (w, rw) = rand_pair(&[768], 84, 0.5, 1.5);
    let (b, rb) = rand_pair(&[768], 85, -0.5, 0.5);
    check_tol(
        &a.layer_norm(&w, &b, 1e-5).unwrap(),
        &ra.layer_norm(&rw, &rb, 1e-5),
        1e-4,
        1e-4,
    );
    check_tol(
        &a.rms_norm(&w, 1e-6).unwrap(),
        &ra.rms_norm(&rw, 1e-6),
        1e-4,
        1e-4,
    );
    let (s, rs) = rand_pair(&[4, 4096], 86, -8.0, 8.0);
    check_tol(&s.softmax(1).unwrap(), &rs.softmax(1), 1e-4, 1e-8);
}

#[test]
fn large_matmul() {
    let (a, ra) = rand_pair(&[256, 512], 87, -1.0, 1.0);
    let (b, rb) = rand_pair(&[512, 128], 88, -1.0, 1.0);
    check_tol(&a.matmul(&b).unwrap(), &ra.matmul(&rb), 1e-4, 1e-4);
    // transposed rhs, batched
    let (q, rq) = rand_pair(&[4, 100, 64], 89, -1.0, 1.0);
    let (k, rk) = rand_pair(&[4, 120, 64], 90, -1.0, 1.0);
    check_tol(
        &q.matmul(&k.transpose(1, 2).unwrap()).unwrap(),
        &rq.matmul(&rk.transpose(1, 2)),
        1e-4,
        1e-4,
    );
}

// ---------------------------------------------------------------------------------
// streams
// ---------------------------------------------------------------------------------

#[test]
fn lazy_tensor_read_and_used_on_another_thread() {
    // a pending tensor of this thread's stream is read and used by another thread
    let (x, rx) = rand_pair(&[5, 7], 91, -1.0, 1.0);
    let y = x.exp().unwrap().sum_keepdim(1).unwrap(); // pending here
    let ry = rx.exp().sum(1, true);
    let y2 = y.clone();
    let ry2 = ry.clone();
    let h = std::thread::spawn(move || {
        check_tol(&y2, &ry2, 1e-5, 1e-5);
        let z = y2.affine(2.0, 0.0).unwrap();
        check_tol(&z, &ry2.affine(2.0, 0.0), 1e-5, 1e-5);
        z
    });
    let z = h.join().unwrap();
    // the other thread's result is readable here, and this stream still works
    check_tol(&z, &ry.affine(2.0, 0.0), 1e-5, 1e-5);
    check_tol(
        &y.add(&z).unwrap(),
        &ry.mul(&Ref::full(3.0, &[1])),
        1e-5,
        1e-5,
    );
}

// ---------------------------------------------------------------------------------
// sizes around kernel thresholds (vector lanes, pairwise leaves, column tiles,
// parallel chunks) and layouts that pick each kernel loop
// ---------------------------------------------------------------------------------

#[test]
fn reductions_at_kernel_thresholds() {
    for (k, &n) in [1usize, 15, 16, 17, 255, 256, 257, 1023, 1025, 4097]
        .iter()
        .enumerate()
    {
        // over the last dim (contiguous rows), over dim 0 (row accumulation), and over a
        // transposed view (strided)
        let (t, r) = rand_pair(&[3, n], 900 + k as u64, -1.0, 1.0);
        check_tol(&t.sum(1).unwrap(), &r.sum(1, false), 1e-5, 1e-4);
        check(&t.max(1).unwrap(), &r.max(1, false), 0.0);
        check_u32(&t.argmax(1).unwrap(), &r.argmax(1));
        check_tol(&t.mean(1).unwrap(), &r.mean(1, false), 1e-5, 1e-6);
        let (c, rc) = rand_pair(&[n, 5], 950 + k as u64, -1.0, 1.0);
        check_tol(&c.sum(0).unwrap(), &rc.sum(0, false), 1e-5, 1e-4);
        check(&c.max(0).unwrap(), &rc.max(0, false), 0.0);
        check_u32(&c.argmax(0).unwrap(), &rc.argmax(0));
        let ct = c.transpose(0, 1).unwrap();
        let rct = rc.transpose(0, 1);
        check_tol(&ct.sum(1).unwrap(), &rct.sum(1, false), 1e-5, 1e-4);
        check(&ct.max_keepdim(1).unwrap(), &rct.max(1, true), 0.0);
        check_u32(&ct.argmax(1).unwrap(), &rct.argmax(1));
        check_tol(&ct.softmax(1).unwrap(), &rct.softmax(1), 1e-5, 1e-7);
    }
}

#[test]
fn large_parallel_reductions() {
    // enough work per op to be split across threads
    let (t, r) = rand_pair(&[600, 1100], 960, -1.0, 1.0);
    check_tol(&t.sum(0).unwrap(), &r.sum(0, false), 1e-4, 1e-4);
    check_tol(&t.sum(1).unwrap(), &r.sum(1, false), 1e-4, 1e-4);
    check(&t.max(0).unwrap(), &r.max(0, false), 0.0);
    check_u32(&t.argmax(0).unwrap(), &r.argmax(0));
    check_u32(&t.argmax(1).unwrap(), &r.argmax(1));
    let tt = t.transpose(0, 1).unwrap();
    let rt = r.transpose(0, 1);
    check_tol(&tt.sum(0).unwrap(), &rt.sum(0, false), 1e-4, 1e-4);
    check_tol(&tt.mean(1).unwrap(), &rt.mean(1, false), 1e-4, 1e-6);
    check(&tt.max(1).unwrap(), &rt.max(1, false), 0.0);
    let tn = t.narrow(1, 7, 1000).unwrap();
    check_tol(
        &tn.sum(1).unwrap(),
        &r.narrow(1, 7, 1000).sum(1, false),
        1e-4,
        1e-4,
    );
    // few outputs, very long rows
    let (l, rl) = rand_pair(&[2, 300_001], 961, -1.0, 1.0);
    check_tol(&l.sum(1).unwrap(), &rl.sum(1, false), 1e-4, 1e-3);
    check(&l.max(1).unwrap(), &rl.max(1, false), 0.0);
    check_u32(&l.argmax(1).unwrap(), &rl.argmax(1));
    // 3-D, reduce the middle dim
    let (m, rm) = rand_pair(&[40, 300, 50], 962, -1.0, 1.0);
    check_tol(&m.sum(1).unwrap(), &rm.sum(1, false), 1e-4, 1e-4);
    check(&m.max(1).unwrap(), &rm.max(1, false), 0.0);
    check_u32(&m.argmax(1).unwrap(), &rm.argmax(1));
}

#[test]
fn max_propagates_nan_on_every_path() {
    // a NaN at several positions of long rows, columns and strided lanes
    for &n in &[5usize, 16, 17, 300, 5000] {
        for &p in &[0usize, n / 2, n - 1] {
            let mut v = rand_vec(3 * n, 970 + n as u64, -1.0, 1.0);
            v[n + p] = f32::NAN; // row 1 of [3, n]
            let t = Tensor::from_vec(v, &[3, n]).unwrap();
            let m = read_f32(&t.max(1).unwrap());
            assert!(
                !m[0].is_nan() && m[1].is_nan() && !m[2].is_nan(),
                "n {n} p {p}: {m:?}"
            );
            let s = read_f32(&t.sum(1).unwrap());
            assert!(s[1].is_nan() && !s[0].is_nan(), "n {n} p {p}: {s:?}");
            // the same data transposed: column reduction, and strided
            let tt = t.transpose(0, 1).unwrap().contiguous().unwrap(); // [n, 3]
            let m = read_f32(&tt.max(0).unwrap());
            assert!(
                !m[0].is_nan() && m[1].is_nan() && !m[2].is_nan(),
                "col n {n} p {p}: {m:?}"
            );
            let m = read_f32(&t.transpose(0, 1).unwrap().max(0).unwrap());
            assert!(
                m[1].is_nan() && !m[0].is_nan(),
                "strided n {n} p {p}: {m:?}"
            );
        }
    }
}

#[test]
fn integer_reductions_wrap() {
    let u = Tensor::from_vec(vec![u32::MAX, 1, 5, u32::MAX, u32::MAX, 2], &[2, 3]).unwrap();
    assert_eq!(
        u.sum(1).unwrap().to_vec::<u32>().unwrap(),
        vec![5, u32::MAX.wrapping_mul(2).wrapping_add(2)]
    );
    let i = Tensor::from_vec(vec![i64::MAX, 1, i64::MIN, -1], &[2, 2]).unwrap();
    assert_eq!(
        i.sum(1).unwrap().to_vec::<i64>().unwrap(),
        vec![i64::MIN, i64::MAX]
    );
    assert_eq!(
        i.max(0).unwrap().to_vec::<i64>().unwrap(),
        vec![i64::MAX, 1]
    );
    let all_min = Tensor::from_vec(vec![i64::MIN; 3], &[3]).unwrap();
    assert_eq!(
        all_min.max(0).unwrap().to_vec::<i64>().unwrap(),
        vec![i64::MIN]
    );
    assert_eq!(all_min.argmax(0).unwrap().to_vec::<u32>().unwrap(), vec![0]);
    let zeros = Tensor::zeros(&[4], DType::U32).unwrap();
    assert_eq!(zeros.max(0).unwrap().to_vec::<u32>().unwrap(), vec![0]);
    assert_eq!(zeros.argmax(0).unwrap().to_vec::<u32>().unwrap(), vec![0]);
    // long integer rows
    let n = 10_000usize;
    let v: Vec<i64> = (0..n as i64).map(|x| x * 3 - 7000).collect();
    let want: i64 = v.iter().sum();
    let t = Tensor::from_vec(v, &[1, n]).unwrap();
    assert_eq!(t.sum(1).unwrap().to_vec::<i64>().unwrap(), vec![want]);
    assert_eq!(
        t.argmax(1).unwrap().to_vec::<u32>().unwrap(),
        vec![n as u32 - 1]
    );
}

#[test]
fn large_elementwise_broadcast_patterns() {
    let cases: &[(&[usize], &[usize])] = &[
        (&[3, 1, 70_000], &[5, 1]),
        (&[1, 40_000], &[7, 1]),
        (&[600, 500], &[]),
        (&[2, 300, 1, 400], &[300, 3, 1]),
    ];
    for (k, (da, db)) in cases.iter().enumerate() {
        let (a, ra) = rand_pair(da, 980 + k as u64, -2.0, 2.0);
        let (b, rb) = rand_pair(db, 990 + k as u64, 0.5, 2.0);
        for name in ["add", "div", "maximum"] {
            let out = apply_binary(name, &a, &b).unwrap();
            check_tol(&out, &ref_binary(name, &ra, &rb), 1e-6, 1e-7);
        }
        let out = a.mul(&b).unwrap().gelu().unwrap();
        check_tol(&out, &ra.mul(&rb).gelu(), 1e-5, 1e-6);
    }
    // a permuted 4-D view against a broadcast operand, large
    let (p, rp) = rand_pair(&[20, 30, 40, 50], 999, -1.0, 1.0);
    let pv = p.permute(&[3, 1, 0, 2]).unwrap();
    let (q, rq) = rand_pair(&[30, 1, 40], 998, -1.0, 1.0);
    check_tol(
        &pv.sub(&q).unwrap().abs().unwrap(),
        &rp.permute(&[3, 1, 0, 2]).sub(&rq).abs(),
        1e-6,
        1e-7,
    );
    // casts of large views
    let c = pv.affine(100.0, 0.0).unwrap().to_dtype(DType::I64).unwrap();
    let rc = rp
        .permute(&[3, 1, 0, 2])
        .affine(100.0, 0.0)
        .round_f32()
        .map(f64::trunc);
    check_i64(&c, &rc);
}

#[test]
fn matmul_with_broadcast_matrix_dims_and_many_batches() {
    // lhs rows all equal (row stride 0), rhs columns all equal (column stride 0)
    let (row, rrow) = rand_pair(&[1, 9], 1001, -1.0, 1.0);
    let (w, rw) = rand_pair(&[9, 6], 1002, -1.0, 1.0);
    let lhs = row.broadcast_as(&[5, 9]).unwrap();
    check_tol(
        &lhs.matmul(&w).unwrap(),
        &rrow.broadcast_as(&[5, 9]).matmul(&rw),
        1e-5,
        1e-5,
    );
    let (col, rcol) = rand_pair(&[9, 1], 1003, -1.0, 1.0);
    let (x, rx) = rand_pair(&[4, 9], 1004, -1.0, 1.0);
    let rhs = col.broadcast_as(&[9, 7]).unwrap();
    check_tol(
        &x.matmul(&rhs).unwrap(),
        &rx.matmul(&rcol.broadcast_as(&[9, 7])),
        1e-5,
        1e-5,
    );
    // a large product with broadcast rows (parallel gemm path)
    let (r2, rr2) = rand_pair(&[1, 300], 1005, -1.0, 1.0);
    let (w2, rw2) = rand_pair(&[300, 200], 1006, -1.0, 1.0);
    check_tol(
        &r2.broadcast_as(&[100, 300]).unwrap().matmul(&w2).unwrap(),
        &rr2.broadcast_as(&[100, 300]).matmul(&rw2),
        1e-4,
        1e-4,
    );
    // many small matrices (batch-parallel path), rhs shared across the batch
    let (a, ra) = rand_pair(&[512, 8, 8], 1007, -1.0, 1.0);
    let (b, rb) = rand_pair(&[8, 8], 1008, -1.0, 1.0);
    check_tol(&a.matmul(&b).unwrap(), &ra.matmul(&rb), 1e-5, 1e-5);
    // ... with permuted batch dims on both sides
    let (c, rc) = rand_pair(&[8, 16, 8, 32], 1009, -1.0, 1.0); // -> [16, 32, 8, 8]
    let (d, rd) = rand_pair(&[32, 8, 16, 8], 1010, -1.0, 1.0); // -> [16, 32, 8, 8]
    let cp = c.permute(&[1, 3, 0, 2]).unwrap();
    let dp = d.permute(&[2, 0, 1, 3]).unwrap();
    check_tol(
        &cp.matmul(&dp).unwrap(),
        &rc.permute(&[1, 3, 0, 2]).matmul(&rd.permute(&[2, 0, 1, 3])),
        1e-5,
        1e-5,
    );
    // large, both operands transposed
    let (e, re) = rand_pair(&[150, 130], 1011, -1.0, 1.0);
    let (f, rf) = rand_pair(&[170, 150], 1012, -1.0, 1.0);
    check_tol(
        &e.transpose(0, 1)
            .unwrap()
            .matmul(&f.transpose(0, 1).unwrap())
            .unwrap(),
        &re.transpose(0, 1).matmul(&rf.transpose(0, 1)),
        1e-4,
        1e-4,
    );
}

#[test]
fn large_index_select_and_cat() {
    let (t, r) = rand_pair(&[3000, 48], 1013, -1.0, 1.0);
    let mut rng = Rng::new(1014);
    let idx: Vec<usize> = (0..5000).map(|_| rng.below(3000) as usize).collect();
    let it = Tensor::from_vec(idx.iter().map(|&v| v as i64).collect(), &[idx.len()]).unwrap();
    check(
        &t.index_select(&it, 0).unwrap(),
        &r.index_select(&idx, 0),
        0.0,
    );
    let cols: Vec<usize> = (0..200).map(|_| rng.below(48) as usize).collect();
    let ct = Tensor::from_vec(cols.iter().map(|&v| v as u32).collect(), &[cols.len()]).unwrap();
    check(
        &t.transpose(0, 1).unwrap().index_select(&ct, 0).unwrap(),
        &r.transpose(0, 1).index_select(&cols, 0),
        0.0,
    );
    check(
        &t.index_select(&ct, 1).unwrap(),
        &r.index_select(&cols, 1),
        0.0,
    );
    // index tensors that are views: narrowed (offset) and broadcast (stride 0)
    let iv = it.narrow(0, 17, 100).unwrap();
    check(
        &t.index_select(&iv, 0).unwrap(),
        &r.index_select(&idx[17..117], 0),
        0.0,
    );
    let one = Tensor::from_vec(vec![7u32], &[1])
        .unwrap()
        .broadcast_as(&[300])
        .unwrap();
    check(
        &t.index_select(&one, 0).unwrap(),
        &r.index_select(&[7; 300], 0),
        0.0,
    );
    // large cat of views
    let (u, ru) = rand_pair(&[3000, 20], 1015, -1.0, 1.0);
    let out = Tensor::cat(
        &[
            &t.narrow(1, 5, 30).unwrap(),
            &u,
            &t.narrow(1, 0, 1).unwrap(),
        ],
        1,
    )
    .unwrap();
    check(
        &out,
        &Ref::cat(&[&r.narrow(1, 5, 30), &ru, &r.narrow(1, 0, 1)], 1),
        0.0,
    );
    let out0 = Tensor::cat(
        &[&t.transpose(0, 1).unwrap(), &u.transpose(0, 1).unwrap()],
        0,
    )
    .unwrap();
    check(
        &out0,
        &Ref::cat(&[&r.transpose(0, 1), &ru.transpose(0, 1)], 0),
        0.0,
    );
}

#[test]
fn cast_edge_values() {
    // `as` semantics: NaN -> 0, saturation at the integer range
    let f = Tensor::from_vec(
        vec![
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            5e9,
            -5e9,
            1e19,
            0.999,
        ],
        &[7],
    )
    .unwrap();
    assert_eq!(
        f.to_dtype(DType::U32).unwrap().to_vec::<u32>().unwrap(),
        vec![0, u32::MAX, 0, u32::MAX, 0, u32::MAX, 0]
    );
    assert_eq!(
        f.to_dtype(DType::I64).unwrap().to_vec::<i64>().unwrap(),
        vec![
            0,
            i64::MAX,
            i64::MIN,
            5_000_000_000,
            -5_000_000_000,
            i64::MAX,
            0
        ]
    );
    let u = Tensor::from_vec(vec![u32::MAX, 16_777_217], &[2]).unwrap();
    assert_eq!(
        u.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap(),
        vec![u32::MAX as f32, 16_777_217u32 as f32]
    );
    assert_eq!(
        u.to_dtype(DType::I64).unwrap().to_vec::<i64>().unwrap(),
        vec![u32::MAX as i64, 16_777_217]
    );
    let i = Tensor::from_vec(vec![-1i64, 1 << 40, i64::MAX], &[3]).unwrap();
    assert_eq!(
        i.to_dtype(DType::U32).unwrap().to_vec::<u32>().unwrap(),
        vec![0, u32::MAX, u32::MAX]
    );
    assert_eq!(
        i.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap(),
        vec![-1.0, (1u64 << 40) as f32, i64::MAX as f32]
    );
}

#[test]
fn pending_tensor_outlives_the_thread_that_recorded_it() {
    // the thread records ops and exits without reading: its stream is drained on exit
    // (or by the reader), and the tensors stay valid
    let (x, rx) = rand_pair(&[6, 9], 1100, -1.0, 1.0);
    let x2 = x.clone();
    let (y, z) = std::thread::spawn(move || {
        let y = x2.tanh().unwrap().mul(&x2).unwrap();
        let z = y.sum(0).unwrap();
        (y, z)
    })
    .join()
    .unwrap();
    let ry = rx.tanh().mul(&rx);
    check_tol(&z, &ry.sum(0, false), 1e-5, 1e-5);
    check_tol(&y, &ry, 1e-6, 1e-6);
    check_tol(&y.add(&x).unwrap(), &ry.add(&rx), 1e-6, 1e-6);
}

#[test]
fn tensors_dropped_on_another_thread_before_being_computed() {
    let (x, rx) = rand_pair(&[4, 4], 1101, -1.0, 1.0);
    let a = x.exp().unwrap();
    let b = a.add(&x).unwrap(); // both pending
    let keep = b.sum(1).unwrap();
    std::thread::spawn(move || {
        drop(a);
        drop(b);
    })
    .join()
    .unwrap();
    check_tol(&keep, &rx.exp().add(&rx).sum(1, false), 1e-5, 1e-5);
}

#[test]
fn small_queue_limit_flushes_mid_program() {
    // a queue limit far below the program's length: it flushes by itself many times
    streamfuse::set_queue_limit(3);
    let (x, rx) = rand_pair(&[5, 5], 1102, -1.0, 1.0);
    let mut acc = x.clone();
    let mut racc = rx.clone();
    let mut kept = Vec::new();
    for i in 0..40 {
        acc = acc.mul(&x).unwrap().tanh().unwrap().add(&x).unwrap();
        racc = racc.mul(&rx).tanh().add(&rx);
        if i % 10 == 0 {
            kept.push((acc.sum(1).unwrap(), racc.sum(1, false)));
        }
    }
    let out = read_f32(&acc);
    streamfuse::set_queue_limit(4096);
    assert_close_tol(&out, &racc.data, 1e-4, 1e-5);
    for (t, r) in &kept {
        check_tol(t, r, 1e-4, 1e-5);
    }
}

#[test]
fn many_threads_share_a_pending_tensor() {
    // one pending tensor read by several threads at once: each drains the owner's stream
    let (x, rx) = rand_pair(&[32, 32], 1103, -1.0, 1.0);
    let shared = x.matmul(&x).unwrap().tanh().unwrap(); // pending on this thread
    let rshared = rx.matmul(&rx).tanh();
    let handles: Vec<_> = (0..4)
        .map(|i| {
            let s = shared.clone();
            let rs = rshared.clone();
            std::thread::spawn(move || {
                let y = s.affine(i as f64, 1.0).unwrap().sum(1).unwrap();
                check_tol(&y, &rs.affine(i as f64, 1.0).sum(1, false), 1e-4, 1e-4);
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    check_tol(&shared, &rshared, 1e-5, 1e-5);
}

#[test]
fn cross_stream_ring_does_not_deadlock() {
    // each thread records a pending tensor, hands it to its neighbour, and uses the one
    // it receives in its own ops; every pair of streams drains each other in both orders
    use std::sync::mpsc;
    const N: usize = 4;
    const ROUNDS: usize = 20;
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let mut senders = Vec::new();
    let mut receivers = Vec::new();
    for _ in 0..N {
        let (tx, rx) = mpsc::channel::<(Tensor, Ref)>();
        senders.push(tx);
        receivers.push(Some(rx));
    }
    let mut handles = Vec::new();
    for i in 0..N {
        let tx = senders[(i + 1) % N].clone();
        let rx = receivers[i].take().unwrap();
        let done = done_tx.clone();
        handles.push(std::thread::spawn(move || {
            for round in 0..ROUNDS {
                let (x, rx_ref) = rand_pair(&[8, 8], (i * 1000 + round) as u64, -1.0, 1.0);
                let mine = x.matmul(&x).unwrap().tanh().unwrap(); // pending here
                tx.send((mine.clone(), rx_ref.matmul(&rx_ref).tanh()))
                    .unwrap();
                let (theirs, rtheirs) = rx.recv().unwrap();
                let y = theirs.add(&mine).unwrap().sum(1).unwrap();
                let ry = rtheirs.add(&rx_ref.matmul(&rx_ref).tanh()).sum(1, false);
                check_tol(&y, &ry, 1e-4, 1e-4);
            }
            done.send(()).unwrap();
        }));
    }
    drop(done_tx);
    for _ in 0..N {
        done_rx
            .recv_timeout(std::time::Duration::from_secs(60))
            .expect("a thread did not finish within 60 s (deadlock?) or panicked");
    }
    for h in handles {
        h.join().unwrap();
    }
}

#[test]
fn zero_sized_matmul_and_cat() {
    let a = Tensor::zeros(&[3, 0], DType::F32).unwrap();
    let b = Tensor::zeros(&[0, 4], DType::F32).unwrap();
    let c = a.matmul(&b).unwrap();
    assert_eq!(c.dims(), &[3, 4]);
    assert_eq!(read_f32(&c), vec![0.0; 12]);
    let (x, rx) = rand_pair(&[2, 3], 1200, -1.0, 1.0);
    let e = Tensor::zeros(&[2, 0], DType::F32).unwrap();
    check(&Tensor::cat(&[&e, &x, &e], 1).unwrap(), &rx, 0.0);
    assert_stream_usable();
}

#[test]
fn norm_weights_as_broadcast_views() {
    let (x, rx) = rand_pair(&[5, 8], 1201, -2.0, 2.0);
    let w = Tensor::full(1.5, &[1]).unwrap().broadcast_as(&[8]).unwrap();
    let (bb, rbb) = rand_pair(&[2, 8], 1202, -1.0, 1.0);
    let b = bb.narrow(0, 1, 1).unwrap().squeeze(0).unwrap();
    let rw = Ref::full(1.5, &[8]);
    let rb = rbb.narrow(0, 1, 1).squeeze(0);
    check_tol(
        &x.layer_norm(&w, &b, 1e-5).unwrap(),
        &rx.layer_norm(&rw, &rb, 1e-5),
        1e-5,
        1e-5,
    );
    check_tol(
        &x.rms_norm(&w, 1e-5).unwrap(),
        &rx.rms_norm(&rw, 1e-5),
        1e-5,
        1e-5,
    );
    // the input itself a broadcast (every row equal)
    let row = x.narrow(0, 2, 1).unwrap().broadcast_as(&[4, 8]).unwrap();
    check_tol(
        &row.layer_norm(&w, &b, 1e-5).unwrap(),
        &rx.narrow(0, 2, 1)
            .broadcast_as(&[4, 8])
            .layer_norm(&rw, &rb, 1e-5),
        1e-5,
        1e-5,
    );
}

/// `cumsum` worked out by hand: lengths to sequence ends (u32), a planned segment
/// (the sums of a transposed f32 product, over either dim, with fusion on and off), i64
/// with negatives, and its errors.
#[test]
fn cumsum_by_hand() {
    let lengths = Tensor::from_vec(vec![3u32, 1, 2], &[3]).unwrap();
    assert_eq!(
        lengths.cumsum(0).unwrap().to_vec::<u32>().unwrap(),
        [3, 4, 6]
    );
    let m = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]).unwrap();
    for fused in [true, false] {
        streamfuse::set_fusion(fused);
        let t = m.add(&m).unwrap().transpose(0, 1).unwrap(); // [[2, 8], [4, 10], [6, 12]]
        assert_eq!(
            read_f32(&t.cumsum(0).unwrap()),
            [2.0, 8.0, 6.0, 18.0, 12.0, 30.0]
        );
        assert_eq!(
            read_f32(&t.cumsum(-1).unwrap()),
            [2.0, 10.0, 4.0, 14.0, 6.0, 18.0]
        );
    }
    streamfuse::set_fusion(true);
    let i = Tensor::from_vec(vec![5i64, -7, 2], &[3]).unwrap();
    assert_eq!(i.cumsum(0).unwrap().to_vec::<i64>().unwrap(), [5, -2, 0]);
    let e = m.cumsum(2).unwrap_err().to_string();
    assert!(e.contains("cumsum"), "{e}");
    let w = m.to_dtype(DType::BF16).unwrap();
    let e = w.cumsum(0).unwrap_err().to_string();
    assert!(e.contains("bf16") || e.contains("BF16"), "{e}");
}

/// Outside memory read in place (`Tensor::from_external`): the values as given, kept
/// while a tensor or a pending op reads them and dropped after; a wrong length is an
/// error; memory that shrinks behind the engine's back fails the kernels that read it,
/// with an error, not a panic.
#[test]
fn external_memory_is_read_in_place_and_let_go() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    struct Outside {
        data: Vec<f32>,
        dropped: Arc<AtomicUsize>,
    }
    impl streamfuse::External<f32> for Outside {
        fn elements(&self) -> &[f32] {
            &self.data
        }
    }
    impl Drop for Outside {
        fn drop(&mut self) {
            self.dropped.fetch_add(1, Ordering::SeqCst);
        }
    }
    let dropped = Arc::new(AtomicUsize::new(0));
    let outside = |data: Vec<f32>| Outside {
        data,
        dropped: dropped.clone(),
    };
    let x = Tensor::from_external(outside(vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]), &[2, 3]).unwrap();
    let y = x.add(&x).unwrap().transpose(0, 1).unwrap();
    drop(x); // a pending op still reads it
    assert_eq!(dropped.load(Ordering::SeqCst), 0);
    assert_eq!(read_f32(&y), [2.0, 8.0, 4.0, 10.0, 6.0, 12.0]);
    assert_eq!(dropped.load(Ordering::SeqCst), 1);
    let e = Tensor::from_external(outside(vec![1.0; 5]), &[2, 3]).unwrap_err();
    assert!(e.to_string().contains("5 elements"), "{e}");
    assert_eq!(dropped.load(Ordering::SeqCst), 2);

    /// Gives fewer elements on every call after the first.
    struct Shrinking {
        data: Vec<u32>,
        calls: AtomicUsize,
    }
    impl streamfuse::External<u32> for Shrinking {
        fn elements(&self) -> &[u32] {
            let n = self.calls.fetch_add(1, Ordering::SeqCst);
            &self.data[..if n == 0 { 4 } else { 1 }]
        }
    }
    let s = Shrinking {
        data: vec![1, 2, 3, 4],
        calls: AtomicUsize::new(0),
    };
    let t = Tensor::from_external(s, &[4]).unwrap();
    let e = t.add(&t).unwrap().to_vec::<u32>().unwrap_err();
    assert!(e.to_string().contains("add"), "{e}");
}
