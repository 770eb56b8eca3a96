//! The multi-queue link between the two guests (`vm run --queues N`, N > 1): qemu's datagram
//! link has one queue, so each guest's NIC is instead backed by a multi-queue tap, and the two
//! taps are joined by a bridge. Taps and bridge live in a network namespace created for the
//! run (deleted with everything in it when the run ends or xtask is killed): no host
//! interface, no address on the host side, no route out; the guests reach only each other.
//!
//! The host's tap driver picks the queue a frame enters the guest on from the flow: the queue
//! the guest last sent that flow on (tun's automatic flow steering), else the flow's hash. So
//! several connections spread over the queues, each staying on one.

use std::fs::File;
use std::os::fd::{AsRawFd, RawFd};
use std::process::Command;

use anyhow::{Context, Result};

use crate::procs::{Netns, run_quiet};

const BRIDGE: &str = "br0";

/// Guest `index`'s tap inside the link's namespace.
pub fn tap_name(index: usize) -> String {
    format!("tap{index}")
}

/// The namespace with the bridge and both guests' taps.
pub struct TapLink {
    /// Opened before qemu starts: each qemu enters it (qemu.rs `spawn_qemu`).
    file: File,
    _netns: Netns,
}

impl TapLink {
    pub fn create(queues: u8) -> Result<TapLink> {
        let netns = Netns::add(&format!("mlvm-link-{}", std::process::id()))?;
        let ip = |args: &[&str]| {
            run_quiet(Command::new("ip").args(["-n", &netns.name]).args(args))
                .with_context(|| format!("setting up the {queues}-queue tap link"))
        };
        ip(&["link", "add", BRIDGE, "type", "bridge"])?;
        for index in 0..2 {
            let tap = tap_name(index);
            ip(&["tuntap", "add", "dev", &tap, "mode", "tap", "multi_queue"])?;
            ip(&["link", "set", &tap, "master", BRIDGE])?;
            ip(&["link", "set", &tap, "up"])?;
        }
        ip(&["link", "set", BRIDGE, "up"])?;
        let path = format!("/run/netns/{}", netns.name);
        let file = File::open(&path).with_context(|| format!("opening {path}"))?;
        Ok(TapLink {
            file,
            _netns: netns,
        })
    }

    pub fn netns(&self) -> RawFd {
        self.file.as_raw_fd()
    }
}
