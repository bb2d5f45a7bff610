//! One depth-first search under one preorder and a node limit: its state (what is
//! placed where, minimum offsets, section floors and totals, with undo logs), the
//! placement of candidates in canonical order, the pruning rules described in the
//! parent module, and the split into independent parts.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use super::super::instance::align_up;
use super::Graph;

pub(super) enum Status {
    Found,
    NotFound,
    Limit,
    Stop,
}

pub(super) struct Searcher<'g, 'a> {
    g: &'g Graph<'a>,
    keys: String,
    cap: u64,
    rank_item: Vec<u32>,
    off: Vec<u64>,
    pub(super) solution: Vec<u64>,
    minoff: Vec<u64>,
    floor: Vec<u64>,
    total: Vec<u64>,
    /// `cuts[b]`: unplaced items living in both section `b` and `b + 1`.
    cuts: Vec<u32>,
    placed: Vec<bool>,
    nodes_left: u64,
    pub(super) nodes: u64,
    deadline: Instant,
    stop: &'g AtomicBool,
    cancel: &'g AtomicBool,
    min_log: Vec<(u32, u64)>,
    floor_log: Vec<(u32, u64)>,
    touched: Vec<(u32, u32)>,
    rel: Vec<(u64, u64)>,
    cover: Vec<i32>,
}

const NONE: u64 = u64::MAX;

impl<'g, 'a> Searcher<'g, 'a> {
    pub(super) fn new(
        g: &'g Graph<'a>,
        keys: &str,
        cap: u64,
        order: &[u32],
        deadline: Instant,
        stop: &'g AtomicBool,
        cancel: &'g AtomicBool,
    ) -> Self {
        let n = g.items.len();
        let count = g.sections.count;
        let mut cuts = vec![0u32; count];
        for i in 0..n {
            for b in g.sections.lo[i]..g.sections.hi[i] - 1 {
                cuts[b as usize] += 1;
            }
        }
        Searcher {
            g,
            keys: keys.to_string(),
            cap,
            rank_item: order.to_vec(),
            off: vec![NONE; n],
            solution: vec![NONE; n],
            minoff: vec![0; n],
            floor: vec![0; count],
            total: g.load.clone(),
            cuts,
            placed: vec![false; n],
            nodes_left: u64::MAX,
            nodes: 0,
            deadline,
            stop,
            cancel,
            min_log: Vec::new(),
            floor_log: Vec::new(),
            touched: Vec::new(),
            rel: Vec::new(),
            cover: vec![0; count + 1],
        }
    }

    pub(super) fn run(&mut self, node_limit: u64) -> Status {
        if self.total.iter().any(|&t| t > self.cap) {
            return Status::NotFound;
        }
        self.nodes_left = node_limit;
        let all: Vec<u32> = (0..self.rank_item.len() as u32).collect();
        let count = self.g.sections.count as u32;
        let cutpoints: Vec<u32> = (0..count.saturating_sub(1))
            .filter(|&b| self.cuts[b as usize] == 0)
            .collect();
        self.decompose(&all, &cutpoints, (0, count))
    }

    /// Solves the unplaced items of `ordering` as independent parts split after
    /// each boundary in `cutpoints` (sorted, inside `range`).
    fn decompose(&mut self, ordering: &[u32], cutpoints: &[u32], range: (u32, u32)) -> Status {
        if cutpoints.is_empty() {
            return self.dfs(ordering, (0, 0), range);
        }
        let mut starts = vec![range.0];
        starts.extend(cutpoints.iter().map(|&b| b + 1));
        starts.push(range.1);
        let s = self.g.sections;
        let mut solved_any = false;
        for w in starts.windows(2) {
            let (a, b) = (w[0], w[1]);
            let part: Vec<u32> = ordering
                .iter()
                .copied()
                .filter(|&r| {
                    let i = self.rank_item[r as usize] as usize;
                    !self.placed[i] && s.lo[i] < b && s.hi[i] > a
                })
                .collect();
            if part.is_empty() {
                continue;
            }
            solved_any = true;
            // Re-rank the part by the preorder with the totals left now, as
            // if it were a problem of its own; restore the ranks afterwards.
            let mut slots = part.clone();
            slots.sort_unstable();
            let saved: Vec<u32> = slots.iter().map(|&r| self.rank_item[r as usize]).collect();
            let mut local = saved.clone();
            self.g.sort_by_keys(&mut local, &self.keys, &self.total);
            for (&r, &i) in slots.iter().zip(&local) {
                self.rank_item[r as usize] = i;
            }
            let status = self.dfs(&slots, (0, 0), (a, b));
            for (&r, &i) in slots.iter().zip(&saved) {
                self.rank_item[r as usize] = i;
            }
            match status {
                Status::Found => {}
                other => return other,
            }
        }
        if !solved_any {
            self.record();
        }
        Status::Found
    }

