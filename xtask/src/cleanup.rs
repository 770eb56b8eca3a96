//! Clean-up when xtask is killed. SIGINT, SIGTERM and SIGHUP end a process without unwinding,
//! so no Drop guard runs and whatever the guards own (child processes, network namespaces,
//! qdiscs, sysctls, guests, scratch directories) would be left behind. Every guard therefore
//! also registers its clean-up here for as long as it lives (and still cleans up in its Drop
//! on the normal path). A signal handler hands those signals to one thread, which runs what is
//! registered newest first, as unwinding would, says what it cleaned on one line and exits
//! with 128 + the signal.

use std::io::Read;
use std::os::fd::FromRawFd;
use std::panic::AssertUnwindSafe;
use std::process::{Child, Command, ExitStatus};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError, TryLockError};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

const SIGNALS: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];
/// How long a command the signal was passed on to may take to clean up after itself.
const FORWARD_GRACE: Duration = Duration::from_secs(30);
/// How long a SIGKILLed child may take to go (it may be in an uninterruptible sleep).
const KILL_GRACE: Duration = Duration::from_secs(5);

/// What to undo; gets the signal xtask received.
type Action = Box<dyn FnOnce(libc::c_int) + Send>;

/// Registered actions in registration order, each with its id and what it cleans up.
#[derive(Default)]
struct Registry {
    next_id: u64,
    entries: Vec<(u64, String, Action)>,
}

impl Registry {
    fn add(&mut self, what: String, action: Action) -> u64 {
        self.next_id += 1;
        self.entries.push((self.next_id, what, action));
        self.next_id
    }

    fn remove(&mut self, id: u64) -> Option<Action> {
        let index = self.entries.iter().position(|(i, ..)| *i == id)?;
        Some(self.entries.remove(index).2)
    }

    /// Runs every action, newest first; what each cleaned up, in that order.
    fn run_all(&mut self, signal: libc::c_int) -> Vec<String> {
        let mut done = Vec::new();
        while let Some((_, what, action)) = self.entries.pop() {
            // A panicking action must not keep the others from running or xtask from exiting.
            let _ = std::panic::catch_unwind(AssertUnwindSafe(move || action(signal)));
            done.push(what);
        }
        done
    }
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
    next_id: 0,
    entries: Vec::new(),
});

fn registry() -> MutexGuard<'static, Registry> {
    REGISTRY.lock().unwrap_or_else(PoisonError::into_inner)
}

/// An action registered for as long as this lives. Dropping it deregisters the action: by
/// then the owner's Drop has cleaned up itself.
#[must_use = "the action is deregistered when this is dropped"]
pub struct Registered(u64);

impl Drop for Registered {
    fn drop(&mut self) {
        // Dropped outside the lock: the action's captures may be anything.
        let action = registry().remove(self.0);
        drop(action);
    }
}

/// The signal being handled once clean-up has begun; 0 before.
static CLEANING: AtomicI32 = AtomicI32::new(0);

/// Registers `action` (described by `what` in the signal line) until the result is dropped.
/// Once clean-up has begun, the action runs at once and the calling thread stops there: what
/// it has just started must not outlive xtask, and it must not go on to start more.
pub fn register(
    what: impl Into<String>,
    action: impl FnOnce(libc::c_int) + Send + 'static,
) -> Registered {
    let action: Action = Box::new(action);
    loop {
        // Not lock(): the clean-up thread holds the lock until exit.
        match REGISTRY.try_lock() {
            Ok(mut registry) => return Registered(registry.add(what.into(), action)),
            Err(TryLockError::Poisoned(e)) => {
                return Registered(e.into_inner().add(what.into(), action));
            }
            Err(TryLockError::WouldBlock) => {}
        }
        let signal = CLEANING.load(Ordering::SeqCst);
        if signal != 0 {
            action(signal);
            loop {
                std::thread::park();
            }
        }
        std::thread::yield_now();
    }
}

