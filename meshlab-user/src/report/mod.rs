//! `meshlab report`: where every microsecond of the merged requests went, as a terminal table,
//! JSON, a self-contained HTML page and a Perfetto trace; `--compare` lines runs up as a ladder.
//!
//! Data flow: one streaming pass ([`aggregate`]) collects per-segment durations and the
//! end-to-end time of every request; a second pass ([`select`]) fetches only the requests the
//! waterfalls and the trace need. Nothing else of a request is kept.

pub mod aggregate;
pub mod cli;
pub mod compare;
pub mod hops;
pub mod html;
pub mod key;
pub mod layout;
pub mod order;
pub mod perfetto;
pub mod quantile;
pub mod select;
pub mod steps;
pub mod summary;
pub mod table;
pub mod text;
