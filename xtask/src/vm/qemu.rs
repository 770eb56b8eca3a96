//! The qemu command line of a guest, and starting qemu so it cannot outlive xtask.

use std::ffi::OsString;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use anyhow::{Context, Result};

use super::spec::{GUEST_NAMES, LINK_ADDRS, LINK_PREFIX, LINK2_ADDRS, RunSpec};
use super::tap_link::tap_name;
use super::wire::{link_socket, wire_socket};

const QEMU: &str = "qemu-system-x86_64";

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
        // TCG: KVM hangs on stock kernels on this host (docs/vm.md).
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
        args.extend(link_args(spec, index, run_dir));
        append += &format!(
            " meshlab.addr={}/{LINK_PREFIX} meshlab.peer={}",
            LINK_ADDRS[index],
            LINK_ADDRS[1 - index]
        );
    }
    if spec.commands.len() == 2 && spec.nics > 1 {
        args.extend(second_link_args(index, run_dir));
        append += &format!(
            " meshlab.addr2={}/{LINK_PREFIX} meshlab.peer2={}",
            LINK2_ADDRS[index],
            LINK2_ADDRS[1 - index]
        );
    }
    append += &extra_kernel_params(spec);
    args.push("-append".into());
    args.push(append);
    args.into_iter().map(OsString::from).collect()
}

/// Guest `index`'s NIC on the link: straight to the peer's socket, through the delaying relay
/// (wire.rs), or, with several queues, a multi-queue tap of tap_link.rs (qemu is started in
/// its namespace). vhost stays off: the host kernel's vhost-net would move the queues' work
/// out of qemu, which is not what a TCG guest measures anyway, and needs a module.
fn link_args(spec: &RunSpec, index: usize, run_dir: &Path) -> [String; 4] {
    let mac = format!("mac=52:54:00:6d:6c:0{}", index + 1);
    if spec.queues > 1 {
        let (queues, tap) = (spec.queues, tap_name(index));
        // MSI-X: one vector per RX and per TX queue, one for config changes and one for the
        // control queue (which Linux guests poll, so it stays unused).
        let vectors = 2 * u32::from(queues) + 2;
        return [
            "-netdev".into(),
            format!("tap,id=link,ifname={tap},script=no,downscript=no,vhost=off,queues={queues}"),
            "-device".into(),
            format!("virtio-net-pci,netdev=link,mq=on,vectors={vectors},{mac}"),
        ];
    }
    let local = escape(&link_socket(run_dir, index));
    let remote = match spec.wire {
        Some(_) => escape(&wire_socket(run_dir, index)),
        None => escape(&link_socket(run_dir, 1 - index)),
    };
    [
        "-netdev".into(),
        format!(
            "dgram,id=link,local.type=unix,local.path={local},remote.type=unix,remote.path={remote}"
        ),
        "-device".into(),
        format!("virtio-net-pci,netdev=link,{mac}"),
    ]
}

/// Guest `index`'s second NIC (eth1: probed after the first, whose device comes first on the
/// command line): straight to the peer's second socket.
fn second_link_args(index: usize, run_dir: &Path) -> [String; 4] {
    let socket = |i: usize| escape(&run_dir.join(format!("link2-{}.sock", GUEST_NAMES[i])));
    [
        "-netdev".into(),
        format!(
            "dgram,id=link2,local.type=unix,local.path={},remote.type=unix,remote.path={}",
            socket(index),
            socket(1 - index)
        ),
        "-device".into(),
        format!(
            "virtio-net-pci,netdev=link2,mac=52:54:00:6d:6d:0{}",
            index + 1
        ),
    ]
}

/// The run's own kernel parameters, then `MESHLAB_VM_APPEND`'s (for debugging a boot, e.g.
/// `MESHLAB_VM_APPEND=loglevel=7`), each after a space.
fn extra_kernel_params(spec: &RunSpec) -> String {
    let from_env = std::env::var("MESHLAB_VM_APPEND").ok();
    (spec.kernel_args.iter().map(String::as_str))
        .chain(from_env.as_deref())
        .map(|param| format!(" {param}"))
        .collect()
}

/// qemu option values escape a comma by doubling it.
fn escape(path: &Path) -> String {
    path.display().to_string().replace(',', ",,")
}

