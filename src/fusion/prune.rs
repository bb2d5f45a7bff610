//! The plan builder's prune step: dead work out.
//!
//! Takes the values and facts of [`super::values`] and gives which ops are live. An op
//! is live when its output is; a value is live when it escapes or a live op reads it.
//! Invariants after it: the facts list only live readers, every output that is not
//! live is [`Home::Dead`], and Drops are never live. A dead op gets no kernel and no
//! memory in the later steps.

use super::values::Facts;
use super::{Home, Value};
use crate::ir::relative::RelativeOp;

/// Step 1b: removes dead work. A value is live when it escapes or a live op reads it
/// (a view reads its input, so a live view keeps its root live); an op is live when
/// its output is. One backward pass settles it, since every reader of a value comes
/// after its producer in the queue. Dead ops are forgotten as readers (so they keep
/// nothing alive and split no fused chain), and their outputs become [`Home::Dead`]:
/// no kernel, no memory. Returns which ops are live (Drops never are).
///
/// This is safe because a Drop is queued only when the value's last handle goes, after
/// every op that reads it was queued; and an op of another stream that reads a pending
/// value first drains the producer, so the value is made in an earlier segment, where
/// it escapes. A value whose Drop is in the segment is read by nothing outside it.
pub(super) fn prune(rels: &[&RelativeOp], facts: &mut [Facts], values: &mut [Value]) -> Vec<bool> {
    let mut live_value: Vec<bool> = values.iter().map(|v| v.escapes).collect();
    let mut live = vec![false; rels.len()];
    for (i, rel) in rels.iter().enumerate().rev() {
        if rel.output.is_some_and(|v| live_value[v as usize]) {
            live[i] = true;
            for &v in &rel.inputs {
                live_value[v as usize] = true;
            }
        }
    }
    for (v, f) in facts.iter_mut().enumerate() {
        f.consumers.retain(|&c| live[c]);
        if f.producer.is_some() && !live_value[v] {
            values[v].home = Home::Dead;
        }
    }
    live
}

#[cfg(test)]
mod tests {
    use super::prune;
    use crate::fusion::testutil::{drop_of, exp, op, plan, relative};
    use crate::fusion::values::describe;
    use crate::fusion::{Home, Kernel};
    use crate::ir::{Op, OpKind};

    #[test]
    fn dead_ops_are_forgotten_as_readers() {
        // a = exp(x) kept; b = exp(a) and c = exp(b) dropped unread.
        let ops = [exp(0, 1), exp(1, 2), exp(2, 3), drop_of(3), drop_of(2)];
        let rels = relative(&ops);
        let rels: Vec<_> = rels.iter().collect();
        let (mut values, mut facts) = describe(&ops.iter().collect::<Vec<&Op>>(), &rels).unwrap();
        assert_eq!(facts[1].consumers, [1], "before: b reads a");
        let live = prune(&rels, &mut facts, &mut values);
        assert_eq!(
            live,
            [true, false, false, false, false],
            "Drops are never live"
        );
        assert!(facts[1].consumers.is_empty() && facts[2].consumers.is_empty());
        let homes: Vec<Home> = values.iter().map(|v| v.home).collect();
        assert_eq!(homes, [Home::Input, Home::Pooled, Home::Dead, Home::Dead]);
    }

    #[test]
    fn work_dropped_unread_gets_no_kernel_and_no_memory() {
        // fill -> exp -> matmul -> softmax, every result dropped.
        let p = plan(&[
            op(OpKind::Fill { value: 0 }, &[], Some(1)),
            exp(1, 2),
            op(OpKind::MatMul, &[2, 2], Some(3)),
            op(OpKind::Softmax, &[3], Some(4)),
            drop_of(4),
            drop_of(3),
            drop_of(1),
            drop_of(2),
        ]);
        assert_eq!((p.kernels.len(), p.arena_len, p.dead_ops), (0, 0, 4));
        assert!(p.values.iter().all(|v| v.home == Home::Dead && !v.escapes));
        let shown = p.to_string();
        assert!(
            shown.starts_with("plan: 8 ops (4 dead) -> 0 kernels"),
            "{shown}"
        );
    }

    #[test]
    fn dead_readers_keep_nothing_alive_and_split_no_chain() {
        // x (input 0) -> a = exp -> b = exp, b escapes; a is also read by a matmul and
        // a softmax whose results are dropped: one fused kernel, a never stored.
        let p = plan(&[
            exp(0, 1),
            op(OpKind::MatMul, &[1, 1], Some(2)),
            op(OpKind::Softmax, &[2], Some(3)),
            exp(1, 4),
            drop_of(3),
            drop_of(2),
            drop_of(1),
        ]);
        assert_eq!((p.kernels.len(), p.arena_len, p.dead_ops), (1, 0, 2), "{p}");
        let Kernel::Fused {
            outputs, input_ids, ..
        } = &p.kernels[0]
        else {
            panic!("{p}")
        };
        assert_eq!((&outputs[..], &input_ids[..]), (&[4][..], &[0][..]), "{p}");
        assert_eq!(p.values[1].home, Home::Fused);
        assert_eq!(
            (p.values[2].home, p.values[3].home),
            (Home::Dead, Home::Dead)
        );
    }

    #[test]
    fn a_kept_view_keeps_its_dropped_root_and_a_dropped_view_dies() {
        // a = exp(x) dropped, its view v kept: a is made. b = exp(x) kept, its view w
        // dropped: w is dead, b is made.
        let p = plan(&[
            exp(0, 1),
            op(OpKind::View, &[1], Some(2)),
            drop_of(1),
            exp(0, 3),
            op(OpKind::View, &[3], Some(4)),
            drop_of(4),
        ]);
        assert_eq!(p.dead_ops, 1, "{p}");
        assert!(p.values[1].escapes && p.values[2].escapes, "{p}");
        assert_eq!(p.values[2].home, Home::View { root: 1 });
        assert_eq!(p.values[4].home, Home::Dead);
        let written: Vec<u32> = p.kernels.iter().flat_map(|k| k.io().1.to_vec()).collect();
        assert_eq!(written, [1, 3], "{p}");
    }
}
