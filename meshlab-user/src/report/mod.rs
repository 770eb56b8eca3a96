//! `meshlab report`: where every microsecond of the merged requests went, as a terminal table,
//! JSON, a self-contained HTML page and a Perfetto trace; `--compare` lines runs up as a ladder.
//!
//! Data flow: one streaming pass ([`aggregate`]) collects per-segment durations and the
//! end-to-end time of every request; a second pass ([`select`]) fetches only the requests the
//! waterfalls and the trace need. Nothing else of a request is kept.

pub mod aggregate;
pub mod cli;
pub(crate) mod compare;
pub(crate) mod hops;
pub(crate) mod html;
pub(crate) mod key;
pub(crate) mod layout;
pub mod nic;
pub(crate) mod nic_compare;
pub(crate) mod nic_raw;
pub(crate) mod nic_rounds;
pub(crate) mod nic_text;
pub(crate) mod order;
pub mod own_cost;
pub(crate) mod own_cost_text;
pub(crate) mod perfetto;
pub(crate) mod quantile;
pub(crate) mod rounds;
pub(crate) mod select;
pub(crate) mod steps;
pub mod summary;
pub(crate) mod table;
pub mod text;
