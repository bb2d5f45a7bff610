//! The plan builder's values step: what the segment says about each value.
//!
//! Takes the segment (ops and their relative forms, same length and order) and gives,
//! for every relative id, a [`Value`] (dtype, layout, a first home, whether it
//! escapes) and its [`Facts`] (producer, readers, whether a Drop is in the segment,
//! root). Invariants of the result: a value's root is itself unless a View made it,
//! and then it is the root of the View's input (roots are never views); an output
//! escapes when it is made here and no Drop for it is in the segment, and a root
//! escapes when it or any view of it does; values made before the segment are
//! [`Home::Input`], views [`Home::View`] of their root, other outputs [`Home::Pooled`]
//! until later steps say otherwise. Fails with [`crate::Error::Internal`] when the
//! ops and their relative forms disagree, or when a value is made twice or after an
//! op of the segment read it.

use super::build::broken;
use super::{Home, Value};
use crate::error::Error;
use crate::ir::relative::RelativeOp;
use crate::ir::{DType, Layout, Op, OpKind};

/// What the segment says about one value.
#[derive(Clone, Debug, Default)]
pub(super) struct Facts {
    pub(super) producer: Option<usize>,
    pub(super) consumers: Vec<usize>,
    pub(super) dropped: bool,
    pub(super) root: u32,
}

/// Step 1: every value's dtype, layout, producer, readers, and whether it escapes.
/// Fails when the segment is not one the stream can have made (see [`check`]).
pub(super) fn describe(
    ops: &[&Op],
    rels: &[&RelativeOp],
) -> Result<(Vec<Value>, Vec<Facts>), Error> {
    check(ops, rels)?;
    let n = rels
        .iter()
        .flat_map(|r| r.inputs.iter().chain(r.output.iter()))
        .map(|&v| v as usize + 1)
        .max()
        .unwrap_or(0);
    let mut values = vec![
        Value {
            dtype: DType::F32,
            layout: Layout::contiguous(&[]),
            home: Home::Input,
            escapes: false,
        };
        n
    ];
    let mut facts: Vec<Facts> = (0..n)
        .map(|v| Facts {
            root: v as u32,
            ..Facts::default()
        })
        .collect();
    for (i, (op, rel)) in ops.iter().zip(rels).enumerate() {
        for (desc, &v) in op.inputs.iter().zip(&rel.inputs) {
            let f = &mut facts[v as usize];
            if op.kind == OpKind::Drop {
                f.dropped = true;
            } else {
                f.consumers.push(i);
            }
            if f.producer.is_none() {
                values[v as usize].dtype = desc.dtype;
                values[v as usize].layout = desc.layout;
            }
        }
        if let (Some(desc), Some(v)) = (&op.output, rel.output) {
            let f = &facts[v as usize];
            if f.producer.is_some() || !f.consumers.is_empty() || f.dropped {
                return Err(broken(
                    "values",
                    format!("op {i} makes r{v}, which an earlier op made or read"),
                ));
            }
            values[v as usize].dtype = desc.dtype;
            values[v as usize].layout = desc.layout;
            facts[v as usize].producer = Some(i);
            if op.kind == OpKind::View {
                let Some(&input) = rel.inputs.first() else {
                    return Err(broken("values", format!("view op {i} has no input")));
                };
                let root = facts[input as usize].root;
                facts[v as usize].root = root;
                values[v as usize].home = Home::View { root };
            } else {
                values[v as usize].home = Home::Pooled;
            }
        }
    }
    for v in 0..n {
        let f = &facts[v];
        values[v].escapes = f.producer.is_some() && !f.dropped;
    }
    // A root escapes when any of its views does.
    for v in 0..n {
        if values[v].escapes {
            let r = facts[v].root as usize;
            values[r].escapes |= facts[r].producer.is_some();
        }
    }
    Ok((values, facts))
}

