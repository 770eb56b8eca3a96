//! Two "machines" on one kernel: network namespaces A and B joined by a veth pair.
//!
//! Namespaces are made the way `ip netns add` makes them (a thread unshares its network
//! namespace and bind-mounts it under /run/netns), so `ip netns exec`, `meshlab record --netns`
//! and humans all see them. Links and addresses go through netlink (rtnetlink). Everything is
//! removed by [`Lab`]'s `Drop`, also when a test panics; `meshlab lab down` removes what a
//! crashed run left behind (names carry the owner's pid).

use std::ffi::CString;
use std::fs::File;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use futures::TryStreamExt;
use rtnetlink::{LinkUnspec, LinkVeth};

/// Where `ip netns` keeps named namespaces.
pub const NETNS_DIR: &str = "/run/netns";
/// Every lab namespace is named `mlab-<owner pid>-<n>-<a|b>`.
pub const LAB_PREFIX: &str = "mlab-";
/// Interface names inside the namespaces (each namespace has its own name space for links).
pub const VETH_A: &str = "veth-a";
pub const VETH_B: &str = "veth-b";

static NEXT_LAB: AtomicU32 = AtomicU32::new(0);

#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    #[error("{what}: {source}")]
    Os {
        what: String,
        source: std::io::Error,
    },
    #[error("netlink: {what}: {source}")]
    Netlink {
        what: String,
        source: rtnetlink::Error,
    },
    #[error("netlink: link {0} not found")]
    LinkNotFound(String),
}

fn os_err(what: impl Into<String>) -> NetnsError {
    NetnsError::Os {
        what: what.into(),
        source: std::io::Error::last_os_error(),
    }
}

fn nl_err(what: &str) -> impl FnOnce(rtnetlink::Error) -> NetnsError + '_ {
    move |source| NetnsError::Netlink {
        what: what.to_owned(),
        source,
    }
}

/// One named network namespace (a bind mount under /run/netns), removed on drop.
#[derive(Debug)]
pub struct NamedNetns {
    name: String,
    path: PathBuf,
    /// Held open so the namespace can be entered without re-resolving the path.
    file: File,
}

