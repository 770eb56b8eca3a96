//! A double-ended queue kept in fixed-size chunks, for the merge's windows of kernel events.
//!
//! A `VecDeque` that holds a window of events grows by doubling: at the merge's peak on a dense
//! capture its buffers were 35-48 % unused and their growth copies were 3.4 % of the merge's
//! instructions (round 41 of docs/benchmarks-merge-ab.md). Here a queue grows one chunk at a
//! time and no entry is copied when it grows. Partly used chunks are the first (its front
//! evicted) and the last (still filling), and the halves of a chunk split by an insert in the
//! middle (a retransmission's lower offset, which moves at most one chunk's entries) or thinned
//! by an out-of-order eviction, until their entries leave.

use std::collections::VecDeque;

/// Entries per chunk: 64 index entries are 4 KiB, large enough that the chunk level costs a
/// few probes per search and small enough that a queue's partly used chunks stay small.
const CHUNK: usize = 64;

/// `pred` holds on a prefix of the indexes `0..len`: the length of that prefix, found by
/// galloping in from both ends before a binary search. Lookups land near one end (an RX
/// message's events are the newest, a TX message's are looked up a window later, among the
/// oldest), and a plain binary search over a window of a connection's events missed the cache
/// on most of its probes (perf: `partition_point` about a quarter of the merge's CPU time on a
/// real capture).
pub fn partition_point_from_ends(len: usize, pred: impl Fn(usize) -> bool) -> usize {
    // `pred` holds below `lo` and fails from `hi` on.
    let (mut lo, mut hi) = (0, len);
    let mut step = 1;
    while lo < hi {
        let back = hi - step.min(hi - lo);
        if pred(back) {
            lo = back + 1;
            break;
        }
        hi = back;
        if lo == hi {
            break;
        }
        let front = lo + step.min(hi - lo) - 1;
        if !pred(front) {
            hi = front;
            break;
        }
        lo = front + 1;
        step *= 2;
    }
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if pred(mid) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    lo
}

/// `c.partition_point(pred)` over the chunk's contiguous parts, galloping in from their ends:
/// a plain binary search over a chunk missed the cache on most of its probes (perf, round 42
/// of docs/benchmarks-merge-ab.md), where the answer is mostly near one end.
fn chunk_partition_point<T>(c: &VecDeque<T>, pred: impl Fn(&T) -> bool) -> usize {
    let (head, tail) = c.as_slices();
    match partition_point_from_ends(head.len(), |i| pred(&head[i])) {
        i if i < head.len() => i,
        i => i + partition_point_from_ends(tail.len(), |i| pred(&tail[i])),
    }
}

/// An entry's sort key: what [`ChunkedDeque::partition_point`] searches by.
pub trait Keyed {
    fn key(&self) -> u64;
}

/// A position in a [`ChunkedDeque`]: a chunk and an entry in it (at most its length).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cursor {
    chunk: usize,
    entry: usize,
}

/// Up to [`CHUNK`] entries, never none, and the key of the last: a search over chunks reads
/// only these headers, which lie together, not an entry in each chunk's own memory.
struct Chunk<T> {
    last_key: u64,
    entries: VecDeque<T>,
}

impl<T: Keyed> Chunk<T> {
    fn new(entries: VecDeque<T>) -> Chunk<T> {
        let mut chunk = Chunk {
            last_key: 0,
            entries,
        };
        chunk.update_key();
        chunk
    }

    fn update_key(&mut self) {
        self.last_key = self.entries.back().map_or(0, T::key);
    }
}

/// A deque of `T` in chunks of at most [`CHUNK`] entries; no chunk is empty.
pub struct ChunkedDeque<T> {
    chunks: VecDeque<Chunk<T>>,
}

impl<T> Default for ChunkedDeque<T> {
    fn default() -> Self {
        Self {
            chunks: VecDeque::new(),
        }
    }
}

impl<T: Keyed> ChunkedDeque<T> {
    pub fn is_empty(&self) -> bool {
        self.chunks.is_empty()
    }

    pub fn front(&self) -> Option<&T> {
        self.chunks.front().and_then(|c| c.entries.front())
    }

    pub fn back(&self) -> Option<&T> {
        self.chunks.back().and_then(|c| c.entries.back())
    }

