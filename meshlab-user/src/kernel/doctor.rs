#[derive(Debug, clap::Args)]
pub struct DoctorArgs {}
pub fn run(_args: DoctorArgs) -> anyhow::Result<()> {
    anyhow::bail!("not built yet")
}