/// A child that is SIGKILLed (with its process group, if it leads one) and reaped if xtask is
/// killed: nothing it would do on its own way out is needed then.
pub fn kill_child(child: &Child, what: &str) -> Registered {
    let pid = child.id() as libc::pid_t;
    register(format!("{what} (pid {pid})"), move |_| {
        // A pgid is its leader's pid, which is this child's while it is unreaped: -pid is
        // either this child's own group (qemu's) or no group at all.
        // SAFETY: kill(2) has no memory effects.
        unsafe { libc::kill(-pid, libc::SIGKILL) };
        stop(pid, libc::SIGKILL, KILL_GRACE);
    })
}

/// A child that gets the signal passed on, as a terminal would have sent it, and time to clean
/// up after itself (xtask run again, sudo, cargo), then SIGKILL.
pub fn forward_to_child(child: &Child, what: &str) -> Registered {
    let pid = child.id() as libc::pid_t;
    register(
        format!("{what} (pid {pid}, signal passed on)"),
        move |signal| {
            if !stop(pid, signal, FORWARD_GRACE) {
                stop(pid, libc::SIGKILL, KILL_GRACE);
            }
        },
    )
}

/// Runs `cmd` in the foreground until it exits; a signal to xtask meanwhile is passed on.
pub fn status_forwarding(cmd: &mut Command, what: &str) -> Result<ExitStatus> {
    let mut child = cmd.spawn().with_context(|| format!("starting {what}"))?;
    let _forward = forward_to_child(&child, what);
    child.wait().with_context(|| format!("waiting for {what}"))
}