    pub fn push_back(&mut self, entry: T) {
        let key = entry.key();
        match self.chunks.back_mut() {
            Some(last) if last.entries.len() < CHUNK => {
                last.entries.push_back(entry);
                last.last_key = key;
            }
            full_or_none => {
                // A queue's first chunk grows as a VecDeque does (most queues stay small); the
                // next ones are allocated whole, once.
                let mut entries = match full_or_none {
                    Some(_) => VecDeque::with_capacity(CHUNK),
                    None => VecDeque::new(),
                };
                entries.push_back(entry);
                self.chunks.push_back(Chunk::new(entries));
            }
        }
    }

    pub fn pop_front(&mut self) -> Option<T> {
        let first = self.chunks.front_mut()?;
        let entry = first.entries.pop_front();
        if first.entries.is_empty() {
            self.chunks.pop_front();
        }
        entry
    }

    /// Where `pred` of the entries' keys starts to fail, if it holds on a prefix of them.
    pub fn partition_point(&self, pred: impl Fn(u64) -> bool) -> Cursor {
        // A chunk whose last key passes lies wholly in the prefix. Most lookups end in the
        // newest or the oldest chunk: those are tried first.
        let chunks = &self.chunks;
        let n = chunks.len();
        let chunk = if n < 2 || pred(chunks[n - 2].last_key) {
            n.saturating_sub(1)
        } else if !pred(chunks[0].last_key) {
            0
        } else {
            partition_point_from_ends(n, |i| pred(chunks[i].last_key))
        };
        match chunks.get(chunk) {
            Some(c) => Cursor {
                chunk,
                entry: chunk_partition_point(&c.entries, |e| pred(e.key())),
            },
            None => self.end(),
        }
    }

    fn end(&self) -> Cursor {
        Cursor {
            chunk: self.chunks.len().saturating_sub(1),
            entry: self.chunks.back().map_or(0, |c| c.entries.len()),
        }
    }

    /// The entries from `at` on.
    pub fn iter_from(&self, at: Cursor) -> Iter<'_, T> {
        let current =
            (self.chunks.get(at.chunk)).map(|c| c.entries.range(at.entry.min(c.entries.len())..));
        Iter {
            chunks: &self.chunks,
            next_chunk: at.chunk + 1,
            current: current.unwrap_or_default(),
        }
    }

    /// The entries in `[from, to)`.
    pub fn range(&self, from: Cursor, to: Cursor) -> impl Iterator<Item = &T> {
        let count = self.distance(from, to);
        self.iter_from(from).take(count)
    }

    /// How many entries lie in `[from, to)` (0 if `to` is before `from`).
    fn distance(&self, from: Cursor, to: Cursor) -> usize {
        if to.chunk < from.chunk || (to.chunk == from.chunk && to.entry <= from.entry) {
            return 0;
        }
        let chunks = self.chunks.range(from.chunk..to.chunk);
        let whole: usize = chunks.map(|c| c.entries.len()).sum();
        whole + to.entry - from.entry
    }

    /// The entry just before `at`.
    pub fn before(&self, at: Cursor) -> Option<&T> {
        match at.entry.checked_sub(1) {
            Some(i) => self.chunks.get(at.chunk).and_then(|c| c.entries.get(i)),
            None => (at.chunk.checked_sub(1)).and_then(|c| self.chunks[c].entries.back()),
        }
    }

    /// Inserts `entry` at `at`, before the entry there; a full chunk is split in two.
    pub fn insert(&mut self, at: Cursor, entry: T) {
        let Some(chunk) = self.chunks.get_mut(at.chunk) else {
            return self.push_back(entry);
        };
        if chunk.entries.len() < CHUNK {
            chunk.entries.insert(at.entry, entry);
            return chunk.update_key();
        }
        let mut tail = chunk.entries.split_off(CHUNK / 2);
        tail.reserve_exact(CHUNK - tail.len());
        if at.entry <= CHUNK / 2 {
            chunk.entries.insert(at.entry, entry);
        } else {
            tail.insert(at.entry - CHUNK / 2, entry);
        }
        chunk.update_key();
        self.chunks.insert(at.chunk + 1, Chunk::new(tail));
    }

    /// Keeps the entries `keep` accepts, in order.
    pub fn retain(&mut self, mut keep: impl FnMut(&T) -> bool) {
        for chunk in self.chunks.iter_mut() {
            chunk.entries.retain(&mut keep);
            chunk.update_key();
        }
        self.chunks.retain(|c| !c.entries.is_empty());
    }

    pub fn iter(&self) -> Iter<'_, T> {
        self.iter_from(Cursor { chunk: 0, entry: 0 })
    }
}

