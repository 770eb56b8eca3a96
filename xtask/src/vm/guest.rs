//! Booting the guests: qemu command lines, the run directory they share with the host, output
//! relay, and making sure no qemu outlives a run (exit, error, timeout, Ctrl-C, xtask killed).

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use super::image::BootFiles;
use super::kernel::KernelLabel;
use super::relay::{Relay, RunDir, peak_rss_kib};
use super::{RunArgs, image, script};

/// The private link: guest A and guest B only, over a pair of unix datagram sockets between
/// the two qemu processes. No host interface, no route, no gateway.
pub const LINK_ADDRS: [&str; 2] = ["10.213.0.1", "10.213.0.2"];
const LINK_PREFIX: u8 = 24;
const GUEST_NAMES: [&str; 2] = ["a", "b"];
const QEMU: &str = "qemu-system-x86_64";

#[derive(Debug, Clone)]
pub struct RunSpec {
    pub label: KernelLabel,
    pub boot: BootFiles,
    /// Shell text per guest: one entry = one guest without a NIC; two = A and B on the link.
    pub commands: Vec<String>,
    pub cwd: PathBuf,
    pub timeout: Duration,
    pub memory_mib: u32,
    pub cpus: u8,
    pub rw_dirs: Vec<PathBuf>,
    /// Relay guest output live to the host's stdout/stderr (else only captured).
    pub stream: bool,
}

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

/// First non-zero guest status (A before B); an error when a guest never reported one.
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
                let why = if outcome.timed_out {
                    format!("timed out after {} s", spec.timeout.as_secs())
                } else {
                    "stopped before its command finished".to_owned()
                };
                bail!(
                    "guest {} {why}; console log {}",
                    guest.name,
                    guest.console_log.display()
                );
            }
        }
    }
    Ok(code)
}

