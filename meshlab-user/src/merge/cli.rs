//! `meshlab merge`.

#[derive(Debug, clap::Args)]
pub struct MergeArgs {}

pub fn run(_args: MergeArgs) -> anyhow::Result<()> {
    anyhow::bail!("meshlab merge is not built yet")
}
