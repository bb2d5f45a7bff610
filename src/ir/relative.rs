//! The relative form of a segment: ids renumbered by first appearance, and a stable hash.
//!
//! Two runs of the same forward pass produce ops that differ only in their tensor ids.
//! Renumbering ids in the order they first appear in a segment (`t812 = add(t3, t511)`
//! becomes `r2 = add(r0, r1)`) makes those runs identical, so a plan made for the first
//! can be found and replayed for the second. [`RelativeBuilder`] does the renumbering as
//! ops are queued and folds each op (kind, parameters, dtypes, layouts, relative ids)
//! into a running 64-bit hash; [`RelativeBuilder::hash`] is the segment's key. The hash
//! uses a fixed function ([`StableHasher`]), so it is the same in every process.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};

use super::{Op, TensorId};

/// The ids of one op in relative form: inputs then output, numbered by first appearance
/// in the segment.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct RelativeOp {
    /// Relative ids of the inputs, in the op's input order.
    pub inputs: Vec<u32>,
    /// Relative id of the output, if the op has one.
    pub output: Option<u32>,
}

/// A 64-bit hasher with a fixed algorithm (a multiply-rotate mix over 8-byte words), so
/// keys are stable across runs and processes. Not for untrusted input.
#[derive(Clone, Debug)]
pub struct StableHasher(u64);

impl Default for StableHasher {
    fn default() -> Self {
        StableHasher(0x243f_6a88_85a3_08d3)
    }
}

impl StableHasher {
    #[inline(always)]
    fn mix(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
}

impl Hasher for StableHasher {
    fn finish(&self) -> u64 {
        // A final avalanche so that nearby states spread over all bits.
        let mut x = self.0;
        x ^= x >> 33;
        x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
        x ^= x >> 33;
        x
    }

    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            self.mix(u64::from_le_bytes(c.try_into().expect("chunk of 8")));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut buf = [0u8; 8];
            buf[..rest.len()].copy_from_slice(rest);
            self.mix(u64::from_le_bytes(buf) ^ ((rest.len() as u64) << 56));
        }
    }

    fn write_u8(&mut self, i: u8) {
        self.mix(i as u64);
    }
    fn write_u32(&mut self, i: u32) {
        self.mix(i as u64);
    }
    fn write_u64(&mut self, i: u64) {
        self.mix(i);
    }
    fn write_usize(&mut self, i: usize) {
        self.mix(i as u64);
    }
    fn write_isize(&mut self, i: isize) {
        self.mix(i as u64);
    }
}

/// A hasher for maps keyed by [`TensorId`]: one multiply, since ids are sequential
/// integers (not for untrusted keys).
#[derive(Clone, Copy, Debug, Default)]
pub struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ b as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }
    fn write_u64(&mut self, i: u64) {
        self.0 = (self.0 ^ i).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

/// Builds [`IdHasher`]s.
pub type IdHashBuilder = std::hash::BuildHasherDefault<IdHasher>;

/// Builds the relative form of a segment op by op, and its running hash.
#[derive(Clone, Debug, Default)]
pub struct RelativeBuilder {
    ids: HashMap<TensorId, u32, IdHashBuilder>,
    hasher: StableHasher,
    len: usize,
}

impl RelativeBuilder {
    /// An empty segment.
    #[cfg(test)]
    pub fn new() -> RelativeBuilder {
        RelativeBuilder::default()
    }

    fn relative(&mut self, id: TensorId) -> u32 {
        let next = self.ids.len() as u32;
        *self.ids.entry(id).or_insert(next)
    }

    /// Renumbers `op` and folds it into the segment hash.
    #[cfg(test)]
    pub fn push(&mut self, op: &Op) -> RelativeOp {
        self.push_into(op, Vec::with_capacity(op.inputs.len()))
    }

    /// [`push`](Self::push), writing the relative input ids into `inputs` (emptied
    /// first): a caller that recycles these vectors records without allocating.
    pub fn push_into(&mut self, op: &Op, mut inputs: Vec<u32>) -> RelativeOp {
        inputs.clear();
        for t in &op.inputs {
            let r = self.relative(t.id);
            inputs.push(r);
        }
        let output = op.output.as_ref().map(|t| self.relative(t.id));
        let h = &mut self.hasher;
        op.kind.hash(h);
        for (t, r) in op.inputs.iter().zip(&inputs) {
            r.hash(h);
            t.dtype.hash(h);
            t.layout.hash(h);
        }
        if let (Some(t), Some(r)) = (&op.output, output) {
            r.hash(h);
            t.dtype.hash(h);
            t.layout.hash(h);
        }
        self.len += 1;
        RelativeOp { inputs, output }
    }

    /// The stable hash of every op pushed so far, in order.
    pub fn hash(&self) -> u64 {
        self.hasher.finish() ^ self.len as u64
    }

    /// Forgets every op: the start of a new segment.
    pub fn clear(&mut self) {
        self.ids.clear();
        self.hasher = StableHasher::default();
        self.len = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{BinaryOp, DType, Layout, OpKind, TensorDesc};

    fn add(a: u64, b: u64, out: u64) -> Op {
        let d = |id| TensorDesc {
            id: TensorId(id),
            dtype: DType::F32,
            layout: Layout::contiguous(&[2, 3]),
        };
        Op {
            kind: OpKind::Binary(BinaryOp::Add),
            inputs: vec![d(a), d(b)],
            output: Some(d(out)),
        }
    }

    #[test]
    fn same_program_on_other_ids_has_same_key() {
        let mut x = RelativeBuilder::new();
        let r = x.push(&add(10, 11, 12));
        x.push(&add(12, 10, 13));
        let mut y = RelativeBuilder::new();
        y.push(&add(500, 7, 501));
        y.push(&add(501, 500, 502));
        assert_eq!(r.inputs, vec![0, 1]);
        assert_eq!(r.output, Some(2));
        assert_eq!(x.hash(), y.hash());
        let mut z = RelativeBuilder::new();
        z.push(&add(500, 7, 501));
        z.push(&add(7, 500, 502));
        assert_ne!(x.hash(), z.hash());
    }
}
