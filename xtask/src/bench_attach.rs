//! `cargo xtask bench attach-delay`: how long `record --attach on-demand` takes to attach its
//! hot hooks after a connection it traces is established, and so how much of a new
//! connection's start goes unrecorded (docs/runbook.md, "Attaching on demand").
//!
//! One release recorder filters a loopback port; each cycle opens a connection to it, sends
//! one message each way, closes it and waits until the recorder has detached its hooks again
//! (it does 1 s after the last traced connection closed), so every cycle is a fresh attach.
//! The figures are the recording's own `hot_hooks` records: `delay_ns`, from the first traced
//! `sock_established` to the last hook attached.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};

use crate::bench_recorder::spawn_ready;
use crate::{read_ndjson, run_cmd, target_dir};

#[derive(clap::Args)]
pub struct AttachDelayArgs {
    /// Connect / close cycles, each one attach and one detach.
    #[arg(long, default_value_t = 20)]
    pub cycles: usize,
}

/// How long one cycle may wait for the recorder to attach or detach.
const LINK_WAIT: Duration = Duration::from_secs(5);

pub fn run(args: AttachDelayArgs) -> Result<()> {
    ensure!(args.cycles > 0, "--cycles must be at least 1");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    run_cmd(Command::new(cargo).args(["build", "--release", "--bin", "meshlab"]))?;
    let exe = target_dir().join("release/meshlab");
    let dir = crate::procs::tempdir()?;
    let listener = TcpListener::bind("127.0.0.1:0").context("a loopback listener")?;
    let port = listener.local_addr()?.port();
    let output = dir.join("attach.ndjson");
    let load_before = crate::machine_cpu::loadavg();
    let recorder = spawn_ready(
        Command::new(&exe)
            .args(["record", "--attach", "on-demand", "--format", "ndjson"])
            .args(["--port", &port.to_string(), "-o"])
            .arg(&output)
            .stderr(Stdio::null()),
        &dir.join("record.ready"),
        "meshlab record",
    )?;
    let pid = recorder.0.id();
    for cycle in 0..args.cycles {
        one_cycle(&listener, pid).with_context(|| format!("cycle {}", cycle + 1))?;
    }
    drop(recorder); // SIGINT and wait: the recording is complete once it exited
    let delays = attach_delays_ms(&output)?;
    ensure!(
        delays.len() == args.cycles,
        "{} attach records for {} cycles",
        delays.len(),
        args.cycles
    );
    let known: Vec<f64> = delays.iter().flatten().copied().collect();
    ensure!(!known.is_empty(), "no attach record says its delay");
    print!("{}", summary(&args, &known, &load_before));
    let unknown = delays.len() - known.len();
    if unknown > 0 {
        println!("{unknown} attaches without delay_ns (the recorder did not see their trigger)");
    }
    Ok(())
}

/// Connect, exchange one message, close; then wait for the hooks to be detached.
fn one_cycle(listener: &TcpListener, pid: u32) -> Result<()> {
    let mut client = TcpStream::connect(listener.local_addr()?)?;
    let (mut server, _) = listener.accept()?;
    wait_hot_links(pid, |n| n > 0, "attached")?;
    let mut buf = [0u8; 64];
    client.write_all(&buf)?;
    server.read_exact(&mut buf)?;
    server.write_all(&buf)?;
    client.read_exact(&mut buf)?;
    drop((client, server));
    wait_hot_links(pid, |n| n == 0, "detached")
}

/// Polls the recorder's BPF links (every link but the cgroup one is a hot hook).
fn wait_hot_links(pid: u32, done: impl Fn(usize) -> bool, what: &str) -> Result<()> {
    let start = Instant::now();
    while !done(hot_links(pid)?) {
        if start.elapsed() > LINK_WAIT {
            bail!("hot hooks not {what} within {LINK_WAIT:?}");
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    Ok(())
}

/// BPF links other than cgroup ones among a process's descriptors (/proc/PID/fdinfo).
fn hot_links(pid: u32) -> Result<usize> {
    let dir = format!("/proc/{pid}/fdinfo");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).with_context(|| format!("reading {dir}"))? {
        let Ok(info) = std::fs::read_to_string(entry?.path()) else {
            continue; // closed meanwhile
        };
        let link_type = info.lines().find_map(|l| l.strip_prefix("link_type:"));
        n += usize::from(link_type.is_some_and(|t| t.trim() != "cgroup"));
    }
    Ok(n)
}

/// `delay_ns` of every `hot_hooks` attach record, in milliseconds (None: not known, the
/// recorder attached before it read the triggering `sock_established`).
fn attach_delays_ms(recording: &Path) -> Result<Vec<Option<f64>>> {
    let lines = read_ndjson(recording)?;
    let attaches = lines
        .iter()
        .filter(|l| l["type"] == "hot_hooks" && l["change"] == "attached");
    Ok(attaches
        .map(|l| l["delay_ns"].as_u64().map(|d| d as f64 / 1e6))
        .collect())
}

fn summary(args: &AttachDelayArgs, delays: &[f64], load_before: &str) -> String {
    let mut sorted = delays.to_vec();
    sorted.sort_by(f64::total_cmp);
    let pick = |q: f64| sorted[((sorted.len() - 1) as f64 * q).round() as usize];
    format!(
        "`cargo xtask bench attach-delay --cycles {}` on {}, load {} before / {} after:\n\
         on-demand attach delay (first traced sock_established -> all hot hooks attached), \
         {} attaches: min {:.2} ms, median {:.2} ms, p90 {:.2} ms, max {:.2} ms\n",
        args.cycles,
        crate::bench_merge::machine(),
        load_before,
        crate::machine_cpu::loadavg(),
        sorted.len(),
        pick(0.0),
        pick(0.5),
        pick(0.9),
        pick(1.0),
    )
}
