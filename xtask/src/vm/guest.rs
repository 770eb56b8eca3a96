//! Booting the guests: qemu command lines, the run directory they share with the host, output
//! relay, and making sure no qemu outlives a run (exit, error, timeout, Ctrl-C, xtask killed).

use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use super::qemu::{qemu_args, spawn_qemu};
use super::relay::{Relay, RunDir, peak_rss_kib};
use super::spec::{GUEST_NAMES, LINK_ADDRS, RunSpec, WireSpec};
use super::tap_link::TapLink;
use super::wire::Wire;
use super::{RunArgs, image, script};

/// A directory of the run directory both guests see (at $MESHLAB_VM_SHARED): rendezvous files.
const SHARED_DIR: &str = "shared";

#[derive(Debug)]
pub struct GuestOutcome {
    pub name: &'static str,
    /// The command's exit status; None when the guest died or was killed before it finished.
    pub status: Option<i32>,
    /// What the command wrote, when not streamed (`RunSpec::stream` false).
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub peak_rss_kib: u64,
    pub console_log: PathBuf,
    /// The guest's init reached its command (init.sh writes `NAME.started`).
    pub started: bool,
}

#[derive(Debug)]
pub struct RunOutcome {
    pub guests: Vec<GuestOutcome>,
    pub elapsed: Duration,
    pub timed_out: bool,
}

/// `cargo xtask vm run`: returns the exit code to leave with.
pub fn run_cli(args: &RunArgs) -> Result<i32> {
    let guests = args
        .guests
        .unwrap_or(if args.cmd_b.is_some() { 2 } else { 1 });
    let commands = match (guests, &args.cmd_a, &args.cmd_b, args.argv.is_empty()) {
        (1, None, None, false) => vec![script::exec_argv(&args.argv)],
        (1, Some(a), None, true) => vec![a.clone()],
        (2, Some(a), Some(b), true) => vec![a.clone(), b.clone()],
        (1, ..) => bail!("one guest: give either `-- CMD ARGS...` or `--a 'shell command'`"),
        _ => bail!("two guests: give `--a 'command for A' --b 'command for B'` (no `-- CMD`)"),
    };
    if args.queues > 1 && commands.len() != 2 {
        bail!(
            "--queues {}: the queues are the link's, which needs two guests",
            args.queues
        );
    }
    if args.nics > 1 && commands.len() != 2 {
        bail!(
            "--nics {}: the NICs are on links, which need two guests",
            args.nics
        );
    }
    if args.queues > 1 && !crate::setup::is_root() {
        bail!(
            "--queues {}: the tap link needs root (a network namespace, taps)",
            args.queues
        );
    }
    let cwd = match &args.cwd {
        Some(dir) => (dir.canonicalize())
            .with_context(|| format!("--cwd {}: no such directory", dir.display()))?,
        None => std::env::current_dir().context("current directory")?,
    };
    // The guest mounts each at the same absolute path.
    let rw_dirs = (args.rw_dirs.iter())
        .map(|dir| {
            dir.canonicalize()
                .with_context(|| format!("--rw {}: no such directory", dir.display()))
        })
        .collect::<Result<Vec<_>>>()?;
    let spec = RunSpec {
        label: args.kernel,
        boot: image::prepared(args.kernel)?,
        commands,
        cwd,
        timeout: Duration::from_secs(args.timeout),
        memory_mib: args.memory,
        cpus: args.cpus,
        rw_dirs,
        stream: true,
        wire: args.wire_delay_us.map(|delay_us| WireSpec {
            delay_us,
            log: args.wire_log.clone(),
        }),
        kernel_args: args.kernel_args.clone(),
        queues: args.queues,
        nics: args.nics,
    };
    let outcome = run_guests(&spec)?;
    let peak: u64 = outcome.guests.iter().map(|g| g.peak_rss_kib).sum();
    eprintln!(
        "vm: kernel {} ({}), {} guest(s), {:.1} s, qemu peak RSS {} MiB",
        spec.label,
        spec.boot.release,
        outcome.guests.len(),
        outcome.elapsed.as_secs_f64(),
        peak >> 10
    );
    if outcome.guests.len() > 1 {
        for guest in &outcome.guests {
            let status = guest
                .status
                .map_or("no status".to_owned(), |s| format!("exit {s}"));
            eprintln!("vm: guest {}: {status}", guest.name);
        }
    }
    exit_code(&spec, &outcome)
}

