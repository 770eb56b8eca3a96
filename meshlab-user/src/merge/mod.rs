//! `meshlab merge`: joins the kernel recordings and userland probe files of all nodes and
//! attributes every nanosecond of each request (docs/segments.md, docs/clock-discipline.md).
//!
//! Data flow: [`input`] (files, nodes, clock samples, skew) -> [`stream`] (per node, time order
//! through a bounded reorder window; records reduced by [`reduce`]) -> [`join`] (kernel
//! [`index`], [`conns`], probe groups, kernel-only [`turns`], each building a node's [`half`]
//! along the point order of [`chain`]) -> [`pipeline`] (pairs client and server halves across
//! nodes) -> [`attribution`] (the [`segments`] catalog under the clock rules of [`time`] and
//! [`clock`]) -> merged NDJSON ([`cli`]). Synthetic traffic for
//! its tests and benchmarks is in the meshlab-testkit crate.

// `cli`, `pipeline::Options` and `segments` (the segment table docs/segments.md mirrors) are
// the merge's interface; everything else is internal.
pub(crate) mod attribution;
pub(crate) mod catalog;
pub(crate) mod chain;
pub(crate) mod chunked;
pub mod cli;
pub(crate) mod clock;
pub(crate) mod conns;
pub(crate) mod custom_points;
pub(crate) mod event;
pub(crate) mod half;
pub(crate) mod hops;
pub(crate) mod index;
pub(crate) mod input;
pub(crate) mod join;
pub(crate) mod legs;
pub(crate) mod message;
pub(crate) mod nic;
pub(crate) mod nic_clock;
pub mod pipeline;
pub(crate) mod reader;
pub(crate) mod reduce;
pub mod segments;
pub(crate) mod stored_stages;
pub(crate) mod stream;
pub(crate) mod time;
pub(crate) mod turns;

use crate::ndjson::NdjsonError;

/// The merge's hash maps: keyed by cookies, thread ids, trace ids and stream offsets, looked up
/// several times per event. SipHash (std's default) was a twentieth of the merge's CPU;
/// foldhash is several times cheaper and still seeded per process.
pub(crate) type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

#[derive(Debug, thiserror::Error)]
pub enum MergeError {
    #[error(transparent)]
    Input(#[from] NdjsonError),
    #[error("{0}")]
    Usage(String),
    #[error("writing output: {0}")]
    Output(#[from] std::io::Error),
}