impl NamedNetns {
    /// Like `ip netns add NAME`.
    pub fn create(name: &str) -> Result<Self, NetnsError> {
        prepare_netns_dir()?;
        let path = Path::new(NETNS_DIR).join(name);
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(|source| NetnsError::Os {
                what: format!("create {}", path.display()),
                source,
            })?;
        let target = path.clone();
        // A fresh thread unshares only its own network namespace; the process keeps its own.
        let mounted = std::thread::spawn(move || -> Result<(), NetnsError> {
            // SAFETY: unshare/mount are plain syscalls on this thread's own state.
            if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
                return Err(os_err("unshare(CLONE_NEWNET)"));
            }
            let src = CString::new("/proc/thread-self/ns/net").expect("no NUL");
            let dst = CString::new(target.as_os_str().as_encoded_bytes()).expect("no NUL");
            let none = CString::new("none").expect("no NUL");
            // SAFETY: all pointers are valid NUL-terminated strings living across the call.
            let rc = unsafe {
                libc::mount(
                    src.as_ptr(),
                    dst.as_ptr(),
                    none.as_ptr(),
                    libc::MS_BIND,
                    std::ptr::null(),
                )
            };
            if rc != 0 {
                return Err(os_err(format!("bind mount netns on {}", target.display())));
            }
            Ok(())
        })
        .join()
        .expect("netns thread panicked");
        if let Err(e) = mounted {
            let _ = std::fs::remove_file(&path);
            return Err(e);
        }
        let file = File::open(&path).map_err(|source| NetnsError::Os {
            what: format!("open {}", path.display()),
            source,
        })?;
        Ok(Self {
            name: name.to_owned(),
            path,
            file,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// `/run/netns/NAME`, the form `meshlab record --netns` takes.
    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }

    /// Makes `cmd` run inside this namespace.
    pub fn command(&self, cmd: &mut Command) {
        enter_in_child(cmd, self.fd());
    }

    /// Runs `f` on a new thread that has joined this namespace (sockets it opens live there).
    pub fn run_in<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<std::thread::JoinHandle<Result<T, NetnsError>>, NetnsError> {
        let fd = self.file.try_clone().map_err(|source| NetnsError::Os {
            what: "dup netns fd".into(),
            source,
        })?;
        Ok(std::thread::spawn(move || {
            // SAFETY: setns on this thread only; fd is a valid open nsfs file.
            if unsafe { libc::setns(fd.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                return Err(os_err("setns"));
            }
            Ok(f())
        }))
    }
}

impl Drop for NamedNetns {
    fn drop(&mut self) {
        if let Err(e) = remove_named_netns(&self.path) {
            log::warn!("removing {}: {e}", self.path.display());
        }
    }
}

/// Adds a `pre_exec` hook that moves the child into the namespace behind `netns_fd`.
///
/// Soundness: the hook runs in the forked child before exec, where only async-signal-safe
/// operations are allowed. It calls only `setns(2)` (a raw syscall: no allocation, no locks)
/// and reads errno through `io::Error::last_os_error` (no allocation for OS errors). The fd
/// was opened by the parent before the fork and stays open in the child until exec, even
/// with O_CLOEXEC; the parent keeps it open for as long as the `Command` can be spawned.
pub fn enter_in_child(cmd: &mut Command, netns_fd: RawFd) {
    // SAFETY: see the function documentation.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setns(netns_fd, libc::CLONE_NEWNET) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Makes /run/netns a shared mount point as `ip netns` does, so a namespace mounted there is
/// visible in every mount namespace that shares it.
fn prepare_netns_dir() -> Result<(), NetnsError> {
    std::fs::create_dir_all(NETNS_DIR).map_err(|source| NetnsError::Os {
        what: format!("mkdir {NETNS_DIR}"),
        source,
    })?;
    let dir = CString::new(NETNS_DIR).expect("no NUL");
    let none = CString::new("none").expect("no NUL");
    let empty = CString::new("").expect("no NUL");
    // SAFETY: valid NUL-terminated strings; a null data pointer is allowed.
    unsafe {
        let flags = libc::MS_SHARED | libc::MS_REC;
        if libc::mount(
            empty.as_ptr(),
            dir.as_ptr(),
            none.as_ptr(),
            flags,
            std::ptr::null(),
        ) == 0
        {
            return Ok(());
        }
        if std::io::Error::last_os_error().raw_os_error() != Some(libc::EINVAL) {
            return Err(os_err(format!("make {NETNS_DIR} shared")));
        }
        // Not a mount point yet: bind it onto itself first (what iproute2 does).
        let bind = libc::MS_BIND | libc::MS_REC;
        if libc::mount(
            dir.as_ptr(),
            dir.as_ptr(),
            none.as_ptr(),
            bind,
            std::ptr::null(),
        ) != 0
        {
            return Err(os_err(format!("bind {NETNS_DIR} onto itself")));
        }
        if libc::mount(
            empty.as_ptr(),
            dir.as_ptr(),
            none.as_ptr(),
            flags,
            std::ptr::null(),
        ) != 0
        {
            return Err(os_err(format!("make {NETNS_DIR} shared")));
        }
    }
    Ok(())
}

/// Like `ip netns del`: detach the bind mount, then remove the file. The namespace itself
/// dies with its last user (process or open fd).
pub fn remove_named_netns(path: &Path) -> Result<(), NetnsError> {
    let c = CString::new(path.as_os_str().as_encoded_bytes()).expect("no NUL");
    // SAFETY: valid NUL-terminated path.
    if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } != 0 {
        let e = std::io::Error::last_os_error();
        // EINVAL: not mounted (a half-made namespace); still remove the file.
        if e.raw_os_error() != Some(libc::EINVAL) {
            return Err(NetnsError::Os {
                what: format!("umount {}", path.display()),
                source: e,
            });
        }
    }
    std::fs::remove_file(path).map_err(|source| NetnsError::Os {
        what: format!("remove {}", path.display()),
        source,
    })
}

/// Addresses of the two ends of the lab's veth pair (a /24 inside 10.201.0.0/16).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LabAddrs {
    pub a: Ipv4Addr,
    pub b: Ipv4Addr,
}

/// Two namespaces joined by a veth pair; everything goes away on drop.
#[derive(Debug)]
pub struct Lab {
    // Field order: B first is irrelevant; each namespace removes itself.
    pub a: NamedNetns,
    pub b: NamedNetns,
    pub addrs: LabAddrs,
}

impl Lab {
    /// Creates `mlab-<pid>-<n>-a` and `-b`, the veth pair, addresses and `lo` in both.
    pub fn create() -> Result<Self, NetnsError> {
        let pid = std::process::id();
        let n = NEXT_LAB.fetch_add(1, Ordering::Relaxed);
        // Distinct subnets per lab keep 4-tuples apart if someone records without a netns filter.
        let subnet = (1 + (pid.wrapping_mul(31).wrapping_add(n)) % 250) as u8;
        let addrs = LabAddrs {
            a: Ipv4Addr::new(10, 201, subnet, 1),
            b: Ipv4Addr::new(10, 201, subnet, 2),
        };
        let a = NamedNetns::create(&format!("{LAB_PREFIX}{pid}-{n}-a"))?;
        let b = NamedNetns::create(&format!("{LAB_PREFIX}{pid}-{n}-b"))?;
        let b_fd = b.file.try_clone().map_err(|source| NetnsError::Os {
            what: "dup netns fd".into(),
            source,
        })?;
        netlink_in(&a, move |h| async move {
            h.link()
                .add(LinkVeth::new(VETH_A, VETH_B).build())
                .execute()
                .await
                .map_err(nl_err("add veth pair"))?;
            let peer = LinkUnspec::new_with_name(VETH_B)
                .setns_by_fd(b_fd.as_raw_fd())
                .build();
            h.link()
                .set(peer)
                .execute()
                .await
                .map_err(nl_err("move veth-b to B"))?;
            configure(&h, VETH_A, addrs.a).await
        })?;
        netlink_in(
            &b,
            move |h| async move { configure(&h, VETH_B, addrs.b).await },
        )?;
        Ok(Self { a, b, addrs })
    }
}

/// Runs a netlink conversation from inside `ns` (the socket belongs to the namespace of the
/// thread that opens it).
fn netlink_in<F, Fut>(ns: &NamedNetns, f: F) -> Result<(), NetnsError>
where
    F: FnOnce(rtnetlink::Handle) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<(), NetnsError>>,
{
    ns.run_in(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|source| NetnsError::Os {
                what: "tokio runtime".into(),
                source,
            })?;
        rt.block_on(async move {
            let (conn, handle, _) =
                rtnetlink::new_connection().map_err(|source| NetnsError::Os {
                    what: "netlink socket".into(),
                    source,
                })?;
            let task = tokio::spawn(conn);
            let result = f(handle).await;
            task.abort();
            result
        })
    })?
    .join()
    .expect("netlink thread panicked")?
}

async fn link_index(h: &rtnetlink::Handle, name: &str) -> Result<u32, NetnsError> {
    let mut links = h.link().get().match_name(name.to_owned()).execute();
    match links.try_next().await {
        Ok(Some(msg)) => Ok(msg.header.index),
        Ok(None) => Err(NetnsError::LinkNotFound(name.to_owned())),
        Err(source) => Err(NetnsError::Netlink {
            what: format!("get link {name}"),
            source,
        }),
    }
}

/// Address on `dev` (/24), `dev` and `lo` up.
async fn configure(h: &rtnetlink::Handle, dev: &str, addr: Ipv4Addr) -> Result<(), NetnsError> {
    let index = link_index(h, dev).await?;
    h.address()
        .add(index, addr.into(), 24)
        .execute()
        .await
        .map_err(nl_err("add address"))?;
    for name in [dev, "lo"] {
        let index = link_index(h, name).await?;
        let up = LinkUnspec::new_with_index(index).up().build();
        h.link()
            .set(up)
            .execute()
            .await
            .map_err(nl_err("set link up"))?;
    }
    Ok(())
}
