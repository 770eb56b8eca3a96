//! The host side of a guest's output: the run directory the guests write into over 9p, and
//! relaying what they write there to the host's stdout/stderr while they run.

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// A private directory shared read-write with the guests (scripts in, output and status out,
/// the link's unix sockets); removed on drop, also when the run fails or xtask is killed.
pub struct RunDir(PathBuf, #[allow(dead_code)] crate::cleanup::Registered);

impl RunDir {
    pub fn create() -> Result<Self> {
        sweep_dead_run_dirs();
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or_default();
        let path = std::env::temp_dir().join(format!("meshlab-vm-{}-{nanos}", std::process::id()));
        std::fs::create_dir(&path).with_context(|| format!("creating {}", path.display()))?;
        Ok(RunDir(
            path.clone(),
            crate::procs::remove_dir_when_killed(path),
        ))
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

/// Removes run directories left by an xtask that was SIGKILLed (its qemu died with it through
/// PDEATHSIG, but nothing could remove the directory).
fn sweep_dead_run_dirs() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix("meshlab-vm-"))
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if !process_alive(pid) {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

pub fn process_alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

impl Drop for RunDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Follows one output file a guest appends to; optionally copies it live to the host, with a
/// per-line prefix ("A| ") when two guests share the terminal.
pub struct Relay {
    path: PathBuf,
    offset: u64,
    prefix: Option<String>,
    to_stderr: bool,
    captured: Vec<u8>,
    /// Bytes after the last newline, held back until the line is complete (prefixed mode).
    partial: Vec<u8>,
    /// Host stdout closed (e.g. piped into `head`): stop writing, keep capturing.
    closed: bool,
}

impl Relay {
    pub fn new(path: PathBuf, prefix: Option<String>, to_stderr: bool) -> Self {
        Relay {
            path,
            offset: 0,
            prefix,
            to_stderr,
            captured: Vec::new(),
            partial: Vec::new(),
            closed: false,
        }
    }

    pub fn poll(&mut self, stream: bool) -> Result<()> {
        let Ok(mut file) = std::fs::File::open(&self.path) else {
            return Ok(()); // the guest has not started its command yet
        };
        file.seek(SeekFrom::Start(self.offset))?;
        let mut fresh = Vec::new();
        file.read_to_end(&mut fresh)
            .with_context(|| format!("reading {}", self.path.display()))?;
        if fresh.is_empty() {
            return Ok(());
        }
        self.offset += fresh.len() as u64;
        // Streamed output is not also kept: `meshlab record` may write gigabytes of NDJSON.
        if stream {
            self.emit(&fresh, false);
        } else {
            self.captured.extend_from_slice(&fresh);
        }
        Ok(())
    }

    /// Flushes a final unterminated line; returns what the guest wrote (empty when streamed).
    pub fn finish(&mut self, stream: bool) -> Vec<u8> {
        if stream {
            self.emit(&[], true);
        }
        std::mem::take(&mut self.captured)
    }

    fn emit(&mut self, fresh: &[u8], flush_partial: bool) {
        let out = match &self.prefix {
            None => fresh.to_vec(),
            Some(prefix) => {
                self.partial.extend_from_slice(fresh);
                let complete = match self.partial.iter().rposition(|&b| b == b'\n') {
                    Some(at) => at + 1,
                    None if flush_partial && !self.partial.is_empty() => {
                        self.partial.push(b'\n');
                        self.partial.len()
                    }
                    None => 0,
                };
                let lines: Vec<u8> = self.partial.drain(..complete).collect();
                prefix_lines(prefix, &lines)
            }
        };
        if out.is_empty() || self.closed {
            return;
        }
        let written = if self.to_stderr {
            std::io::stderr().lock().write_all(&out)
        } else {
            let mut stdout = std::io::stdout().lock();
            stdout.write_all(&out).and_then(|()| stdout.flush())
        };
        // BrokenPipe (reader went away) is not an error for the run: keep the guests going.
        if written.is_err() {
            self.closed = true;
        }
    }
}

fn prefix_lines(prefix: &str, text: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    for line in text.split_inclusive(|&b| b == b'\n') {
        out.extend_from_slice(prefix.as_bytes());
        out.extend_from_slice(line);
    }
    out
}

/// Peak resident memory (VmHWM) of a running process, in KiB; 0 once it is gone.
pub fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixed_relay_holds_partial_lines_until_complete() {
        let dir = RunDir::create().expect("run dir");
        let file = dir.path().join("a.stdout");
        let mut relay = Relay::new(file.clone(), Some("A| ".into()), false);
        std::fs::write(&file, b"one\ntw").expect("write");
        relay.poll(false).expect("poll");
        assert_eq!(relay.captured, b"one\ntw");
        std::fs::write(&file, b"one\ntwo\n").expect("append");
        relay.poll(false).expect("poll");
        assert_eq!(relay.finish(false), b"one\ntwo\n");
        assert_eq!(prefix_lines("A| ", b"x\ny\n"), b"A| x\nA| y\n");
    }

    #[test]
    fn run_dir_is_removed_on_drop() {
        let dir = RunDir::create().expect("run dir");
        let path = dir.path().to_path_buf();
        std::fs::write(path.join("f"), b"x").expect("write");
        drop(dir);
        assert!(!path.exists());
    }

    #[test]
    fn own_peak_rss_is_positive() {
        assert!(peak_rss_kib(std::process::id()) > 0);
    }
}