/// The entries of a [`ChunkedDeque`] from a cursor on: a plain struct rather than a chain of
/// flattened iterators, which the compiler did not reduce to a loop over the current chunk.
pub struct Iter<'a, T> {
    chunks: &'a VecDeque<Chunk<T>>,
    next_chunk: usize,
    current: std::collections::vec_deque::Iter<'a, T>,
}

impl<'a, T> Iterator for Iter<'a, T> {
    type Item = &'a T;

    fn next(&mut self) -> Option<&'a T> {
        loop {
            if let Some(entry) = self.current.next() {
                return Some(entry);
            }
            self.current = self.chunks.get(self.next_chunk)?.entries.iter();
            self.next_chunk += 1;
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    impl Keyed for (u64, u64) {
        fn key(&self) -> u64 {
            self.0
        }
    }

    /// A small deterministic generator (xorshift64): no dependency, the same run every time.
    /// The merge's other randomized tests (index.rs) use it too.
    pub(crate) struct Rng(pub(crate) u64);

    impl Rng {
        pub(crate) fn below(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0 % n
        }
    }

    /// Every length up to 300, every threshold from below the least to above the greatest:
    /// the gallop from both ends finds the index a plain `partition_point` finds.
    #[test]
    fn partition_point_from_ends_is_partition_point() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for len in 0..300u64 {
            let mut v = Vec::new();
            let mut x = 0;
            for _ in 0..len {
                x += rng.below(3);
                v.push(x);
            }
            for t in 0..=x + 2 {
                let want = v.partition_point(|e| *e < t);
                assert_eq!(partition_point_from_ends(v.len(), |i| v[i] < t), want);
                let want = v.partition_point(|e| *e <= t);
                assert_eq!(partition_point_from_ends(v.len(), |i| v[i] <= t), want);
            }
        }
    }

    /// Sorted inserts (mostly at the back, some in the middle), pops at the front and retains,
    /// against a `VecDeque` doing the same: the same entries in the same order, the same
    /// partition points, ranges and predecessors, and no chunk above [`CHUNK`] or empty.
    #[test]
    fn chunked_deque_does_what_a_vecdeque_does() {
        for seed in 1..30u64 {
            let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
            let (mut chunked, mut plain) = (ChunkedDeque::default(), VecDeque::new());
            let mut top = 0u64;
            for step in 0..3000u64 {
                let key = match rng.below(10) {
                    0 => top.saturating_sub(rng.below(200)),
                    _ => {
                        top += rng.below(3);
                        top
                    }
                };
                let at = chunked.partition_point(|k| k <= key);
                chunked.insert(at, (key, step));
                let i = plain.partition_point(|(k, _)| *k <= key);
                plain.insert(i, (key, step));
                match rng.below(40) {
                    0..=2 => {
                        for _ in 0..rng.below(100) {
                            assert_eq!(chunked.pop_front(), plain.pop_front());
                        }
                    }
                    3 => {
                        let m = rng.below(5) + 2;
                        chunked.retain(|(_, s)| s % m != 0);
                        plain.retain(|(_, s)| s % m != 0);
                    }
                    _ => {}
                }
                for c in &chunked.chunks {
                    assert!(!c.entries.is_empty() && c.entries.len() <= CHUNK);
                    assert_eq!(c.last_key, c.entries.back().unwrap().0);
                }
                assert!(chunked.iter().eq(plain.iter()));
                assert_eq!(chunked.front(), plain.front());
                assert_eq!(chunked.back(), plain.back());
                let lo = top.saturating_sub(rng.below(300));
                let hi = lo + rng.below(100);
                let from = chunked.partition_point(|k| k < lo);
                let to = chunked.partition_point(|k| k <= hi);
                let (i, j) = (
                    plain.partition_point(|(k, _)| *k < lo),
                    plain.partition_point(|(k, _)| *k <= hi),
                );
                assert!(chunked.iter_from(from).eq(plain.range(i..)));
                assert!(chunked.range(from, to).eq(plain.range(i..j.max(i))));
                assert_eq!(chunked.before(from), i.checked_sub(1).map(|i| &plain[i]));
            }
        }
    }
}
