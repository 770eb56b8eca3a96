//! The second pass: re-reads the merged file and hands over the requests wanted by number
//! (0-based, file order), so only those are ever held in memory.

use std::path::Path;

use crate::ndjson::RecordReader;
use crate::schema::{MergedRequest, Record};

use super::aggregate::ReportError;

/// Calls `each(number, request)` for every request with `wanted(number)`; stops reading after
/// request number `last` (the largest number wanted).
pub fn for_each_request(
    path: &Path,
    last: usize,
    mut wanted: impl FnMut(usize) -> bool,
    mut each: impl FnMut(usize, MergedRequest) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let mut number = 0usize;
    for record in RecordReader::open(path).map_err(ReportError::from)? {
        if let Record::Request(req) = record.map_err(ReportError::from)? {
            if wanted(number) {
                each(number, req)?;
            }
            if number >= last {
                break;
            }
            number += 1;
        }
    }
    Ok(())
}
