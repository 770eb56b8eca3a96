//! Path order of segments: the order rows are listed in, for one run or a ladder of runs.
//!
//! Every request lists its segments in path order, but requests differ: a stage is missing in
//! some, two stages are merged into one (`rx_ip_tcp+rx_tcp_deliver`) in others, a run of a
//! ladder has stages the others lack. The order is therefore learned from all requests: each
//! pair of consecutive segments in a request says "this one comes before that one", and the
//! rows are a topological order of those relations, ties (and, should the data contain a
//! cycle, the cycle) broken by the order in which segments were first seen.

use std::collections::{BTreeSet, HashMap};

use super::key::SegmentKey;

#[derive(Debug, Default)]
pub struct PathOrder {
    /// Segments in first-seen order.
    keys: Vec<SegmentKey>,
    index: HashMap<SegmentKey, usize>,
    /// (before, after) as indices into `keys`.
    edges: BTreeSet<(usize, usize)>,
}

impl PathOrder {
    fn id(&mut self, key: &SegmentKey) -> usize {
        if let Some(&i) = self.index.get(key) {
            return i;
        }
        self.keys.push(key.clone());
        self.index.insert(key.clone(), self.keys.len() - 1);
        self.keys.len() - 1
    }

    /// Notes one request's segments, in its order.
    pub fn observe<'a>(&mut self, request: impl IntoIterator<Item = &'a SegmentKey>) {
        let mut previous: Option<usize> = None;
        for key in request {
            let id = self.id(key);
            if let Some(p) = previous.filter(|&p| p != id) {
                self.edges.insert((p, id));
            }
            previous = Some(id);
        }
    }

    /// Adds another run's relations (for a ladder); this run's first-seen order comes first.
    pub fn merge(&mut self, other: &PathOrder) {
        for key in &other.keys {
            self.id(key);
        }
        for &(a, b) in &other.edges {
            let (a, b) = (self.id(&other.keys[a]), self.id(&other.keys[b]));
            self.edges.insert((a, b));
        }
    }

    /// All segments in path order.
    pub fn sorted(&self) -> Vec<SegmentKey> {
        let n = self.keys.len();
        let mut indegree = vec![0usize; n];
        let mut after: Vec<Vec<usize>> = vec![Vec::new(); n];
        for &(a, b) in &self.edges {
            indegree[b] += 1;
            after[a].push(b);
        }
        let mut done = vec![false; n];
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            // The first-seen segment nothing pending precedes; in a cycle, the one with the
            // fewest pending predecessors.
            let next = (0..n)
                .filter(|&i| !done[i])
                .min_by_key(|&i| (indegree[i], i))
                .expect("one left");
            done[next] = true;
            for &b in &after[next] {
                indegree[b] = indegree[b].saturating_sub(1);
            }
            out.push(self.keys[next].clone());
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::{Kind, Layer};

    fn key(name: &str) -> SegmentKey {
        SegmentKey {
            name: name.into(),
            node: Some("A".into()),
            layer: Layer::Kernel,
            unit: "u".into(),
            kind: Kind::Compute,
            derived: false,
        }
    }

    fn observe(order: &mut PathOrder, names: &[&str]) {
        let keys: Vec<SegmentKey> = names.iter().map(|n| key(n)).collect();
        order.observe(&keys);
    }

    fn names(order: &PathOrder) -> Vec<String> {
        order.sorted().into_iter().map(|k| k.name).collect()
    }

    #[test]
    fn stages_seen_later_or_merged_land_in_path_order() {
        let mut o = PathOrder::default();
        // The first request lacks b and d and has c+d merged.
        observe(&mut o, &["a", "c", "e", "f"]);
        observe(&mut o, &["a", "b", "c", "d", "e", "f"]);
        observe(&mut o, &["a", "b", "c+d", "e", "f"]);
        assert_eq!(names(&o), ["a", "b", "c", "d", "c+d", "e", "f"]);
    }

    #[test]
    fn alternatives_and_ladders() {
        // Requests with the server half (x, y) or without it (w) between s and t.
        let mut run1 = PathOrder::default();
        observe(&mut run1, &["s", "w", "t"]);
        observe(&mut run1, &["s", "x", "y", "t"]);
        assert_eq!(names(&run1), ["s", "w", "x", "y", "t"]);
        // A second run adds a sidecar stage p before s.
        let mut run2 = PathOrder::default();
        observe(&mut run2, &["p", "s", "x", "y", "t"]);
        run1.merge(&run2);
        assert_eq!(names(&run1), ["p", "s", "w", "x", "y", "t"]);
    }

    #[test]
    fn a_cycle_does_not_lose_segments() {
        let mut o = PathOrder::default();
        observe(&mut o, &["a", "b", "c"]);
        observe(&mut o, &["c", "a"]);
        assert_eq!(names(&o), ["a", "b", "c"]);
    }
}
