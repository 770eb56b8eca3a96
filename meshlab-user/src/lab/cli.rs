//! `meshlab lab ...` and `meshlab demo`.

use clap::Subcommand;

use super::leftovers;

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
}

/// `meshlab demo`: the lab end to end.
#[derive(Debug, clap::Args)]
pub struct DemoArgs {}

pub fn run_lab(args: LabArgs) -> anyhow::Result<()> {
    match args.command {
        LabCommand::Down => {
            let removed = leftovers::lab_down()?;
            eprintln!("meshlab lab down: removed {} namespace(s)", removed.len());
            Ok(())
        }
    }
}

pub fn run_demo(_args: DemoArgs) -> anyhow::Result<()> {
    anyhow::bail!("meshlab demo is not built yet")
}