/// Checks that `ops` and `rels` describe one segment: as many ops as relative forms,
/// and each op with as many inputs as its relative form and an output exactly when
/// its relative form has one.
fn check(ops: &[&Op], rels: &[&RelativeOp]) -> Result<(), Error> {
    if ops.len() != rels.len() {
        return Err(broken(
            "values",
            format!("{} ops but {} relative forms", ops.len(), rels.len()),
        ));
    }
    for (i, (op, rel)) in ops.iter().zip(rels).enumerate() {
        if op.inputs.len() != rel.inputs.len() || op.output.is_some() != rel.output.is_some() {
            return Err(broken(
                "values",
                format!(
                    "op {i} ({}) has {} inputs and {} output, its relative form {} and {}",
                    op.kind.name(),
                    op.inputs.len(),
                    usize::from(op.output.is_some()),
                    rel.inputs.len(),
                    usize::from(rel.output.is_some()),
                ),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fusion::testutil::{add, drop_of, exp, op, relative};

    fn describe_ops(ops: &[Op]) -> Result<(Vec<Value>, Vec<Facts>), Error> {
        let rels = relative(ops);
        describe(
            &ops.iter().collect::<Vec<_>>(),
            &rels.iter().collect::<Vec<_>>(),
        )
    }

    #[test]
    fn producers_readers_and_drops() {
        // x (input 0) -> a = exp(x) -> b = a + x; a dropped, b kept.
        let (values, facts) = describe_ops(&[exp(0, 1), add(1, 0, 2), drop_of(1)]).unwrap();
        assert_eq!(values.len(), 3);
        assert_eq!(
            (facts[0].producer, &facts[0].consumers[..]),
            (None, &[0, 1][..])
        );
        assert_eq!(
            (facts[1].producer, &facts[1].consumers[..]),
            (Some(0), &[1][..])
        );
        assert_eq!((facts[2].producer, facts[2].consumers.len()), (Some(1), 0));
        assert!(facts[1].dropped && !facts[2].dropped);
        let homes: Vec<Home> = values.iter().map(|v| v.home).collect();
        assert_eq!(homes, [Home::Input, Home::Pooled, Home::Pooled]);
        let escapes: Vec<bool> = values.iter().map(|v| v.escapes).collect();
        assert_eq!(
            escapes,
            [false, false, true],
            "inputs never escape; a is dropped"
        );
    }

    #[test]
    fn views_read_their_root_and_make_it_escape() {
        // a = exp(x), v = view(a), w = view(v); a dropped, w kept.
        let ops = [
            exp(0, 1),
            op(OpKind::View, &[1], Some(2)),
            op(OpKind::View, &[2], Some(3)),
            drop_of(1),
            drop_of(2),
        ];
        let (values, facts) = describe_ops(&ops).unwrap();
        let roots: Vec<u32> = facts.iter().map(|f| f.root).collect();
        assert_eq!(roots, [0, 1, 1, 1], "a view of a view reads the first root");
        assert_eq!(values[3].home, Home::View { root: 1 });
        assert_eq!(values[3].layout, ops[2].output.as_ref().unwrap().layout);
        assert!(values[3].escapes && values[1].escapes, "w keeps its root a");
        assert!(!values[2].escapes);
    }

    #[test]
    fn a_view_of_an_input_does_not_make_the_input_escape() {
        let (values, facts) = describe_ops(&[op(OpKind::View, &[0], Some(1))]).unwrap();
        assert_eq!(facts[1].root, 0);
        assert!(values[1].escapes && !values[0].escapes);
    }

    #[test]
    fn a_segment_the_stream_cannot_make_is_an_internal_error() {
        let ops = [exp(0, 1), exp(1, 2)];
        let rels = relative(&ops);
        let internal = |r: Result<(Vec<Value>, Vec<Facts>), Error>| match r {
            Err(Error::Internal { msg }) => msg,
            other => panic!("expected an internal error, got {other:?}"),
        };
        let ops_ref: Vec<&Op> = ops.iter().collect();
        let msg = internal(describe(&ops_ref, &[&rels[0]]));
        assert!(msg.contains("2 ops but 1 relative forms"), "{msg}");
        // An op with an input its relative form does not list.
        let mut short = rels[0].clone();
        short.inputs.clear();
        let msg = internal(describe(&ops_ref[..1], &[&short]));
        assert!(msg.contains("op 0 (exp) has 1 inputs"), "{msg}");
        // A value read before it is made, or made twice.
        let msg = internal(describe_ops(&[exp(0, 1), exp(2, 1)]));
        assert!(
            msg.contains("op 1 makes r1, which an earlier op made"),
            "{msg}"
        );
        let msg = internal(describe_ops(&[exp(1, 2), exp(0, 1)]));
        assert!(msg.contains("op 1 makes r0"), "{msg}"); // tensor 1 is r0: read by op 0
    }
}