/// A guest stopped without a status after its command started, and not at the run's
/// timeout: its qemu exited (under TCG a guest with several vCPUs now and then stops with
/// nothing on its console, docs/truth.md). `vm run` exits with [`GUEST_STOPPED_EXIT`] for it,
/// so a caller whose commands can run again from a clean start may tell it from a failure of
/// the command (`truth --vm` boots again, once). A command that itself exits 75 looks the
/// same to such a caller: `truth --vm`'s scripts exit 1 on failure.
#[derive(Debug)]
pub struct GuestStopped {
    pub name: &'static str,
    pub console_log: PathBuf,
}

impl std::fmt::Display for GuestStopped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "guest {} stopped before its command finished; console log {}",
            self.name,
            self.console_log.display()
        )
    }
}

impl std::error::Error for GuestStopped {}

/// `vm run`'s exit status for [`GuestStopped`]: EX_TEMPFAIL of sysexits(3), "try again later".
pub const GUEST_STOPPED_EXIT: i32 = 75;

/// First non-zero guest status (A before B); an error when a guest never reported one
/// ([`GuestStopped`] when its command had started and the run did not time out).
pub fn exit_code(spec: &RunSpec, outcome: &RunOutcome) -> Result<i32> {
    let mut code = 0;
    for guest in &outcome.guests {
        match guest.status {
            Some(status) => {
                if code == 0 {
                    code = status;
                }
            }
            None => {
                print_console_tail(&guest.console_log);
                if outcome.timed_out {
                    bail!(
                        "guest {} timed out after {} s; console log {}",
                        guest.name,
                        spec.timeout.as_secs(),
                        guest.console_log.display()
                    );
                }
                // The host stops the other guest when one stops: any guest whose command had
                // started makes it a stop after the command started, whichever this one is.
                let started = (outcome.guests.iter()).find(|g| g.status.is_none() && g.started);
                let Some(guest) = started else {
                    // An init failed, or a boot died again after `run_guests` booted again.
                    bail!(
                        "guest {} stopped before its command started; console log {}",
                        guest.name,
                        guest.console_log.display()
                    );
                };
                return Err(GuestStopped {
                    name: guest.name,
                    console_log: guest.console_log.clone(),
                }
                .into());
            }
        }
    }
    Ok(code)
}

/// Boots the guests, relays their output, and returns once all have stopped. A guest that
/// died while booting, before any guest's command started (nothing ran that could have
/// written anywhere), is booted again once, with both guests: under TCG a boot with several
/// vCPUs now and then stops in the kernel's early start-up with nothing on its console (a
/// `threadirqs` boot, docs/truth.md), which says nothing about what the command tests.
pub fn run_guests(spec: &RunSpec) -> Result<RunOutcome> {
    let outcome = run_guests_once(spec)?;
    if !outcome.died_booting() {
        return Ok(outcome);
    }
    // The one that died and the ones killed after it: their consoles tell them apart.
    for guest in &outcome.guests {
        print_console_tail(&guest.console_log);
    }
    eprintln!("vm: a guest died while booting, before any command started: booting again, once");
    run_guests_once(spec)
}

impl RunOutcome {
    /// A guest stopped without a status while no guest's command had started, and the run
    /// did not time out.
    fn died_booting(&self) -> bool {
        !self.timed_out
            && !self.guests.iter().any(|g| g.started)
            && self.guests.iter().any(|g| g.status.is_none())
    }
}

