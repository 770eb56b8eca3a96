//! Loss on the wire between truth's two namespaces (cause `wire-loss`): an XDP program on each
//! veth drops a share of the frames arriving there, at random. veth runs native XDP in its
//! NAPI poll, before `netif_receive_skb`, so a dropped frame is like one lost on a cable or in
//! a switch: the sender's stages all happened (its driver handed the frame on), the receiver's
//! stack never sees it, and TCP's retransmission (a tail loss probe or the RTO) brings it.
//!
//! The same program with no loss runs in the runs without the cause: XDP on a veth moves its
//! receive into NAPI (and turns off the peer's GSO), so both conditions take the same path.
//! The host has no act_gact, nftables or iptables to drop with (docs/truth.md), and the
//! program is a few instructions, so it is assembled here (crate::bpfraw), not built.
//!
//! The links are file descriptors of this process: they detach when dropped and when xtask
//! dies; the devices go with their namespaces.

use std::fs::File;
use std::os::fd::{AsRawFd, OwnedFd};

use anyhow::{Context, Result, bail};

use crate::bpfraw::{Asm, BPF_PROG_TYPE_XDP, R0, attach_xdp, helper, load_program};

/// `enum xdp_action`.
const XDP_DROP: i32 = 1;
const XDP_PASS: i32 = 2;
const PER_MILLION: u32 = 1_000_000;

/// XDP droppers attached to devices; detached on drop.
pub struct WireLoss {
    _links: Vec<OwnedFd>,
}

impl WireLoss {
    /// Drops `loss_ppm` frames in a million, each at random, as they arrive at each of
    /// `devices` (network namespace name, device name).
    pub fn attach(devices: &[(&str, &str)], loss_ppm: u32) -> Result<WireLoss> {
        let program = load_program(BPF_PROG_TYPE_XDP, "truth_wireloss", &dropper(loss_ppm))?;
        let links = (devices.iter())
            .map(|(netns, dev)| {
                attach_in_netns(&program, netns, dev)
                    .with_context(|| format!("XDP dropper on {dev} in namespace {netns}"))
            })
            .collect::<Result<_>>()?;
        Ok(WireLoss { _links: links })
    }
}

/// `XDP_DROP` when a random u32 falls below [`drop_threshold`], else `XDP_PASS`.
fn dropper(loss_ppm: u32) -> Asm {
    let mut asm = Asm::default();
    asm.call(helper::GET_PRANDOM_U32);
    if loss_ppm >= PER_MILLION {
        asm.exit_with(XDP_DROP);
        return asm;
    }
    let drop = asm.jlt32_imm_fwd(R0, drop_threshold(loss_ppm));
    asm.exit_with(XDP_PASS);
    asm.label_here(drop);
    asm.exit_with(XDP_DROP);
    asm
}

/// The u32 a uniformly random u32 falls below with probability `loss_ppm` / 1e6 (< 1e6).
fn drop_threshold(loss_ppm: u32) -> u32 {
    ((u64::from(loss_ppm) << 32) / u64::from(PER_MILLION)) as u32
}

/// Attaches from a thread of its own that enters the namespace (a link is created against the
/// caller's network namespace) and ends after the attach: the rest of xtask stays where it is.
fn attach_in_netns(program: &OwnedFd, netns: &str, dev: &str) -> Result<OwnedFd> {
    let dev = std::ffi::CString::new(dev)?;
    std::thread::scope(|scope| {
        let attach = scope.spawn(|| {
            enter_netns(netns)?;
            // SAFETY: a NUL-terminated name.
            let ifindex = unsafe { libc::if_nametoindex(dev.as_ptr()) };
            if ifindex == 0 {
                bail!("no device {dev:?}: {}", std::io::Error::last_os_error());
            }
            attach_xdp(program, ifindex)
        });
        attach
            .join()
            .map_err(|_| anyhow::anyhow!("attach thread panicked"))?
    })
}

