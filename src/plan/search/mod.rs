//! Exact search: branch and bound over canonical solutions (after MiniMalloc).
//!
//! # Canonical solutions
//!
//! Take any plan and let the buffers fall: lower each, in order of offset, as far
//! as it goes without meeting a buffer below it. The arena does not grow, and
//! every buffer now rests on the floor or on top of a buffer it meets in time.
//! So it is enough to search plans built like this: repeatedly pick an unplaced
//! item and put it at its *minimum offset*, the highest top of the placed items
//! that meet it, with offsets never decreasing from one placement to the next.
//! Moffitt (MiniMalloc, ASPLOS 2023) calls these canonical solutions, and prunes
//! the search over them with a few rules, which this module implements:
//!
//! * **Canonical order.** Placements go in non-decreasing (offset, preorder rank),
//!   so each canonical solution is built in exactly one way.
//! * **Dominance.** An item is never placed at or above the lowest top any other
//!   unplaced item could have: that one would fit underneath, and the solution
//!   where it is placed first is searched anyway.
//! * **Monotonic floor and section inference.** Items live in the same
//!   [section](super::instance::Sections) all meet each other, so every unplaced
//!   item of a section must go above the section's *floor* (the highest placed
//!   top there, and the current offset). If floor + the unplaced sizes of the
//!   section exceed the capacity, no completion exists.
//! * **Release dates.** Sharper, for the sections where a minimum offset just
//!   rose: the unplaced items of a section form one stack, each item no lower
//!   than its minimum offset. That is one machine with release dates, whose
//!   shortest schedule is known: the largest of (release + sizes released at or
//!   after it). MiniMalloc uses the smallest release only; this bound is at least
//!   as strong, and is computed only when two O(n) bounds on it disagree.
//! * **Hatless pruning.** If the item just placed meets no unplaced item, placing
//!   another item first instead cannot help; when its subtree fails, the node fails.
//! * **Dynamic decomposition.** When no unplaced item crosses a section boundary
//!   any more, the two sides are independent problems, solved one after the
//!   other. Each part is re-ranked by the preorder with the section totals left
//!   in it (as MiniMalloc does when it solves a part on its own); on the
//!   challenging benchmarks this is what makes the hard cases fall.
//!
//! The order in which candidates are tried is a *preorder* (for example TWA:
//! largest section total, then longest lifetime, then largest area) with ties
//! broken by minimum offset. No single preorder is best everywhere, so
//! [`search`] runs several in round robin with a node limit that doubles each
//! round, split over threads, and the first that finishes wins. The cheap checks
//! run before the expensive ones, which matters more than anything else for
//! speed: most candidates fail, and a failed candidate costs only the range scan.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use super::instance::{align_up, Item, Sections};

/// What a search found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// A plan within the capacity: offsets per item.
    Found(Vec<u64>),
    /// Proof that no plan fits the capacity.
    Infeasible,
    /// The time limit ended, or another thread won.
    Aborted,
}

/// The items, their overlaps and their sections, shared by all searches.
pub(crate) struct Graph<'a> {
    pub items: &'a [Item],
    pub sections: &'a Sections,
    adj: Vec<Vec<u32>>,
    members: Vec<Vec<u32>>,
    load: Vec<u64>,
}

impl<'a> Graph<'a> {
    pub fn new(items: &'a [Item], sections: &'a Sections) -> Graph<'a> {
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
    pub fn preorder(&self, keys: &str) -> Vec<u32> {
        let mut order: Vec<u32> = (0..self.items.len() as u32).collect();
        self.sort_by_keys(&mut order, keys, &self.load);
        order
    }

