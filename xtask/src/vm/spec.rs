//! What a run of the guests is (the [`RunSpec`]) and the private link between them: shared by
//! the guest runner (guest.rs) and the qemu command lines (qemu.rs).

use std::path::PathBuf;
use std::time::Duration;

use super::image::BootFiles;
use super::kernel::KernelLabel;

/// The private link: guest A and guest B only, over a pair of unix datagram sockets between
/// the two qemu processes. No host interface, no route, no gateway.
pub const LINK_ADDRS: [&str; 2] = ["10.213.0.1", "10.213.0.2"];
pub const LINK_PREFIX: u8 = 24;
/// The second link (`vm run --nics 2`): each guest's eth1, on a datagram link of its own.
pub const LINK2_ADDRS: [&str; 2] = ["10.214.0.1", "10.214.0.2"];
pub const GUEST_NAMES: [&str; 2] = ["a", "b"];
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
    /// Two guests: put the delaying relay of wire.rs between their sockets.
    pub wire: Option<WireSpec>,
    /// Extra kernel command-line parameters of every guest (e.g. `threadirqs`).
    pub kernel_args: Vec<String>,
    /// Two guests: queue pairs of each guest's NIC. 1 = the datagram link; more = the
    /// multi-queue tap link of tap_link.rs (qemu's datagram link has one queue).
    pub queues: u8,
    /// Two guests: NICs per guest. 2 = a second NIC (eth1) on a second datagram link, straight
    /// between the two qemu.
    pub nics: u8,
}

/// The wire relay's start delay (one way) and where it writes what the frames really took.
#[derive(Debug, Clone)]
pub struct WireSpec {
    pub delay_us: u64,
    pub log: Option<PathBuf>,
}
