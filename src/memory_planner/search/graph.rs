//! The search's view of a problem: which items meet which (by section), the
//! items of each section and the section totals, and the preorders that rank
//! items for the search.

use super::super::instance::{Item, Sections};

/// The items, their overlaps and their sections, shared by all searches.
pub(crate) struct Graph<'a> {
    pub items: &'a [Item],
    pub sections: &'a Sections,
    pub(super) adj: Vec<Vec<u32>>,
    pub(super) members: Vec<Vec<u32>>,
    pub(super) load: Vec<u64>,
}

impl<'a> Graph<'a> {
    pub(crate) fn new(items: &'a [Item], sections: &'a Sections) -> Graph<'a> {
        let n = items.len();
        let mut members = vec![Vec::new(); sections.count];
        let mut load = vec![0u64; sections.count];
        for (i, it) in items.iter().enumerate() {
            for s in sections.lo[i]..sections.hi[i] {
                members[s as usize].push(i as u32);
                load[s as usize] += it.size;
            }
        }
        // Overlaps by a sweep over sections: i meets j iff their ranges intersect.
        let mut by_lo: Vec<u32> = (0..n as u32).collect();
        by_lo.sort_unstable_by_key(|&i| sections.lo[i as usize]);
        let mut adj = vec![Vec::new(); n];
        for (k, &i) in by_lo.iter().enumerate() {
            let hi = sections.hi[i as usize];
            for &j in &by_lo[k + 1..] {
                if sections.lo[j as usize] >= hi {
                    break;
                }
                if sections.hi[j as usize] > sections.lo[i as usize] {
                    adj[i as usize].push(j);
                    adj[j as usize].push(i);
                }
            }
        }
        Graph {
            items,
            sections,
            adj,
            members,
            load,
        }
    }

    /// Items in the order of a MiniMalloc-style preorder string: each letter a
    /// key, compared in turn, larger first. `W` lifetime width, `A` area, `T`
    /// largest section total, `Z` size, `O` overlap count, `C` sections spanned,
    /// `L`/`U` later start/end.
    pub(crate) fn preorder(&self, keys: &str) -> Vec<u32> {
        let mut order: Vec<u32> = (0..self.items.len() as u32).collect();
        self.sort_by_keys(&mut order, keys, &self.load);
        order
    }

    /// Sorts `order` by the preorder `keys`, with `T` taken from `load`.
    pub(super) fn sort_by_keys(&self, order: &mut [u32], keys: &str, load: &[u64]) {
        let s = self.sections;
        let key = |i: usize, c: char| -> u128 {
            let it = &self.items[i];
            let w = (it.upper - it.lower) as u128;
            match c {
                'W' => w,
                'A' => w * it.size as u128,
                'T' => (s.lo[i]..s.hi[i])
                    .map(|k| load[k as usize])
                    .max()
                    .unwrap_or(0) as u128,
                'Z' => it.size as u128,
                'O' => self.adj[i].len() as u128,
                'C' => (s.hi[i] - s.lo[i]) as u128,
                'L' => it.lower as u128,
                'U' => it.upper as u128,
                _ => 0,
            }
        };
        let chars: Vec<char> = keys.chars().collect();
        let mut keyed: Vec<(Vec<u128>, u32)> = order
            .iter()
            .map(|&i| (chars.iter().map(|&c| key(i as usize, c)).collect(), i))
            .collect();
        keyed.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        for (slot, (_, i)) in order.iter_mut().zip(keyed) {
            *slot = i;
        }
    }
}
