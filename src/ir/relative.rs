//! The relative form of a segment: ids renumbered by first appearance, and a stable hash.
//!
//! Two runs of the same forward pass produce ops that differ only in their tensor ids.
//! Renumbering ids in the order they first appear in a segment (`t812 = add(t3, t511)`
//! becomes `r2 = add(r0, r1)`) makes those runs identical, so a plan made for the first
//! can be found and replayed for the second. [`RelativeBuilder`] does the renumbering as
//! ops are queued and folds each op (kind, parameters, dtypes, layouts, relative ids)
//! into a running 64-bit hash; [`RelativeBuilder::hash`] is the segment's key. The hash
//! uses a fixed function ([`StableHasher`]), so it is the same in every process.
//!
//! **Symbols.** Layouts enter the key as their *equality pattern*, not their values:
//! every number of a layout (dims, strides, offset) other than 0 and 1 is a *symbol*,
//! numbered by its first appearance in the segment ([`RelativeBuilder::symbols`] keeps
//! their values in that order), and the key hashes the symbol's number ([`code`]). Two
//! segments of the same ops whose shapes differ only in some dims (a sequence length)
//! therefore share a key, as long as the same numbers are equal in both (a length that
//! happens to equal the head size is another pattern, and another key). 0 and 1 stay
//! constants: they change broadcasting and fusion. [`SymLayout`] is a layout written
//! in those codes, which the plan cache keeps to confirm a key op by op.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};

use super::{Layout, Op, TensorId, MAX_RANK};

/// The ids of one op in relative form: inputs then output, numbered by first appearance
/// in the segment.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub(crate) struct RelativeOp {
    /// Relative ids of the inputs, in the op's input order.
    pub inputs: Vec<u32>,
    /// Relative id of the output, if the op has one.
    pub output: Option<u32>,
}

/// A 64-bit hasher with a fixed algorithm (a multiply-rotate mix over 8-byte words), so
/// keys are stable across runs and processes. Not for untrusted input.
#[derive(Clone, Debug)]
pub(crate) struct StableHasher(u64);

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
pub(crate) struct IdHasher(u64);

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
    fn write_usize(&mut self, i: usize) {
        self.write_u64(i as u64);
    }
}

/// Builds [`IdHasher`]s.
pub(crate) type IdHashBuilder = std::hash::BuildHasherDefault<IdHasher>;

/// The code of layout number `x` in a segment: 0 and 1 are themselves, any other
/// value is 2 + its symbol (its rank among the segment's distinct numbers by first
/// appearance).
pub(crate) fn code(x: usize, symbols: &[usize]) -> Option<u32> {
    if x <= 1 {
        return Some(x as u32);
    }
    symbols.iter().position(|&s| s == x).map(|i| i as u32 + 2)
}

/// Whether code `c` stands for the number `x` when the segment's symbols have the
/// values `symbols`.
#[inline]
pub(crate) fn code_matches(c: u32, x: usize, symbols: &[usize]) -> bool {
    match c {
        0 | 1 => x == c as usize,
        _ => symbols.get(c as usize - 2) == Some(&x),
    }
}

/// A layout in codes ([`code`]): its rank, then the codes of its dims, strides and
/// offset. Kept inline (no heap).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct SymLayout {
    rank: u8,
    codes: [u32; 2 * MAX_RANK + 1],
}

impl SymLayout {
    /// The codes of `layout` given the segment's symbols; `None` if a number of it is
    /// not among them.
    pub(crate) fn new(layout: &Layout, symbols: &[usize]) -> Option<SymLayout> {
        let mut out = SymLayout {
            rank: layout.rank() as u8,
            codes: [0; 2 * MAX_RANK + 1],
        };
        for (c, &x) in out.codes.iter_mut().zip(numbers(layout)) {
            *c = code(x, symbols)?;
        }
        Some(out)
    }

    /// Whether `layout` is this pattern at the segment's symbol values `symbols`.
    pub(crate) fn matches(&self, layout: &Layout, symbols: &[usize]) -> bool {
        layout.rank() == self.rank as usize
            && self
                .codes
                .iter()
                .zip(numbers(layout))
                .all(|(&c, &x)| code_matches(c, x, symbols))
    }
}

/// The numbers of a layout in key order: dims, strides, offset.
fn numbers(layout: &Layout) -> impl Iterator<Item = &usize> {
    layout
        .dims()
        .iter()
        .chain(layout.strides())
        .chain(std::iter::once(&layout.offset))
}

