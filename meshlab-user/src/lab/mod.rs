//! The lab: two network namespaces ("machines" A and B) joined by a veth pair, an echo RPC
//! workload with userland probes, HAProxy sidecar topologies, and `meshlab demo`.
//! See docs/lab.md.

pub mod cli;
pub mod codec;
pub mod demo;
mod demo_summary;
pub mod haproxy;
pub mod leftovers;
pub mod netns;
pub mod probes;
pub mod process;
pub mod topology;
pub mod workload;

/// First `program` on PATH.
pub fn find_program(program: &str) -> Option<std::path::PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .chain(["/usr/sbin".into(), "/sbin".into()])
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
}
