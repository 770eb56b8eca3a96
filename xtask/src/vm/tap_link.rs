//! The multi-queue link between the two guests (`vm run --queues N`, N > 1): qemu's datagram
//! link has one queue, so each guest's NIC is instead backed by a multi-queue tap, and the two
//! taps are joined by a bridge. Taps and bridge live in a network namespace created for the
//! run: no host interface, no address (IPv6 link-local ones switched off too), no route out;
//! the guests reach only each other. The namespace's name is removed as soon as it is set up:
//! the open namespace file and the qemu processes that entered it keep it alive, and the
//! kernel frees it, taps and bridge included, once they are all gone, however xtask ends
//! (SIGKILL included). Needs root on the host.
//!
//! The host's tap driver picks the queue a frame enters the guest on from the flow: the queue
//! the guest last sent that flow on (tun's automatic flow steering), else the flow's hash. So
//! several connections spread over the queues, each staying on one.

use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd};
use std::process::Command;

use anyhow::{Context, Result};

use crate::procs::{Netns, run_quiet};

const BRIDGE: &str = "br0";

/// Guest `index`'s tap inside the link's namespace.
pub fn tap_name(index: usize) -> String {
    format!("tap{index}")
}

/// The namespace with the bridge and both guests' taps, held by an open file only.
pub struct TapLink {
    /// Each qemu enters it before exec (qemu.rs `spawn_qemu`).
    netns: File,
}

impl TapLink {
    pub fn create(queues: u8) -> Result<TapLink> {
        let what = || format!("setting up the {queues}-queue tap link (needs root)");
        let netns = Netns::add(&format!("mlvm-link-{}", std::process::id())).with_context(what)?;
        let ip = |args: &[&str]| {
            run_quiet(Command::new("ip").args(["-n", &netns.name]).args(args)).with_context(what)
        };
        ip(&["link", "add", BRIDGE, "type", "bridge"])?;
        // No IPv6 link-local address, so nothing of the host's sends into the guests.
        ip(&["link", "set", BRIDGE, "addrgenmode", "none"])?;
        for index in 0..2 {
            let tap = tap_name(index);
            ip(&["tuntap", "add", "dev", &tap, "mode", "tap", "multi_queue"])?;
            ip(&["link", "set", &tap, "addrgenmode", "none"])?;
            ip(&["link", "set", &tap, "master", BRIDGE])?;
            ip(&["link", "set", &tap, "up"])?;
        }
        ip(&["link", "set", BRIDGE, "up"])?;
        let path = format!("/run/netns/{}", netns.name);
        let netns_file = File::open(&path).with_context(|| format!("opening {path}"))?;
        // `netns` drops here: its name goes, the namespace stays with the file.
        Ok(TapLink { netns: netns_file })
    }

    pub fn netns(&self) -> BorrowedFd<'_> {
        self.netns.as_fd()
    }
}