    /// Copies the offsets of all placed items into the solution.
    fn record(&mut self) {
        for i in 0..self.off.len() {
            if self.placed[i] {
                self.solution[i] = self.off[i];
            }
        }
    }

    fn dfs(&mut self, parent: &[u32], last: (u64, u32), range: (u32, u32)) -> Status {
        if self.nodes_left == 0 {
            return Status::Limit;
        }
        self.nodes_left -= 1;
        self.nodes += 1;
        // Nodes cost from a fraction of a microsecond to a few hundred (wide
        // sections on resnet50): look at the clock often enough for both.
        if self.nodes & 63 == 0
            && (self.stop.load(Ordering::Relaxed)
                || self.cancel.load(Ordering::Relaxed)
                || Instant::now() >= self.deadline)
        {
            return Status::Stop;
        }
        let items = self.g.items;
        let s = self.g.sections;
        // The unplaced items of this part (handed to children) and the lowest
        // top any of them can have.
        let mut rest: Vec<u32> = Vec::with_capacity(parent.len());
        let mut min_height = NONE;
        for &r in parent {
            let i = self.rank_item[r as usize] as usize;
            if !self.placed[i] {
                rest.push(r);
                min_height = min_height.min(self.minoff[i] + items[i].size);
            }
        }
        if rest.is_empty() {
            self.record();
            return Status::Found;
        }
        // Candidates: canonical (not before the last placement) and not dominated
        // (below every unplaced item's lowest top), by (offset, rank).
        let mut ordering: Vec<(u64, u32)> = rest
            .iter()
            .map(|&r| (self.minoff[self.rank_item[r as usize] as usize], r))
            .filter(|&c| c.0 < min_height && c >= last)
            .collect();
        ordering.sort_unstable();
        let mut zero_cuts: Vec<u32> = Vec::new();
        for &(o, r) in &ordering {
            let i = self.rank_item[r as usize] as usize;
            let top = o + items[i].size;
            // Place i at o.
            self.off[i] = o;
            self.placed[i] = true;
            let min_mark = self.min_log.len();
            let floor_mark = self.floor_log.len();
            let mut ok = true;
            let mut hatless = true;
            self.touched.clear();
            for &j in &self.g.adj[i] {
                let j = j as usize;
                if self.placed[j] {
                    continue;
                }
                hatless = false;
                let want = align_up(top, items[j].align);
                if self.minoff[j] < want {
                    self.min_log.push((j as u32, self.minoff[j]));
                    self.minoff[j] = want;
                    if want + items[j].size > self.cap {
                        ok = false;
                    }
                    self.touched.push((s.lo[j], s.hi[j]));
                }
            }
            for sec in s.lo[i]..s.hi[i] {
                let sec = sec as usize;
                self.total[sec] -= items[i].size;
                if self.floor[sec] < top {
                    self.floor_log.push((sec as u32, self.floor[sec]));
                    self.floor[sec] = top;
                }
            }
            zero_cuts.clear();
            for b in s.lo[i]..s.hi[i] - 1 {
                self.cuts[b as usize] -= 1;
                if self.cuts[b as usize] == 0 && b >= range.0 && b + 1 < range.1 {
                    zero_cuts.push(b);
                }
            }
            // Monotonic floor and section inference, cheap and vectorized first.
            if ok {
                let (a, b) = (range.0 as usize, range.1 as usize);
                ok = self.floor[a..b]
                    .iter()
                    .zip(&self.total[a..b])
                    .all(|(&f, &t)| t == 0 || f.max(o) + t <= self.cap);
            }
            if ok {
                // All unplaced items of a section go above its lowest minimum
                // offset. Only a section where even that lowest one leaves too
                // little room matters, so stop at the first item with room.
                // Sections where a minimum offset rose: a coverage count over
                // the intervals of the items whose minimum offset changed.
                let (ra, rb) = (range.0 as usize, range.1 as usize);
                for &(a, b) in &self.touched {
                    let (a, b) = ((a as usize).max(ra), (b as usize).min(rb));
                    if a < b {
                        self.cover[a] += 1;
                        self.cover[b] -= 1;
                    }
                }
                let mut depth = 0i32;
                'sections: for sec in ra..rb {
                    depth += self.cover[sec];
                    if depth == 0 {
                        continue;
                    }
                    let total = self.total[sec];
                    if total == 0 {
                        continue;
                    }
                    // The unplaced items of a section all meet each other, so
                    // they stack: with release offsets r_j = max(minoff_j,
                    // floor, o), the lowest possible top is the largest
                    // r_j + (sizes of items released at or after r_j).
                    let base = self.floor[sec].max(o);
                    if base + total > self.cap {
                        ok = false;
                        break 'sections;
                    }
                    let room = self.cap - total;
                    self.rel.clear();
                    for &j in &self.g.members[sec] {
                        let j = j as usize;
                        if !self.placed[j] && self.minoff[j] > room.max(base) {
                            self.rel.push((self.minoff[j], items[j].size));
                        }
                    }
                    if self.rel.is_empty() {
                        continue;
                    }
                    // Cheap bounds on the stack first: it is at least the lowest
                    // release plus all these sizes, and at most the highest plus.
                    let (mut r_min, mut r_max, mut sum) = (NONE, 0u64, 0u64);
                    for &(r, size) in &self.rel {
                        r_min = r_min.min(r);
                        r_max = r_max.max(r);
                        sum += size;
                    }
                    if r_min + sum > self.cap {
                        ok = false;
                        break 'sections;
                    }
                    if r_max + sum <= self.cap {
                        continue;
                    }
                    self.rel.sort_unstable_by_key(|x| std::cmp::Reverse(x.0));
                    let mut above = 0u64;
                    for &(r, size) in &self.rel {
                        above += size;
                        if r + above > self.cap {
                            ok = false;
                            break 'sections;
                        }
                    }
                }
                self.cover[ra..=rb].iter_mut().for_each(|c| *c = 0);
            }
            let status = if !ok {
                Status::NotFound
            } else if zero_cuts.is_empty() {
                self.dfs(&rest, (o, r), range)
            } else {
                let cp = std::mem::take(&mut zero_cuts);
                let st = self.decompose(&rest, &cp, range);
                zero_cuts = cp;
                st
            };
            // Undo.
            for b in s.lo[i]..s.hi[i] - 1 {
                self.cuts[b as usize] += 1;
            }
            for sec in s.lo[i]..s.hi[i] {
                self.total[sec as usize] += items[i].size;
            }
            while let Some(&(sec, f)) = self.floor_log.get(floor_mark..).and_then(|l| l.last()) {
                self.floor[sec as usize] = f;
                self.floor_log.pop();
            }
            while let Some(&(j, m)) = self.min_log.get(min_mark..).and_then(|l| l.last()) {
                self.minoff[j as usize] = m;
                self.min_log.pop();
            }
            self.placed[i] = false;
            self.off[i] = NONE;
            match status {
                Status::NotFound => {}
                other => return other,
            }
            if hatless {
                break;
            }
        }
        Status::NotFound
    }
}