/// Boots the guests, relays their output, and returns once all have stopped.
pub fn run_guests(spec: &RunSpec) -> Result<RunOutcome> {
    install_signal_handlers();
    which_qemu()?;
    let run_dir = RunDir::create()?;
    let logs_dir = super::target_dir().join("vm/logs");
    std::fs::create_dir_all(&logs_dir)
        .with_context(|| format!("creating {}", logs_dir.display()))?;
    remove_logs_of_dead_runs(&logs_dir);
    let rw_mounts: String = (spec.rw_dirs.iter().enumerate())
        .map(|(i, dir)| format!("rw{i} {}\n", dir.display()))
        .collect();
    std::fs::write(run_dir.path().join("rw-mounts"), rw_mounts)?;

    let two = spec.commands.len() == 2;
    let started = Instant::now();
    let mut guests = Vec::new();
    for (index, command) in spec.commands.iter().enumerate() {
        let name = GUEST_NAMES[index];
        let script_text = script::guest_script(command, &spec.cwd);
        std::fs::write(run_dir.path().join(format!("{name}.script")), script_text)?;
        // Per process: concurrent runs must not share (or delete) each other's console log.
        let console_log =
            logs_dir.join(format!("{}-{name}-{}.log", spec.label, std::process::id()));
        let args = qemu_args(spec, index, run_dir.path(), &console_log);
        let child = spawn_qemu(&args)?;
        let prefix = two.then(|| format!("{}| ", name.to_uppercase()));
        guests.push(RunningGuest {
            name,
            child: Some(child),
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

    let deadline = started + spec.timeout;
    let mut timed_out = false;
    loop {
        let mut running = 0;
        for guest in &mut guests {
            guest.poll(spec.stream)?;
            running += usize::from(guest.child.is_some());
        }
        if running == 0 {
            break;
        }
        // A guest that stopped without a status crashed: its peer would wait for it forever.
        let crashed = (guests.iter()).any(|g| {
            g.child.is_none() && !run_dir.path().join(format!("{}.status", g.name)).exists()
        });
        if crashed {
            break;
        }
        if INTERRUPTED.load(Ordering::SeqCst) {
            // Guests are killed and the run directory removed as `guests`/`run_dir` drop.
            bail!("interrupted: guests killed");
        }
        if Instant::now() >= deadline {
            timed_out = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let elapsed = started.elapsed();
    let mut outcomes = Vec::new();
    for mut guest in guests {
        guest.kill();
        guest.poll(spec.stream)?;
        let status_path = run_dir.path().join(format!("{}.status", guest.name));
        let status = std::fs::read_to_string(&status_path)
            .ok()
            .and_then(|s| s.trim().parse().ok());
        outcomes.push(GuestOutcome {
            name: guest.name,
            status,
            stdout: guest.stdout.finish(spec.stream),
            stderr: guest.stderr.finish(spec.stream),
            peak_rss_kib: guest.peak_rss_kib,
            console_log: guest.console_log.clone(),
        });
    }
    Ok(RunOutcome {
        guests: outcomes,
        elapsed,
        timed_out,
    })
}

struct RunningGuest {
    name: &'static str,
    child: Option<Child>,
    stdout: Relay,
    stderr: Relay,
    peak_rss_kib: u64,
    console_log: PathBuf,
}

impl RunningGuest {
    fn poll(&mut self, stream: bool) -> Result<()> {
        if let Some(child) = &mut self.child {
            self.peak_rss_kib = self.peak_rss_kib.max(peak_rss_kib(child.id()));
            if child.try_wait()?.is_some() {
                self.child = None;
            }
        }
        self.stdout.poll(stream)?;
        self.stderr.poll(stream)
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
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

/// The qemu command line for guest `index` (0 = A, 1 = B).
pub fn qemu_args(
    spec: &RunSpec,
    index: usize,
    run_dir: &Path,
    console_log: &Path,
) -> Vec<OsString> {
    let name = GUEST_NAMES[index];
    let mut append = format!("console=ttyS0 panic=-1 loglevel=5 meshlab.name={name}");
    let mut args: Vec<String> = vec![
        // No default devices: above all no NIC with user-mode NAT to the outside world.
        "-nodefaults".into(),
        "-no-user-config".into(),
        "-no-reboot".into(),
        // TCG: KVM hangs on stock kernels on this host (kernel-lab.md).
        "-accel".into(),
        "tcg".into(),
        "-machine".into(),
        "pc".into(),
        "-cpu".into(),
        "max".into(),
        "-m".into(),
        spec.memory_mib.to_string(),
        "-smp".into(),
        spec.cpus.to_string(),
        "-display".into(),
        "none".into(),
        "-serial".into(),
        format!("file:{}", escape(console_log)),
        "-kernel".into(),
        spec.boot.vmlinux.display().to_string(),
        "-initrd".into(),
        spec.boot.initramfs.display().to_string(),
    ];
    let mut share = |tag: &str, path: &Path, readonly: bool| {
        let ro = if readonly { ",readonly=on" } else { "" };
        args.push("-fsdev".into());
        args.push(format!(
            "local,id={tag},path={},security_model=none,multidevs=remap{ro}",
            escape(path)
        ));
        args.push("-device".into());
        args.push(format!("virtio-9p-pci,fsdev={tag},mount_tag={tag}"));
    };
    share("hostroot", Path::new("/"), true);
    share("meshlab_run", run_dir, false);
    for (i, dir) in spec.rw_dirs.iter().enumerate() {
        share(&format!("rw{i}"), dir, false);
    }
    if spec.commands.len() == 2 {
        let socket = |i: usize| escape(&run_dir.join(format!("link-{}.sock", GUEST_NAMES[i])));
        let (local, remote) = (socket(index), socket(1 - index));
        args.push("-netdev".into());
        args.push(format!(
            "dgram,id=link,local.type=unix,local.path={local},remote.type=unix,remote.path={remote}"
        ));
        args.push("-device".into());
        args.push(format!(
            "virtio-net-pci,netdev=link,mac=52:54:00:6d:6c:0{}",
            index + 1
        ));
        append += &format!(
            " meshlab.addr={}/{LINK_PREFIX} meshlab.peer={}",
            LINK_ADDRS[index],
            LINK_ADDRS[1 - index]
        );
    }
    // Extra kernel parameters for debugging a boot, e.g. MESHLAB_VM_APPEND=loglevel=7.
    if let Ok(extra) = std::env::var("MESHLAB_VM_APPEND") {
        append += &format!(" {extra}");
    }
    args.push("-append".into());
    args.push(append);
    args.into_iter().map(OsString::from).collect()
}

/// qemu option values escape a comma by doubling it.
fn escape(path: &Path) -> String {
    path.display().to_string().replace(',', ",,")
}

fn spawn_qemu(args: &[OsString]) -> Result<Child> {
    let mut cmd = Command::new(QEMU);
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    // Own process group: a terminal Ctrl-C reaches xtask, which kills the guests in order.
    cmd.process_group(0);
    // SAFETY: the closure runs in the forked child before exec and only calls prctl, which is
    // async-signal-safe. PDEATHSIG kills qemu if xtask dies without running its destructors.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd.spawn().with_context(|| format!("starting {QEMU}"))
}

pub fn which_qemu() -> Result<PathBuf> {
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join(QEMU))
        .find(|path| path.is_file())
        .with_context(|| format!("{QEMU} not found: run `cargo xtask vm prepare`"))
}

/// Console logs are kept after a run for debugging, until a later run finds their xtask gone.
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
        if pid.is_some_and(|pid| !super::relay::process_alive(pid)) {
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

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_signal: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// Ctrl-C, SIGTERM and SIGHUP set a flag the run loop checks, so it can kill the guests and
/// remove the run directory before exiting.
fn install_signal_handlers() {
    for signal in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe {
            libc::signal(signal, on_signal as *const () as libc::sighandler_t);
        }
    }
}