/// Starts qemu; inside network namespace `netns` (an open namespace file) when given.
pub fn spawn_qemu(args: &[OsString], netns: Option<BorrowedFd<'_>>) -> Result<Child> {
    let netns = netns.map(|fd| fd.as_raw_fd());
    let mut cmd = Command::new(QEMU);
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    // Own process group: a terminal Ctrl-C reaches only xtask, which kills the guests in order
    // (crate::cleanup).
    cmd.process_group(0);
    // SAFETY: the closure runs in the forked child before exec and only calls prctl and
    // setns, which are async-signal-safe system calls. PDEATHSIG kills qemu if xtask dies
    // without running its destructors; `netns` is borrowed, so open while qemu starts.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if let Some(fd) = netns
                && libc::setns(fd, libc::CLONE_NEWNET) != 0
            {
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::vm::image::BootFiles;
    use crate::vm::kernel::KernelLabel;

    fn spec(guests: usize) -> RunSpec {
        RunSpec {
            label: KernelLabel::V6_12,
            boot: BootFiles {
                release: "6.12.0-amd64".into(),
                vmlinux: "/k/vmlinux".into(),
                initramfs: "/k/initramfs.cpio".into(),
            },
            commands: vec!["true".into(); guests],
            cwd: "/".into(),
            timeout: Duration::from_secs(1),
            memory_mib: 512,
            cpus: 1,
            rw_dirs: vec!["/out,dir".into()],
            stream: false,
            wire: None,
            kernel_args: Vec::new(),
            queues: 1,
            nics: 1,
        }
    }

    fn args(spec: &RunSpec, index: usize) -> Vec<String> {
        let run = Path::new("/tmp/run");
        let log = Path::new("/tmp/log");
        qemu_args(spec, index, run, log)
            .into_iter()
            .map(|a| a.into_string().expect("utf-8"))
            .collect()
    }

    #[test]
    fn no_default_devices_and_no_network_for_one_guest() {
        let args = args(&spec(1), 0);
        assert_eq!(args[0], "-nodefaults");
        // No NIC at all: neither a netdev (user-mode NAT or other) nor a NIC model.
        assert!(
            !args
                .iter()
                .any(|a| a.contains("netdev") || a.starts_with("user"))
        );
        assert!(args.contains(
            &"local,id=hostroot,path=/,security_model=none,multidevs=remap,readonly=on".into()
        ));
        // A comma in a path is doubled, as qemu's option parser expects.
        assert!(args.iter().any(|a| a.contains("path=/out,,dir,")));
    }

    #[test]
    fn the_two_guests_send_to_each_others_socket() {
        let spec = spec(2);
        let (a, b) = (args(&spec, 0).join(" "), args(&spec, 1).join(" "));
        assert!(a.contains(
            "local.path=/tmp/run/link-a.sock,remote.type=unix,remote.path=/tmp/run/link-b.sock"
        ));
        assert!(b.contains(
            "local.path=/tmp/run/link-b.sock,remote.type=unix,remote.path=/tmp/run/link-a.sock"
        ));
        assert!(a.contains("meshlab.addr=10.213.0.1/24 meshlab.peer=10.213.0.2"));
        assert!(b.contains("meshlab.addr=10.213.0.2/24 meshlab.peer=10.213.0.1"));
        assert!(!a.contains("-netdev user") && !b.contains("-netdev user"));
    }

    #[test]
    fn a_second_nic_has_a_link_and_a_subnet_of_its_own() {
        let mut spec = spec(2);
        spec.nics = 2;
        let (a, b) = (args(&spec, 0).join(" "), args(&spec, 1).join(" "));
        assert!(a.contains(
            "local.path=/tmp/run/link2-a.sock,remote.type=unix,remote.path=/tmp/run/link2-b.sock"
        ));
        assert!(b.contains(
            "local.path=/tmp/run/link2-b.sock,remote.type=unix,remote.path=/tmp/run/link2-a.sock"
        ));
        // eth0 first: the device on the command line first is probed first.
        let (eth0, eth1) = (a.find("netdev=link,"), a.find("netdev=link2,"));
        assert!(eth0.is_some() && eth0 < eth1, "{a}");
        assert!(a.contains("meshlab.addr2=10.214.0.1/24 meshlab.peer2=10.214.0.2"));
        assert!(b.contains("meshlab.addr2=10.214.0.2/24 meshlab.peer2=10.214.0.1"));
    }

    #[test]
    fn extra_kernel_parameters_end_every_guests_command_line() {
        let mut spec = spec(2);
        spec.kernel_args = vec!["threadirqs".into()];
        for index in 0..2 {
            let args = args(&spec, index);
            let append = args.iter().position(|a| a == "-append").expect("-append");
            let line = &args[append + 1];
            assert!(line.starts_with("console=ttyS0 "), "{line}");
            assert!(line.contains(" meshlab.peer="), "{line}");
            assert!(line.ends_with(" threadirqs"), "{line}");
        }
    }

    #[test]
    fn with_the_wire_each_guest_sends_to_the_relay() {
        let mut spec = spec(2);
        spec.wire = Some(crate::vm::spec::WireSpec {
            delay_us: 100,
            log: None,
        });
        let (a, b) = (args(&spec, 0).join(" "), args(&spec, 1).join(" "));
        assert!(a.contains(
            "local.path=/tmp/run/link-a.sock,remote.type=unix,remote.path=/tmp/run/wire-a.sock"
        ));
        assert!(b.contains(
            "local.path=/tmp/run/link-b.sock,remote.type=unix,remote.path=/tmp/run/wire-b.sock"
        ));
    }

    #[test]
    fn with_several_queues_each_guest_has_its_own_multi_queue_tap() {
        let mut spec = spec(2);
        spec.queues = 2;
        for (index, tap) in ["tap0", "tap1"].into_iter().enumerate() {
            let args = args(&spec, index);
            let netdev = args.iter().position(|a| a == "-netdev").expect("-netdev");
            assert_eq!(
                args[netdev + 1],
                format!("tap,id=link,ifname={tap},script=no,downscript=no,vhost=off,queues=2")
            );
            let nic = &args[netdev + 3];
            assert!(
                nic.starts_with("virtio-net-pci,netdev=link,mq=on,vectors=6,"),
                "{nic}"
            );
            // One NIC per guest, and no socket link besides it.
            assert_eq!(args.iter().filter(|a| *a == "-netdev").count(), 1);
            assert!(!args.join(" ").contains("dgram"));
        }
    }
}
