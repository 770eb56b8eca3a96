//! `meshlab export`: a binary capture as the NDJSON `record --format ndjson` would have
//! written (docs/schema.md, the interchange format): non-event records verbatim, events
//! decoded by the same [`Decoder`] the recorder uses.

use std::io::{BufWriter, Write};
use std::path::PathBuf;

use crate::decode::Decoder;
use crate::output::{Policy, create_output};

use super::reader::CaptureReader;
use super::source::parse_json_record;
use super::{CaptureError, RecordKind};

#[derive(Debug, clap::Args)]
pub struct ExportArgs {
    /// A binary capture written by `meshlab record`.
    pub input: PathBuf,
    /// Output NDJSON file (default: stdout). Written beside OUT and renamed over it when complete.
    #[arg(short = 'o', long = "output", value_name = "OUT")]
    pub output: Option<PathBuf>,
}

pub fn run(args: ExportArgs) -> anyhow::Result<()> {
    let mut reader = CaptureReader::open(&args.input)?;
    match &args.output {
        None => {
            let stdout = std::io::stdout().lock();
            export(&mut reader, stdout)?;
        }
        Some(out) => {
            // Atomic: a temporary file beside OUT, renamed over it only when complete
            // (crate::output's rules: no symlink followed, no foreign file replaced).
            let mut sink = create_output(out, Policy::Atomic)?;
            export(&mut reader, &mut sink)?;
            sink.commit()?;
        }
    }
    if let Some(at) = reader.truncated_at() {
        log::warn!(
            "{}: byte {at}: the last record is incomplete (the recorder stopped mid-write); exported the records before it",
            args.input.display()
        );
    }
    Ok(())
}

/// Writes every record of `reader` as NDJSON lines to `out`; returns the number of lines.
pub fn export<R: std::io::BufRead>(
    reader: &mut CaptureReader<R>,
    out: impl Write,
) -> anyhow::Result<()> {
    let file = reader.file().to_owned();
    let meta = reader.meta().clone();
    let mut decoder = Decoder::new(meta.node, meta.dev_names);
    let mut out = BufWriter::with_capacity(1 << 20, out);
    while let Some(raw) = reader.next_raw()? {
        match raw.kind {
            RecordKind::Event => decoder.write_event(&raw.event(), &mut out)?,
            RecordKind::Meta => {
                let message = "a second `meta` record (only the first record may be one)";
                return Err(CaptureError::record(
                    &file,
                    raw.offset,
                    raw.number,
                    "meta",
                    message.into(),
                )
                .into());
            }
            _ => {
                parse_json_record(&raw).map_err(|m| {
                    CaptureError::record(&file, raw.offset, raw.number, raw.kind.name(), m)
                })?;
                out.write_all(raw.payload)?;
                out.write_all(b"\n")?;
            }
        }
    }
    out.flush()?;
    if decoder.unknown_hooks() > 0 {
        log::warn!(
            "{} events had an unknown hook id and were skipped",
            decoder.unknown_hooks()
        );
    }
    Ok(())
}
