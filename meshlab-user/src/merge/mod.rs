//! `meshlab merge`: joins the kernel recordings and userland probe files of all nodes and
//! attributes every nanosecond of each request (docs/segments.md, docs/clock-discipline.md).
//!
//! Data flow: [`input`] (files, nodes, clock samples, skew) -> [`stream`] (per node, time order
//! through a bounded reorder window; records reduced by [`reduce`]) -> [`join`] (kernel
//! [`index`], [`conns`], probe groups, kernel-only [`turns`]) -> [`pipeline`] (pairs client and
//! server halves across nodes) -> [`attribution`] (the [`segments`] catalog under the clock
//! rules of [`time`] and [`clock`]) -> merged NDJSON ([`cli`]). [`synth`] generates two-node
//! traffic for tests and benchmarks.

pub mod attribution;
pub mod cli;
pub mod clock;
pub mod conns;
pub mod event;
pub mod half;
pub mod index;
pub mod input;
pub mod join;
pub mod pipeline;
pub mod reduce;
pub mod segments;
pub mod stream;
pub mod synth;
pub mod time;
pub mod turns;

use crate::ndjson::NdjsonError;

#[derive(Debug, thiserror::Error)]
pub enum MergeError {
    #[error(transparent)]
    Input(#[from] NdjsonError),
    #[error("{0}")]
    Usage(String),
    #[error("writing output: {0}")]
    Output(#[from] std::io::Error),
}
