//! `meshlab report`.

#[derive(Debug, clap::Args)]
pub struct ReportArgs {}

pub fn run(_args: ReportArgs) -> anyhow::Result<()> {
    anyhow::bail!("meshlab report is not built yet")
}