/// Builds the relative form of a segment op by op, and its running hash.
#[derive(Clone, Debug, Default)]
pub(crate) struct RelativeBuilder {
    ids: HashMap<TensorId, u32, IdHashBuilder>,
    hasher: StableHasher,
    len: usize,
    /// The segment's symbols: its distinct layout numbers above 1, by first appearance.
    symbols: Vec<usize>,
    /// The symbol of each of those numbers.
    symbol_of: HashMap<usize, u32, IdHashBuilder>,
}

/// Folds `layout` into `h` in codes, numbering new symbols as they appear.
fn hash_layout(
    h: &mut StableHasher,
    layout: &Layout,
    symbols: &mut Vec<usize>,
    symbol_of: &mut HashMap<usize, u32, IdHashBuilder>,
) {
    h.write_u8(layout.rank() as u8);
    for &x in numbers(layout) {
        let c = if x <= 1 {
            x as u32
        } else {
            let next = symbols.len() as u32;
            let s = *symbol_of.entry(x).or_insert(next);
            if s == next {
                symbols.push(x);
            }
            s + 2
        };
        h.write_u32(c);
    }
}

impl RelativeBuilder {
    /// An empty segment.
    #[cfg(test)]
    pub(crate) fn new() -> RelativeBuilder {
        RelativeBuilder::default()
    }

    fn relative(&mut self, id: TensorId) -> u32 {
        let next = self.ids.len() as u32;
        *self.ids.entry(id).or_insert(next)
    }

    /// Renumbers `op` and folds it into the segment hash.
    #[cfg(test)]
    pub(crate) fn push(&mut self, op: &Op) -> RelativeOp {
        self.push_into(op, Vec::with_capacity(op.inputs.len()))
    }

    /// `push` (the tests' form), writing the relative input ids into `inputs` (emptied
    /// first): a caller that recycles these vectors records without allocating.
    pub(crate) fn push_into(&mut self, op: &Op, mut inputs: Vec<u32>) -> RelativeOp {
        inputs.clear();
        for t in &op.inputs {
            let r = self.relative(t.id);
            inputs.push(r);
        }
        let output = op.output.as_ref().map(|t| self.relative(t.id));
        let (h, syms, of) = (&mut self.hasher, &mut self.symbols, &mut self.symbol_of);
        op.kind.hash(h);
        for (t, r) in op.inputs.iter().zip(&inputs) {
            r.hash(h);
            t.dtype.hash(h);
            hash_layout(h, &t.layout, syms, of);
        }
        if let (Some(t), Some(r)) = (&op.output, output) {
            r.hash(h);
            t.dtype.hash(h);
            hash_layout(h, &t.layout, syms, of);
        }
        self.len += 1;
        RelativeOp { inputs, output }
    }

    /// The stable hash of every op pushed so far, in order.
    pub(crate) fn hash(&self) -> u64 {
        self.hasher.finish() ^ self.len as u64
    }

    /// The values of the segment's symbols, by symbol number (see [`code`]).
    pub(crate) fn symbols(&self) -> &[usize] {
        &self.symbols
    }

    /// Forgets every op: the start of a new segment.
    pub(crate) fn clear(&mut self) {
        self.ids.clear();
        self.symbols.clear();
        self.symbol_of.clear();
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

    fn add_of(dims: &[usize]) -> Op {
        let d = |id| TensorDesc {
            id: TensorId(id),
            dtype: DType::F32,
            layout: Layout::contiguous(dims),
        };
        Op {
            kind: OpKind::Binary(BinaryOp::Add),
            inputs: vec![d(1), d(2)],
            output: Some(d(3)),
        }
    }

    #[test]
    fn shapes_with_the_same_equality_pattern_share_a_key() {
        let key = |dims: &[usize]| {
            let mut b = RelativeBuilder::new();
            b.push(&add_of(dims));
            (b.hash(), b.symbols().to_vec())
        };
        let (k7, s7) = key(&[7, 384]);
        let (k9, s9) = key(&[9, 384]);
        assert_eq!(k7, k9);
        assert_eq!((&s7, &s9), (&vec![7, 384], &vec![9, 384]));
        // A length equal to the width, or a dim of 1, is another pattern.
        assert_ne!(key(&[384, 384]).0, k7);
        assert_ne!(key(&[1, 384]).0, k7);
        let l = Layout::contiguous(&[9, 384]);
        let sym = SymLayout::new(&l, &s9).unwrap();
        assert!(sym.matches(&Layout::contiguous(&[7, 384]), &[7, 384]));
        assert!(!sym.matches(&Layout::contiguous(&[7, 384]), &[9, 384]));
        assert!(SymLayout::new(&l, &[9]).is_none());
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