fn run_guests_once(spec: &RunSpec) -> Result<RunOutcome> {
    super::qemu::which_qemu()?;
    let run_dir = RunDir::create()?;
    let logs_dir = crate::target_dir().join("vm/logs");
    std::fs::create_dir_all(&logs_dir)
        .with_context(|| format!("creating {}", logs_dir.display()))?;
    remove_logs_of_dead_runs(&logs_dir);
    let rw_mounts: String = (spec.rw_dirs.iter().enumerate())
        .map(|(i, dir)| format!("rw{i} {}\n", dir.display()))
        .collect();
    std::fs::write(run_dir.path().join("rw-mounts"), rw_mounts)?;
    std::fs::create_dir(run_dir.path().join(SHARED_DIR))?;

    // Declared after the run directory: dropped (threads joined, sockets removed) before it.
    let _wire = match &spec.wire {
        Some(wire) if spec.commands.len() == 2 => {
            let shared = run_dir.path().join(SHARED_DIR);
            Some(Wire::start(
                run_dir.path(),
                &shared,
                wire.delay_us,
                wire.log.clone(),
            )?)
        }
        _ => None,
    };
    // Before the guests (dropped after them): their qemu opens the taps inside it.
    let tap_link = if spec.commands.len() == 2 && spec.queues > 1 {
        Some(TapLink::create(spec.queues)?)
    } else {
        None
    };
    let started = Instant::now();
    let mut guests = boot_guests(spec, &run_dir, &logs_dir, tap_link.as_ref())?;
    let timed_out = wait_for_guests(spec, &run_dir, &mut guests, started + spec.timeout)?;
    let elapsed = started.elapsed();
    let mut outcomes = Vec::new();
    for mut guest in guests {
        guest.kill();
        guest.poll(spec.stream)?;
        let status_path = run_dir.path().join(format!("{}.status", guest.name));
        let status = std::fs::read_to_string(&status_path)
            .ok()
            .and_then(|s| s.trim().parse().ok());
        let started = (run_dir.path())
            .join(format!("{}.started", guest.name))
            .exists();
        outcomes.push(GuestOutcome {
            name: guest.name,
            status,
            stdout: guest.stdout.finish(spec.stream),
            stderr: guest.stderr.finish(spec.stream),
            peak_rss_kib: guest.peak_rss_kib,
            console_log: guest.console_log.clone(),
            started,
        });
    }
    Ok(RunOutcome {
        guests: outcomes,
        elapsed,
        timed_out,
    })
}

/// Writes each guest's script and starts its QEMU; with two guests they get the link
/// addresses of each other and prefixed output.
fn boot_guests(
    spec: &RunSpec,
    run_dir: &RunDir,
    logs_dir: &Path,
    tap_link: Option<&TapLink>,
) -> Result<Vec<RunningGuest>> {
    let two = spec.commands.len() == 2;
    let mut guests = Vec::new();
    for (index, command) in spec.commands.iter().enumerate() {
        let name = GUEST_NAMES[index];
        let mut guest_env = vec![
            ("MESHLAB_VM_GUEST", name.to_owned()),
            ("MESHLAB_VM_SHARED", format!("/run/meshlab/{SHARED_DIR}")),
        ];
        if two {
            guest_env.push(("MESHLAB_VM_ADDR", LINK_ADDRS[index].to_owned()));
            guest_env.push(("MESHLAB_VM_PEER", LINK_ADDRS[1 - index].to_owned()));
        }
        let script_text = script::guest_script(command, &spec.cwd, &guest_env);
        std::fs::write(run_dir.path().join(format!("{name}.script")), script_text)?;
        // Per process: concurrent runs must not share (or delete) each other's console log.
        let console_log =
            logs_dir.join(format!("{}-{name}-{}.log", spec.label, std::process::id()));
        let args = qemu_args(spec, index, run_dir.path(), &console_log);
        let child = spawn_qemu(&args, tap_link.map(TapLink::netns))?;
        let cleanup = crate::cleanup::kill_child(&child, &format!("qemu (guest {name})"));
        let prefix = two.then(|| format!("{}| ", name.to_uppercase()));
        guests.push(RunningGuest {
            name,
            child: Some((child, cleanup)),
            stdout: Relay::new(
                run_dir.path().join(format!("{name}.stdout")),
                prefix.clone(),
                false,
            ),
            stderr: Relay::new(run_dir.path().join(format!("{name}.stderr")), prefix, true),
            peak_rss_kib: 0,
            console_log,
        });
    }
    Ok(guests)
}