/// Sends `signal` to child `pid` and reaps it; false if it still runs after `grace`.
fn stop(pid: libc::pid_t, signal: libc::c_int, grace: Duration) -> bool {
    // SAFETY: kill(2) on our own child, not yet reaped while it is registered.
    unsafe { libc::kill(pid, signal) };
    let deadline = Instant::now() + grace;
    loop {
        // SAFETY: waitpid(2) with a null status pointer is allowed.
        let reaped = unsafe { libc::waitpid(pid, std::ptr::null_mut(), libc::WNOHANG) };
        // The pid, or -1 (ECHILD) when its owner reaped it meanwhile: gone either way.
        if reaped != 0 {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Write end of the pipe the signal handler reports to, and the process that owns it.
static PIPE: AtomicI32 = AtomicI32::new(-1);
static OWNER: AtomicI32 = AtomicI32::new(0);

/// Starts the clean-up thread and routes SIGINT, SIGTERM and SIGHUP to it. A handler, not a
/// blocked mask and sigwait: children inherit a mask (std's Command keeps it), so they could
/// not be stopped with these signals, while handlers are reset to the default at exec.
pub fn install() -> Result<()> {
    let mut fds = [0; 2];
    // SAFETY: pipe2(2) writes two fds into the array; CLOEXEC keeps them out of children.
    let rc = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
    anyhow::ensure!(rc == 0, "pipe2: {}", std::io::Error::last_os_error());
    // SAFETY: fds[0] is the read end just created, owned by nothing else.
    let mut reports = unsafe { std::fs::File::from_raw_fd(fds[0]) };
    PIPE.store(fds[1], Ordering::SeqCst);
    // SAFETY: getpid(2) has no preconditions.
    OWNER.store(unsafe { libc::getpid() }, Ordering::SeqCst);
    std::thread::Builder::new()
        .name("cleanup".into())
        .spawn(move || {
            let mut signal = [0u8];
            while reports.read_exact(&mut signal).is_err() {}
            clean_up_and_exit(libc::c_int::from(signal[0]))
        })
        .context("starting the clean-up thread")?;
    for signal in SIGNALS {
        handle(signal)?;
    }
    Ok(())
}

/// Installs [`on_signal`] for `signal`, unless it is ignored: `nohup` (SIGHUP) and a shell's
/// background job (SIGINT) mean the signal is not for xtask.
fn handle(signal: libc::c_int) -> Result<()> {
    // SAFETY: a zeroed sigaction is valid storage for sigaction(2) to fill or read.
    let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: reading the current action into `action`.
    unsafe { libc::sigaction(signal, std::ptr::null(), &mut action) };
    if action.sa_sigaction == libc::SIG_IGN {
        return Ok(());
    }
    action.sa_sigaction = on_signal as *const () as libc::sighandler_t;
    // Interrupted system calls in the other threads restart (std retries the rest).
    action.sa_flags = libc::SA_RESTART;
    // SAFETY: `action` is fully initialised, with an empty mask from zeroing.
    let rc = unsafe { libc::sigaction(signal, &action, std::ptr::null_mut()) };
    anyhow::ensure!(rc == 0, "sigaction: {}", std::io::Error::last_os_error());
    Ok(())
}

extern "C" fn on_signal(signal: libc::c_int) {
    // Only async-signal-safe calls. A child between fork and exec still has this handler: it
    // must not report to xtask's pipe. errno is kept for the interrupted code.
    // SAFETY: getpid, write and errno access are async-signal-safe; `byte` outlives the call.
    unsafe {
        if libc::getpid() != OWNER.load(Ordering::SeqCst) {
            return;
        }
        let errno = *libc::__errno_location();
        let byte = signal as u8;
        libc::write(PIPE.load(Ordering::SeqCst), (&raw const byte).cast(), 1);
        *libc::__errno_location() = errno;
    }
}

fn clean_up_and_exit(signal: libc::c_int) -> ! {
    CLEANING.store(signal, Ordering::SeqCst);
    // Held until exit: a guard dropped meanwhile waits here instead of racing the clean-up
    // (and the thread dropping it goes no further); see register for one created meanwhile.
    let mut registry = registry();
    let mut done = registry.run_all(signal);
    let others = kill_remaining_children();
    if others > 0 {
        done.push(format!("{others} other child process(es)"));
    }
    let name = match signal {
        libc::SIGINT => "SIGINT",
        libc::SIGTERM => "SIGTERM",
        _ => "SIGHUP",
    };
    let done = if done.is_empty() {
        "nothing to clean up".to_owned()
    } else {
        format!("cleaned up {}", done.join(", "))
    };
    eprintln!("xtask: {name}: {done}; exiting with {}", 128 + signal);
    std::process::exit(128 + signal)
}

/// SIGKILLs the children no guard registered (short commands run with `output()`, such as a
/// lab client or redis-benchmark): they must not outlive xtask either. How many there were.
fn kill_remaining_children() -> usize {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    // Children are listed per thread (the one that started them).
    let pids: Vec<libc::pid_t> = (tasks.flatten())
        .filter_map(|task| std::fs::read_to_string(task.path().join("children")).ok())
        .flat_map(|list| {
            let pids: Vec<_> = list
                .split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect();
            pids
        })
        .collect();
    for &pid in &pids {
        // Not reaped (listed as our child): the pid is still this child's.
        stop(pid, libc::SIGKILL, KILL_GRACE);
    }
    pids.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn actions_run_newest_first_and_deregistered_ones_not_at_all() {
        let ran = std::sync::Arc::new(Mutex::new(Vec::new()));
        let mut registry = Registry::default();
        let mut add = |name: &'static str| {
            let ran = ran.clone();
            registry.add(
                name.into(),
                Box::new(move |_| ran.lock().unwrap().push(name)),
            )
        };
        let (_netns, qdisc, _child) = (add("netns"), add("qdisc"), add("child"));
        assert!(registry.remove(qdisc).is_some());
        assert!(registry.remove(qdisc).is_none());
        registry.add("panics".into(), Box::new(|_| panic!("an action failing")));
        let done = registry.run_all(libc::SIGTERM);
        assert_eq!(done, ["panics", "child", "netns"]);
        assert_eq!(*ran.lock().unwrap(), ["child", "netns"]);
        assert!(registry.entries.is_empty());
    }

    #[test]
    fn a_killed_child_is_gone_and_a_forwarded_one_gets_the_signal() {
        // `sleep` dies of SIGTERM at once: a forward that did not reach it would wait 30 s.
        for forward in [false, true] {
            let mut child = Command::new("sleep").arg("30").spawn().unwrap();
            let registered = if forward {
                forward_to_child(&child, "sleep")
            } else {
                kill_child(&child, "sleep")
            };
            let action = registry().remove(registered.0).expect("registered");
            let started = Instant::now();
            action(libc::SIGTERM);
            assert!(started.elapsed() < Duration::from_secs(5));
            // Reaped by the action: waiting for it finds no such child (ECHILD).
            assert!(child.try_wait().is_err());
        }
    }
}
