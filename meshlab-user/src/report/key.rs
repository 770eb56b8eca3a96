//! The identity of a segment across requests, shared by the aggregation (aggregate.rs) and
//! the path order of rows (order.rs).

use crate::schema::{Kind, Layer};

/// Identity of a segment across requests: the same name measured on the same node in the same
/// place. Derived segments have no node.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SegmentKey {
    pub name: String,
    pub node: Option<String>,
    pub layer: Layer,
    pub unit: String,
    pub kind: Kind,
    pub derived: bool,
}