    /// Sorts `order` by the preorder `keys`, with `T` taken from `load`.
    fn sort_by_keys(&self, order: &mut [u32], keys: &str, load: &[u64]) {
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

enum Status {
    Found,
    NotFound,
    Limit,
    Stop,
}

struct Searcher<'g, 'a> {
    g: &'g Graph<'a>,
    keys: String,
    cap: u64,
    rank_item: Vec<u32>,
    off: Vec<u64>,
    solution: Vec<u64>,
    minoff: Vec<u64>,
    floor: Vec<u64>,
    total: Vec<u64>,
    /// `cuts[b]`: unplaced items living in both section `b` and `b + 1`.
    cuts: Vec<u32>,
    placed: Vec<bool>,
    nodes_left: u64,
    nodes: u64,
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
    fn new(
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

    fn run(&mut self, node_limit: u64) -> Status {
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

/// Preorders tried by the search, split over threads: thread `t` of `k` takes
/// every `k`-th one.
pub(crate) const PREORDERS: [&str; 6] = ["TWA", "TAW", "WAT", "AWT", "WTA", "ATW"];

/// Searches for a plan of height at most `cap`, racing the preorders over
/// `threads` threads until one finds a plan or a proof, the deadline passes or
/// `cancel` is set.
pub(crate) fn search(
    g: &Graph<'_>,
    cap: u64,
    threads: usize,
    deadline: Instant,
    cancel: &AtomicBool,
) -> Outcome {
    let n = g.items.len();
    if n == 0 {
        return Outcome::Found(Vec::new());
    }
    let threads = threads.clamp(1, PREORDERS.len());
    let orders: Vec<(String, Vec<u32>)> = PREORDERS
        .iter()
        .map(|p| (p.to_string(), g.preorder(p)))
        .collect();
    let stop = AtomicBool::new(false);
    let result = parking_lot::Mutex::new(None::<Outcome>);
    let worker = |t: usize| {
        let mine: Vec<&(String, Vec<u32>)> = orders.iter().skip(t).step_by(threads).collect();
        let mut limit = (n as u64).max(64);
        loop {
            for (keys, order) in mine.iter().map(|x| (&x.0, &x.1)) {
                if stop.load(Ordering::Relaxed) || cancel.load(Ordering::Relaxed) {
                    return;
                }
                // A searcher under a small node limit may end before it looks
                // at the clock: look here too.
                if Instant::now() >= deadline {
                    stop.store(true, Ordering::Relaxed);
                    return;
                }
                let mut s = Searcher::new(g, keys, cap, order, deadline, &stop, cancel);
                let t0 = Instant::now();
                let status = s.run(limit);
                log::trace!(
                    "plan search: capacity {cap}, preorder {keys}, thread {t}, node limit {limit}: {} nodes in {:?}",
                    s.nodes,
                    t0.elapsed()
                );
                let outcome = match status {
                    Status::Found => {
                        let offs: Vec<u64> = s.solution.clone();
                        Outcome::Found(offs)
                    }
                    Status::NotFound => Outcome::Infeasible,
                    Status::Limit => continue,
                    Status::Stop => {
                        if Instant::now() >= deadline {
                            stop.store(true, Ordering::Relaxed);
                        }
                        return;
                    }
                };
                let mut r = result.lock();
                if r.is_none() {
                    *r = Some(outcome);
                }
                stop.store(true, Ordering::Relaxed);
                return;
            }
            limit = limit.saturating_mul(2);
        }
    };
    // Deep recursion (one frame per item): run every worker on a big stack.
    std::thread::scope(|scope| {
        let w = &worker;
        let spawned: Vec<bool> = (0..threads)
            .map(|t| {
                std::thread::Builder::new()
                    .stack_size((4 << 20) + 1024 * n)
                    .spawn_scoped(scope, move || w(t))
                    .is_ok()
            })
            .collect();
        for (t, ok) in spawned.into_iter().enumerate() {
            if !ok {
                w(t);
            }
        }
    });
    result.into_inner().unwrap_or(Outcome::Aborted)
}

#[cfg(test)]
mod tests {
    use super::super::place::{place_in_order, Fit};
    use super::*;
    use std::time::Duration;

    use super::super::testutil::Lcg;

    fn random_items(rng: &mut Lcg, n: usize) -> Vec<Item> {
        (0..n)
            .map(|_| {
                let lower = rng.below(8);
                let upper = lower + 1 + rng.below(6);
                let size = 1 + rng.below(9);
                let align = [1, 1, 1, 2, 4][rng.below(5) as usize];
                Item {
                    lower,
                    upper,
                    size,
                    align,
                }
            })
            .collect()
    }

    fn permutations(n: usize) -> Vec<Vec<usize>> {
        if n == 0 {
            return vec![vec![]];
        }
        let mut out = Vec::new();
        for p in permutations(n - 1) {
            for k in 0..=p.len() {
                let mut q = p.clone();
                q.insert(k, n - 1);
                out.push(q);
            }
        }
        out
    }

    /// The optimum by brute force: the lowest first-fit height over all orders.
    fn brute(items: &[Item]) -> u64 {
        let s = Sections::new(items);
        permutations(items.len())
            .iter()
            .filter_map(|o| place_in_order(items, &s, o, Fit::First, u64::MAX))
            .map(|r| r.1)
            .min()
            .unwrap_or(0)
    }

    #[test]
    fn exact_search_matches_brute_force() {
        let mut rng = Lcg(7);
        for case in 0..150 {
            let n = 1 + (case % 7);
            let items = random_items(&mut rng, n);
            let opt = brute(&items);
            let s = Sections::elementary(&items);
            let g = Graph::new(&items, &s);
            let deadline = Instant::now() + Duration::from_secs(10);
            let cancel = AtomicBool::new(false);
            match search(&g, opt, 2, deadline, &cancel) {
                Outcome::Found(offs) => {
                    for i in 0..n {
                        assert_eq!(offs[i] % items[i].align, 0);
                        assert!(offs[i] + items[i].size <= opt);
                        for j in 0..i {
                            if items[i].meets(&items[j]) {
                                assert!(
                                    offs[i] + items[i].size <= offs[j]
                                        || offs[j] + items[j].size <= offs[i],
                                    "case {case}: {items:?} {offs:?}"
                                );
                            }
                        }
                    }
                }
                other => panic!("case {case}: optimum {opt} not found: {other:?} {items:?}"),
            }
            assert_eq!(
                search(&g, opt - 1, 1, deadline, &cancel),
                Outcome::Infeasible,
                "case {case}: {items:?}"
            );
        }
    }
}