/// Relays output until every guest stopped, one crashed, or the deadline passed (returns
/// whether it did). A signal to xtask kills the guests through crate::cleanup.
fn wait_for_guests(
    spec: &RunSpec,
    run_dir: &RunDir,
    guests: &mut [RunningGuest],
    deadline: Instant,
) -> Result<bool> {
    loop {
        let mut running = 0;
        for guest in guests.iter_mut() {
            guest.poll(spec.stream)?;
            running += usize::from(guest.child.is_some());
        }
        if running == 0 {
            return Ok(false);
        }
        // A guest that stopped without a status crashed: its peer would wait for it forever.
        let crashed = (guests.iter()).any(|g| {
            g.child.is_none() && !run_dir.path().join(format!("{}.status", g.name)).exists()
        });
        if crashed {
            return Ok(false);
        }
        if Instant::now() >= deadline {
            return Ok(true);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

struct RunningGuest {
    name: &'static str,
    /// qemu, SIGKILLed if xtask is killed while it is unreaped (its registration goes with it).
    child: Option<(Child, crate::cleanup::Registered)>,
    stdout: Relay,
    stderr: Relay,
    peak_rss_kib: u64,
    console_log: PathBuf,
}

impl RunningGuest {
    fn poll(&mut self, stream: bool) -> Result<()> {
        if let Some((child, _)) = &mut self.child {
            self.peak_rss_kib = self.peak_rss_kib.max(peak_rss_kib(child.id()));
            if child.try_wait()?.is_some() {
                self.child = None;
            }
        }
        self.stdout.poll(stream)?;
        self.stderr.poll(stream)
    }

    fn kill(&mut self) {
        if let Some((mut child, _cleanup)) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for RunningGuest {
    fn drop(&mut self) {
        self.kill();
    }
}

/// How long a dead run's console logs outlive it: a caller that boots again after a guest
/// stopped (`truth --vm`) starts a new `vm run` seconds later, and the first boot's logs,
/// whose paths it printed, are what tells the flake apart.
const DEAD_RUN_LOGS_KEPT: std::time::Duration = std::time::Duration::from_secs(3600);

/// Console logs are kept after a run for debugging, until a later run finds their xtask gone
/// and the log unwritten for [`DEAD_RUN_LOGS_KEPT`].
fn remove_logs_of_dead_runs(logs_dir: &Path) {
    let Ok(entries) = std::fs::read_dir(logs_dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let pid = (name.to_str())
            .and_then(|n| n.strip_suffix(".log"))
            .and_then(|n| n.rsplit('-').next())
            .and_then(|pid| pid.parse::<u32>().ok());
        let unwritten_for = (entry.metadata().and_then(|m| m.modified()))
            .ok()
            .and_then(|t| t.elapsed().ok());
        let old = unwritten_for.is_some_and(|age| age >= DEAD_RUN_LOGS_KEPT);
        if old && pid.is_some_and(|pid| !super::relay::process_alive(pid)) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

fn print_console_tail(log: &Path) {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    eprintln!("vm: last lines of {}:", log.display());
    for line in &lines[lines.len().saturating_sub(25)..] {
        eprintln!("  {line}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guest(name: &'static str, status: Option<i32>, started: bool) -> GuestOutcome {
        GuestOutcome {
            name,
            status,
            stdout: Vec::new(),
            stderr: Vec::new(),
            peak_rss_kib: 0,
            console_log: PathBuf::from(format!("/logs/{name}.log")),
            started,
        }
    }

    fn outcome(guests: Vec<GuestOutcome>, timed_out: bool) -> RunOutcome {
        RunOutcome {
            guests,
            elapsed: Duration::from_secs(1),
            timed_out,
        }
    }

    /// Booted again only when no command started anywhere: a command that ran may have
    /// written into the read-write directories, and a run again would see its leftovers.
    #[test]
    fn only_a_death_before_any_command_started_boots_again() {
        let both = |a, b| vec![guest("a", None, a), guest("b", None, b)];
        assert!(outcome(both(false, false), false).died_booting());
        assert!(outcome(vec![guest("a", None, false)], false).died_booting());
        assert!(!outcome(both(true, false), false).died_booting());
        assert!(!outcome(both(false, false), true).died_booting());
        let finished = vec![guest("a", Some(0), true), guest("b", Some(1), true)];
        assert!(!outcome(finished, false).died_booting());
    }

    /// A dead run's log stays for an hour after its last write (a retry's first boot), then
    /// goes; a live run's log stays however old, and a file not named like a log stays.
    #[test]
    fn dead_runs_logs_go_only_when_an_hour_old() {
        let dir = std::env::temp_dir().join(format!("vm-logs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let dead = u32::MAX - 1; // above pid_max: never a live process
        let live = std::process::id();
        let long_ago = std::time::SystemTime::now() - DEAD_RUN_LOGS_KEPT * 2;
        let files = [
            (format!("6.12-a-{dead}.log"), None),
            (format!("6.12-b-{dead}.log"), Some(long_ago)),
            (format!("6.12-a-{live}.log"), Some(long_ago)),
            ("notes.txt".to_owned(), Some(long_ago)),
        ];
        for (name, modified) in &files {
            let file = std::fs::File::create(dir.join(name)).unwrap();
            if let Some(t) = modified {
                file.set_modified(*t).unwrap();
            }
        }
        remove_logs_of_dead_runs(&dir);
        let exists: Vec<bool> = files.iter().map(|(n, _)| dir.join(n).exists()).collect();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(exists, [true, false, true, true]);
    }
}
