//! `meshlab lab ...` and `meshlab demo`.

/// `meshlab lab`: the two-namespace test bed and its RPC workload.
#[derive(Debug, clap::Args)]
pub struct LabArgs {}

/// `meshlab demo`: the lab end to end.
#[derive(Debug, clap::Args)]
pub struct DemoArgs {}

pub fn run_lab(_args: LabArgs) -> anyhow::Result<()> {
    anyhow::bail!("meshlab lab is not built yet")
}

pub fn run_demo(_args: DemoArgs) -> anyhow::Result<()> {
    anyhow::bail!("meshlab demo is not built yet")
}