/// Moves the calling thread (only it: network namespaces are per thread) into `ip netns`
/// namespace `netns`.
fn enter_netns(netns: &str) -> Result<()> {
    let ns = File::open(format!("/run/netns/{netns}"))
        .with_context(|| format!("opening /run/netns/{netns}"))?;
    // SAFETY: `ns` is an open namespace file; setns changes only this thread's namespace.
    if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        bail!("setns into {netns}: {}", std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::net::UdpSocket;
    use std::time::Duration;

    use super::*;
    use crate::truth_lab::TruthNetns;

    #[test]
    fn the_threshold_is_the_loss_share_of_the_u32_range() {
        assert_eq!(drop_threshold(0), 0);
        assert_eq!(drop_threshold(10_000), 42_949_672); // 1 %: floor(2^32 / 100)
        assert_eq!(drop_threshold(500_000), 1 << 31);
        assert_eq!(drop_threshold(999_999), u32::MAX - 4_294);
    }

    /// Datagrams `count` from A's address to B's, and how many B received (within 300 ms
    /// of the last), each side from a thread inside its namespace.
    fn udp_across(ns: &TruthNetns, count: usize) -> Result<usize> {
        let port = 47_000 + (std::process::id() % 1000) as u16;
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        std::thread::scope(|scope| {
            let receiver = scope.spawn(|| -> Result<usize> {
                enter_netns(&ns.b)?;
                let socket = UdpSocket::bind((ns.addr_b.as_str(), port))?;
                socket.set_read_timeout(Some(Duration::from_millis(300)))?;
                ready_tx.send(())?;
                let mut got = 0;
                let mut buf = [0u8; 64];
                while socket.recv(&mut buf).is_ok() {
                    got += 1;
                }
                Ok(got)
            });
            ready_rx.recv()?;
            scope
                .spawn(|| -> Result<()> {
                    enter_netns(&ns.a)?;
                    let socket = UdpSocket::bind((ns.addr_a.as_str(), 0))?;
                    for _ in 0..count {
                        socket.send_to(b"meshlab wire-loss test", (ns.addr_b.as_str(), port))?;
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    Ok(())
                })
                .join()
                .map_err(|_| anyhow::anyhow!("sender panicked"))??;
            receiver
                .join()
                .map_err(|_| anyhow::anyhow!("receiver panicked"))?
        })
    }

    /// Traffic only between the two namespaces the test creates (and removes on drop).
    #[test]
    fn no_loss_passes_every_frame_and_full_loss_drops_every_frame() -> Result<()> {
        if !meshlab_testkit::privileged::privileged_or_skip("wire_loss") {
            return Ok(());
        }
        let ns = TruthNetns::create("xtwl")?;
        {
            let _pass = WireLoss::attach(&[(&ns.b, &ns.dev_b), (&ns.a, &ns.dev_a)], 0)?;
            // veth's native hook (`xdp`), ahead of netif_receive_skb; the generic one
            // (`xdpgeneric`) would run after it, inside the receiver's stack.
            let link = crate::procs::run_quiet(
                std::process::Command::new("ip").args(["-n", &ns.b, "link", "show", &ns.dev_b]),
            )?;
            let link = String::from_utf8_lossy(&link);
            assert!(
                link.contains(" xdp ") && !link.contains("xdpgeneric"),
                "not attached natively: {link}"
            );
            assert_eq!(udp_across(&ns, 50)?, 50, "loss 0 must pass every datagram");
        }
        {
            let _drop = WireLoss::attach(&[(&ns.b, &ns.dev_b)], PER_MILLION)?;
            assert_eq!(
                udp_across(&ns, 50)?,
                0,
                "loss 100 % must drop every datagram"
            );
        }
        // Detached again: everything passes.
        assert_eq!(
            udp_across(&ns, 20)?,
            20,
            "dropping the links must detach them"
        );
        Ok(())
    }
}
