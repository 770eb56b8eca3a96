#[derive(Debug, clap::Args)]
pub struct RecordArgs {}
pub fn run(_args: RecordArgs) -> anyhow::Result<()> {
    anyhow::bail!("not built yet")
}
