//! Node-local time as types (docs/clock-discipline.md).
//!
//! Every timestamp the merge handles is a [`NodeTime`]: nanoseconds of one node's
//! CLOCK_MONOTONIC, tagged with that node. It has no subtraction. Durations come only from
//! [`NodeClock`], a per-node token with a unique *brand* lifetime made by [`with_clock`]:
//! `clock.at(t)` admits a `NodeTime` of that node (a runtime check, done once at the door) and
//! returns an [`Instant<'n>`]; two instants can be subtracted only when their brands are the same
//! lifetime, which the compiler checks. Across nodes the only operation is [`difference`] of two
//! spans, the difference method.
//!
//! ```compile_fail
//! use meshlab_user::merge::time::{with_clock, NodeId, NodeTime};
//! let (a, b) = (NodeId(0), NodeId(1));
//! with_clock(a, |clock_a| {
//!     with_clock(b, |clock_b| {
//!         let ta = clock_a.at(NodeTime::new(a, 10)).unwrap();
//!         let tb = clock_b.at(NodeTime::new(b, 20)).unwrap();
//!         // Instants of two nodes: the brands differ, this does not compile.
//!         let _ = ta.span_to(tb);
//!     })
//! });
//! ```

use std::marker::PhantomData;

/// Index of a node in the merge (into the list of node names).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(pub u16);

/// A timestamp on one node's CLOCK_MONOTONIC. Comparable for ordering within a node's stream;
/// not subtractable.
///
/// Packed to 10 bytes (not 16): every [`super::event::Stamp`] holds one, and the merge holds
/// a window of stamps (its kernel index above all); x86 reads the unaligned `ns` at no cost.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(Rust, packed(2))]
pub struct NodeTime {
    node: NodeId,
    ns: u64,
}

impl NodeTime {
    pub fn new(node: NodeId, ns: u64) -> Self {
        Self { node, ns }
    }

    pub fn node(self) -> NodeId {
        self.node
    }

    /// The absolute value, for output (`start_ns`) and for ordering one node's events.
    /// Absolute values shift with clock skew; never build a duration from them.
    pub fn absolute_ns(self) -> u64 {
        self.ns
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TimeError {
    #[error("timestamp of node #{got} handed to the clock of node #{clock}")]
    CrossNode { clock: u16, got: u16 },
    #[error("span would be negative: end {end_ns} is before start {start_ns}")]
    Negative { start_ns: u64, end_ns: u64 },
    #[error("difference would be negative: outer span {outer_ns} ns < inner span {inner_ns} ns")]
    NegativeDifference { outer_ns: u64, inner_ns: u64 },
}

/// Invariant lifetime marker: `Brand<'a>` and `Brand<'b>` never unify unless `'a == 'b`.
type Brand<'n> = PhantomData<fn(&'n ()) -> &'n ()>;

/// The clock of one node, branded with a lifetime no other `NodeClock` shares.
pub struct NodeClock<'n> {
    node: NodeId,
    brand: Brand<'n>,
}

/// Runs `f` with the clock of `node`. The higher-ranked closure gives every call a fresh brand.
pub fn with_clock<R>(node: NodeId, f: impl for<'n> FnOnce(NodeClock<'n>) -> R) -> R {
    f(NodeClock {
        node,
        brand: PhantomData,
    })
}

impl<'n> NodeClock<'n> {
    /// Admits a timestamp of this clock's node; a timestamp of another node is refused.
    pub fn at(&self, t: NodeTime) -> Result<Instant<'n>, TimeError> {
        if t.node != self.node {
            return Err(TimeError::CrossNode {
                clock: self.node.0,
                got: t.node.0,
            });
        }
        Ok(Instant {
            ns: t.ns,
            brand: PhantomData,
        })
    }
}

/// A point on the branded node's clock.
#[derive(Clone, Copy, Debug)]
pub struct Instant<'n> {
    ns: u64,
    brand: Brand<'n>,
}

impl<'n> Instant<'n> {
    /// The span from `self` to `later` on the same node; negative spans are an error.
    pub fn span_to(self, later: Instant<'n>) -> Result<Span<'n>, TimeError> {
        if later.ns < self.ns {
            return Err(TimeError::Negative {
                start_ns: self.ns,
                end_ns: later.ns,
            });
        }
        Ok(Span {
            start: self,
            end: later,
        })
    }

    pub fn absolute_ns(self) -> u64 {
        self.ns
    }
}

/// A non-negative interval on one node's clock.
#[derive(Clone, Copy, Debug)]
pub struct Span<'n> {
    start: Instant<'n>,
    end: Instant<'n>,
}

impl<'n> Span<'n> {
    pub fn dur_ns(&self) -> u64 {
        self.end.ns - self.start.ns
    }

    pub fn start(&self) -> Instant<'n> {
        self.start
    }
}

/// The difference method, the only cross-node figure: an outer span on one node minus an inner
/// span on another, e.g. network round trip = client (request left -> response arrived) minus
/// server (request arrived -> response left). Skew cancels because each span is node-local.
pub fn difference<'a, 'b>(outer: Span<'a>, inner: Span<'b>) -> Result<u64, TimeError> {
    let (outer_ns, inner_ns) = (outer.dur_ns(), inner.dur_ns());
    outer_ns
        .checked_sub(inner_ns)
        .ok_or(TimeError::NegativeDifference { outer_ns, inner_ns })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clock_refuses_another_nodes_timestamp() {
        let other = NodeTime::new(NodeId(1), 5);
        let err = with_clock(NodeId(0), |clock| clock.at(other).unwrap_err());
        assert_eq!(err, TimeError::CrossNode { clock: 0, got: 1 });
    }

    #[test]
    fn spans_are_node_local_and_never_negative() {
        let n = NodeId(3);
        with_clock(n, |clock| {
            let a = clock.at(NodeTime::new(n, 100)).unwrap();
            let b = clock.at(NodeTime::new(n, 250)).unwrap();
            assert_eq!(a.span_to(b).unwrap().dur_ns(), 150);
            assert_eq!(
                b.span_to(a).unwrap_err(),
                TimeError::Negative {
                    start_ns: 250,
                    end_ns: 100
                }
            );
        });
    }

    #[test]
    fn difference_is_skew_free_and_refuses_negative_results() {
        let (c, s) = (NodeId(0), NodeId(1));
        for skew in [0u64, 7, 16_340_000_000] {
            let rtt = with_clock(c, |cc| {
                with_clock(s, |sc| {
                    let outer = cc
                        .at(NodeTime::new(c, 1_000))
                        .unwrap()
                        .span_to(cc.at(NodeTime::new(c, 9_000)).unwrap())
                        .unwrap();
                    let inner = sc
                        .at(NodeTime::new(s, skew + 3_000))
                        .unwrap()
                        .span_to(sc.at(NodeTime::new(s, skew + 5_500)).unwrap())
                        .unwrap();
                    (difference(outer, inner), difference(inner, outer))
                })
            });
            assert_eq!(rtt.0, Ok(5_500));
            assert_eq!(
                rtt.1,
                Err(TimeError::NegativeDifference {
                    outer_ns: 2_500,
                    inner_ns: 8_000
                })
            );
        }
    }
}
