//! `meshlab lab ...` and `meshlab demo`.

use clap::Subcommand;

use super::{leftovers, workload};

/// `meshlab lab`: the two-namespace test bed and its RPC workload.
#[derive(Debug, clap::Args)]
pub struct LabArgs {
    #[command(subcommand)]
    command: LabCommand,
}

#[derive(Debug, Subcommand)]
enum LabCommand {
    /// Remove lab namespaces (and processes in them) left behind by crashed runs.
    Down,
    /// Echo RPC server (kitex-echo shape).
    Server(workload::server::ServerArgs),
    /// Ping-pong load generator with latency quantiles.
    Client(workload::client::ClientArgs),
}

pub use super::demo::DemoArgs;

pub fn run_lab(args: LabArgs) -> anyhow::Result<()> {
    match args.command {
        LabCommand::Down => {
            let removed = leftovers::lab_down()?;
            eprintln!(
                "meshlab lab down: removed {} stale namespace(s) and runtime dir(s)",
                removed.len()
            );
            Ok(())
        }
        LabCommand::Server(args) => workload::server::run(args),
        LabCommand::Client(args) => workload::client::run(args),
    }
}

pub fn run_demo(args: DemoArgs) -> anyhow::Result<()> {
    super::demo::run(args)
}
