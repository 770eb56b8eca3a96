//! meshlab: an eBPF kernel-and-socket tracer for the part of an RPC's latency that userland
//! probes cannot see. The binary `meshlab` is a thin CLI over this library.

pub mod capture;
pub mod decode;
pub mod incoming;
pub mod kernel;
pub mod lab;
pub mod merge;
pub mod ndjson;
pub mod output;
pub(crate) mod probe_line;
pub mod records;
pub mod report;
pub(crate) mod request_json;
pub mod schema;
pub mod units;
