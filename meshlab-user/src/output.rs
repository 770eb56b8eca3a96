//! Every file meshlab writes is opened here, because `sudo meshlab record -o /tmp/x` runs as
//! root in directories other users can write to (docs/security.md has the threat model).
//!
//! The rules, for every output (recordings, ready files, merged files, reports, lab files):
//! - the final path component is never followed if it is a symbolic link, and an existing
//!   non-regular file (FIFO, device, directory) is refused;
//! - a file is created exclusively (`O_CREAT|O_EXCL|O_NOFOLLOW`), or written under a hidden
//!   temporary name in the same directory and renamed over the old one: an existing file is
//!   never truncated or written in place, so a hard link to someone else's file is never
//!   written through;
//! - ownership is handed to the invoking user (SUDO_UID/SUDO_GID, only when running as root)
//!   with fchown on the open descriptor, never by path;
//! - a directory writable by others (world-writable, writable by a foreign group, or owned by
//!   another user) is refused unless it is sticky, and in a sticky one (like /tmp) only a new
//!   file of ours is created: an existing file there is refused, and the final rename will
//!   not replace anything that appeared meanwhile (RENAME_NOREPLACE);
//! - a symbolic link among the parent directories is followed only if it sits in a directory
//!   nobody else can write to, or is owned by root or by us (the rule of the kernel's
//!   fs.protected_symlinks, enforced here whatever that sysctl says);
//! - an existing file is replaced only if it belongs to us (or to the invoking user).
//!
//! The API, stable for every writer in the crate: [`create_output`] with a [`Policy`], then
//! write to the [`Output`] and [`Output::commit`]; [`write_output`] for a whole buffer;
//! [`check_output`] to refuse a bad path before slow work, without creating anything.

use std::ffi::{CString, OsStr};
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

/// How a new output becomes visible under its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// Visible under its name from the start and written as it goes (recordings, ready
    /// files): whatever was written survives a crash. An earlier file of ours is replaced at
    /// open time by a fresh file renamed over it.
    Stream,
    /// Written under a hidden temporary name and renamed into place by [`Output::commit`]
    /// (merged files, reports): a failed run leaves any earlier file untouched.
    Atomic,
}

/// Why an output was not opened; its Display names the path and what to do.
#[derive(Debug, thiserror::Error)]
#[error("{}: {reason}", path.display())]
pub struct OutputError {
    pub path: PathBuf,
    pub reason: Refusal,
}

#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    #[error(
        "is a symbolic link; meshlab never writes through one (remove it or choose another name)"
    )]
    Symlink,
    #[error("exists and is a {0}, not a regular file")]
    NotRegular(&'static str),
    #[error(
        "exists and belongs to uid {0}, not to this user; meshlab only replaces its user's own files (remove it or choose another name)"
    )]
    ForeignOwner(u32),
    #[error(
        "exists in {}, a directory others may write to; meshlab only creates new files there (remove it or choose another name)",
        dir.display()
    )]
    ExistsInSharedDir { dir: PathBuf },
    #[error(
        "directory {} is {why} and not sticky, so anyone could swap the file; choose another directory",
        dir.display()
    )]
    UnsafeDir { dir: PathBuf, why: String },
    #[error(
        "directory {} is owned by uid {owner}, who could swap the file; choose another directory",
        dir.display()
    )]
    ForeignDir { dir: PathBuf, owner: u32 },
    #[error(
        "{} is a symbolic link owned by uid {owner} in a directory others may write to; refusing to follow it",
        link.display()
    )]
    UntrustedSymlink { link: PathBuf, owner: u32 },
    #[error("cannot open directory {}: {source}", dir.display())]
    Dir {
        dir: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("appeared while it was being written; it was left alone")]
    AppearedMeanwhile,
    #[error("has no file name")]
    NoFileName,
    #[error("contains a NUL byte")]
    NulInName,
    #[error("{what}: {source}")]
    Io {
        what: &'static str,
        #[source]
        source: io::Error,
    },
}

/// An output being written. Dropped without [`Output::commit`], an `Atomic` output's
/// temporary file is removed and any earlier file stays as it was.
#[derive(Debug)]
pub struct Output {
    file: File,
    path: PathBuf,
    pending: Option<PendingRename>,
}

impl Output {
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Makes the output visible under its name (Atomic: fsync, then rename) and returns the
    /// still-open file. For `Stream` it only hands the file back.
    pub fn commit(self) -> Result<File, OutputError> {
        let Output {
            file,
            path,
            pending,
        } = self;
        if let Some(pending) = pending {
            let err = |reason| OutputError {
                path: path.clone(),
                reason,
            };
            file.sync_all().map_err(|source| {
                err(Refusal::Io {
                    what: "flushing to disk",
                    source,
                })
            })?;
            pending.publish().map_err(err)?;
        }
        Ok(file)
    }
}

impl Write for Output {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.file.write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}

/// Writes `bytes` as the whole content of `path` (Atomic policy).
pub fn write_output(path: &Path, bytes: &[u8]) -> Result<(), OutputError> {
    let mut out = create_output(path, Policy::Atomic)?;
    out.write_all(bytes).map_err(|source| OutputError {
        path: path.to_owned(),
        reason: Refusal::Io {
            what: "writing",
            source,
        },
    })?;
    out.commit().map(drop)
}

/// Whether [`create_output`] would open `path` as things stand, without creating anything:
/// for a command that does slow or privileged work before it writes (`record` loads its
/// programs first) to refuse a bad path at once. `create_output` checks everything again.
pub fn check_output(path: &Path) -> Result<(), OutputError> {
    let who = Identity::current();
    target(path, &who).map(drop)
}

/// The checked target of an output: its directory, its name, whether the directory is shared
/// (sticky, writable by others), whether a file of that name exists.
struct Target {
    dir: OwnedFd,
    name: CString,
    shared: bool,
    exists: bool,
}

/// Every check of this module's rules that comes before creating a file.
fn target(path: &Path, who: &Identity) -> Result<Target, OutputError> {
    let err = |reason| OutputError {
        path: path.to_owned(),
        reason,
    };
    let name = path.file_name().ok_or_else(|| err(Refusal::NoFileName))?;
    let parent = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let dir = open_dir(parent, who).map_err(err)?;
    let shared = match who.classify_dir(&fstat(&dir).map_err(err)?) {
        DirTrust::Ours => false,
        DirTrust::SharedSticky => true,
        DirTrust::Unsafe(why) => {
            return Err(err(Refusal::UnsafeDir {
                dir: parent.to_owned(),
                why,
            }));
        }
        DirTrust::Foreign(owner) => {
            return Err(err(Refusal::ForeignDir {
                dir: parent.to_owned(),
                owner,
            }));
        }
    };
    let name = cstring(name).map_err(err)?;
    let exists = check_existing(&dir, &name, who).map_err(err)?;
    if exists && shared {
        return Err(err(Refusal::ExistsInSharedDir {
            dir: parent.to_owned(),
        }));
    }
    Ok(Target {
        dir,
        name,
        shared,
        exists,
    })
}

/// Opens `path` for output under the rules of this module (see its documentation).
pub fn create_output(path: &Path, policy: Policy) -> Result<Output, OutputError> {
    let err = |reason| OutputError {
        path: path.to_owned(),
        reason,
    };
    let who = Identity::current();
    let Target {
        dir,
        name,
        shared,
        exists,
    } = target(path, &who)?;
    let opened = match (policy, exists) {
        (Policy::Stream, false) => create_new(&dir, &name, &who).map(|file| (file, None)),
        (Policy::Stream, true) => create_temp(&dir, &name, &who).and_then(|(file, temp)| {
            let pending = PendingRename::new(dir, temp, name, false);
            pending.publish().map(|()| (file, None))
        }),
        (Policy::Atomic, _) => create_temp(&dir, &name, &who)
            .map(|(file, temp)| (file, Some(PendingRename::new(dir, temp, name, shared)))),
    };
    let (file, pending) = opened.map_err(err)?;
    Ok(Output {
        file,
        path: path.to_owned(),
        pending,
    })
}

/// Who we are, and whom a file is handed to: the invoking user under sudo.
#[derive(Debug, Clone, Copy)]
struct Identity {
    euid: u32,
    egid: u32,
    /// (uid, gid) from SUDO_UID/SUDO_GID, only when running as root.
    invoker: Option<(u32, u32)>,
}

enum DirTrust {
    Ours,
    SharedSticky,
    Unsafe(String),
    Foreign(u32),
}

impl Identity {
    fn current() -> Identity {
        // SAFETY: geteuid/getegid have no preconditions.
        let (euid, egid) = unsafe { (libc::geteuid(), libc::getegid()) };
        let env_id = |name| std::env::var(name).ok()?.parse::<u32>().ok();
        let invoker = match (euid, env_id("SUDO_UID"), env_id("SUDO_GID")) {
            (0, Some(uid), Some(gid)) => Some((uid, gid)),
            _ => None,
        };
        Identity {
            euid,
            egid,
            invoker,
        }
    }

    fn owns(&self, uid: u32) -> bool {
        uid == self.euid || self.invoker.is_some_and(|(u, _)| u == uid)
    }

    fn trusts_owner(&self, uid: u32) -> bool {
        uid == 0 || self.owns(uid)
    }

    fn trusts_group(&self, gid: u32) -> bool {
        gid == self.egid || self.invoker.is_some_and(|(_, g)| g == gid)
    }

    fn classify_dir(&self, st: &libc::stat) -> DirTrust {
        if !self.trusts_owner(st.st_uid) {
            // Sticky does not restrain a directory's owner.
            return DirTrust::Foreign(st.st_uid);
        }
        let why = if st.st_mode & libc::S_IWOTH != 0 {
            "world-writable".to_string()
        } else if st.st_mode & libc::S_IWGRP != 0 && !self.trusts_group(st.st_gid) {
            format!("writable by group {}", st.st_gid)
        } else {
            return DirTrust::Ours;
        };
        if st.st_mode & libc::S_ISVTX != 0 {
            DirTrust::SharedSticky
        } else {
            DirTrust::Unsafe(why)
        }
    }

    fn hand_over(&self, file: &File) -> Result<(), Refusal> {
        let Some((uid, gid)) = self.invoker else {
            return Ok(());
        };
        std::os::unix::fs::fchown(file, Some(uid), Some(gid)).map_err(|source| Refusal::Io {
            what: "handing the file to the invoking user (fchown)",
            source,
        })
    }
}

/// Opens `dir` one component at a time; a symbolic link is followed only where
/// fs.protected_symlinks would allow it (see the module documentation).
fn open_dir(dir: &Path, who: &Identity) -> Result<OwnedFd, Refusal> {
    let start = if dir.is_absolute() { "/" } else { "." };
    let mut walked = PathBuf::from(start);
    let dir_err = |walked: &Path| {
        let dir = walked.to_owned();
        move |source| Refusal::Dir { dir, source }
    };
    let mut fd = openat_dir(libc::AT_FDCWD, &cstring(OsStr::new(start))?, false)
        .map_err(dir_err(&walked))?;
    for component in dir.components() {
        let name = match component {
            Component::Normal(n) => n,
            Component::ParentDir => OsStr::new(".."),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => continue,
        };
        walked.push(name);
        let name = cstring(name)?;
        let next = match openat_dir(fd.as_raw_fd(), &name, false) {
            Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) => {
                let follow = may_follow(&fd, &name, &walked, who)?;
                openat_dir(fd.as_raw_fd(), &name, follow)
            }
            other => other,
        };
        fd = next.map_err(dir_err(&walked))?;
    }
    Ok(fd)
}

/// Whether `name` in `dir` is a symbolic link we may follow; a refusal if it is one we may not.
fn may_follow(
    dir: &OwnedFd,
    name: &CString,
    walked: &Path,
    who: &Identity,
) -> Result<bool, Refusal> {
    let Some(link) = lstat_at(dir, name)?.filter(|st| is_type(st, libc::S_IFLNK)) else {
        return Ok(false);
    };
    let parent_trusted = matches!(who.classify_dir(&fstat(dir)?), DirTrust::Ours);
    if !parent_trusted && !who.trusts_owner(link.st_uid) {
        return Err(Refusal::UntrustedSymlink {
            link: walked.to_owned(),
            owner: link.st_uid,
        });
    }
    Ok(true)
}

fn openat_dir(dir: libc::c_int, name: &CString, follow: bool) -> io::Result<OwnedFd> {
    let nofollow = if follow { 0 } else { libc::O_NOFOLLOW };
    let flags = libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC | nofollow;
    // SAFETY: name is NUL-terminated; a returned fd is owned by nobody else.
    let fd = unsafe { libc::openat(dir, name.as_ptr(), flags) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd was just opened and is owned only here.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Whether `name` exists in `dir`; an existing one must be a regular file of ours.
fn check_existing(dir: &OwnedFd, name: &CString, who: &Identity) -> Result<bool, Refusal> {
    let Some(st) = lstat_at(dir, name)? else {
        return Ok(false);
    };
    if is_type(&st, libc::S_IFLNK) {
        return Err(Refusal::Symlink);
    }
    if !is_type(&st, libc::S_IFREG) {
        return Err(Refusal::NotRegular(type_name(&st)));
    }
    if !who.owns(st.st_uid) {
        return Err(Refusal::ForeignOwner(st.st_uid));
    }
    Ok(true)
}

fn create_new(dir: &OwnedFd, name: &CString, who: &Identity) -> Result<File, Refusal> {
    let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    // SAFETY: name is NUL-terminated; mode is passed as the variadic argument open expects.
    let fd = unsafe { libc::openat(dir.as_raw_fd(), name.as_ptr(), flags, 0o666 as libc::c_uint) };
    if fd < 0 {
        let source = io::Error::last_os_error();
        if source.raw_os_error() == Some(libc::EEXIST) {
            return Err(Refusal::AppearedMeanwhile);
        }
        return Err(Refusal::Io {
            what: "creating",
            source,
        });
    }
    // SAFETY: fd was just opened and is owned only here.
    let file = unsafe { File::from_raw_fd(fd) };
    who.hand_over(&file)?;
    Ok(file)
}

/// A new hidden file beside `name`: `.NAME.partial-PID-N`.
fn create_temp(dir: &OwnedFd, name: &CString, who: &Identity) -> Result<(File, CString), Refusal> {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let base = OsStr::from_bytes(name.as_bytes()).to_string_lossy();
    loop {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let temp = cstring(OsStr::new(&format!(
            ".{base}.partial-{}-{n}",
            std::process::id()
        )))?;
        match create_new(dir, &temp, who) {
            // A leftover of an earlier process that had our pid: try the next name.
            Err(Refusal::AppearedMeanwhile) if n < 1000 => continue,
            other => return other.map(|file| (file, temp)),
        }
    }
}

/// A temporary file waiting to be renamed over its final name; removed if never published.
#[derive(Debug)]
struct PendingRename {
    dir: OwnedFd,
    temp: CString,
    name: CString,
    no_replace: bool,
    published: bool,
}

impl PendingRename {
    fn new(dir: OwnedFd, temp: CString, name: CString, no_replace: bool) -> Self {
        PendingRename {
            dir,
            temp,
            name,
            no_replace,
            published: false,
        }
    }

    fn publish(mut self) -> Result<(), Refusal> {
        let d = self.dir.as_raw_fd();
        let flags = if self.no_replace {
            libc::RENAME_NOREPLACE
        } else {
            0
        };
        // SAFETY: both names are NUL-terminated and relative to our directory fd.
        let rc = unsafe { libc::renameat2(d, self.temp.as_ptr(), d, self.name.as_ptr(), flags) };
        if rc != 0 {
            let source = io::Error::last_os_error();
            return Err(match source.raw_os_error() {
                Some(libc::EEXIST) => Refusal::AppearedMeanwhile,
                _ => Refusal::Io {
                    what: "renaming the finished file into place",
                    source,
                },
            });
        }
        self.published = true;
        Ok(())
    }
}

impl Drop for PendingRename {
    fn drop(&mut self) {
        if !self.published {
            // SAFETY: name is NUL-terminated and relative to our directory fd.
            unsafe { libc::unlinkat(self.dir.as_raw_fd(), self.temp.as_ptr(), 0) };
        }
    }
}

fn fstat(fd: &OwnedFd) -> Result<libc::stat, Refusal> {
    // SAFETY: an all-zero stat is a valid value; fstat fills it.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fd is open; st is a valid out-pointer.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(io_refusal("reading the directory's owner and mode"));
    }
    Ok(st)
}

/// lstat of `name` in `dir`; None if it does not exist.
fn lstat_at(dir: &OwnedFd, name: &CString) -> Result<Option<libc::stat>, Refusal> {
    // SAFETY: an all-zero stat is a valid value; fstatat fills it.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: name is NUL-terminated; st is a valid out-pointer.
    let rc = unsafe {
        libc::fstatat(
            dir.as_raw_fd(),
            name.as_ptr(),
            &mut st,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    if rc == 0 {
        return Ok(Some(st));
    }
    match io::Error::last_os_error() {
        e if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
        source => Err(Refusal::Io {
            what: "checking what is there already",
            source,
        }),
    }
}

fn is_type(st: &libc::stat, kind: libc::mode_t) -> bool {
    st.st_mode & libc::S_IFMT == kind
}

fn type_name(st: &libc::stat) -> &'static str {
    match st.st_mode & libc::S_IFMT {
        libc::S_IFDIR => "directory",
        libc::S_IFIFO => "FIFO",
        libc::S_IFCHR => "character device",
        libc::S_IFBLK => "block device",
        libc::S_IFSOCK => "socket",
        _ => "special file",
    }
}

fn io_refusal(what: &'static str) -> Refusal {
    Refusal::Io {
        what,
        source: io::Error::last_os_error(),
    }
}

fn cstring(name: &OsStr) -> Result<CString, Refusal> {
    CString::new(name.as_bytes()).map_err(|_| Refusal::NulInName)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};

    fn dir_with_mode(mode: u32) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(mode)).unwrap();
        dir
    }

    fn refusal(path: &Path, policy: Policy) -> Refusal {
        create_output(path, policy).unwrap_err().reason
    }

    #[test]
    fn a_planted_symlink_is_refused_and_its_target_untouched() {
        for mode in [0o700, 0o1777] {
            let dir = dir_with_mode(mode);
            let target = dir.path().join("precious");
            std::fs::write(&target, "keep me").unwrap();
            let out = dir.path().join("x.ndjson");
            symlink(&target, &out).unwrap();
            for policy in [Policy::Stream, Policy::Atomic] {
                assert!(matches!(refusal(&out, policy), Refusal::Symlink));
            }
            assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep me");
        }
    }

    #[test]
    fn non_regular_files_and_unsafe_directories_are_refused() {
        let dir = dir_with_mode(0o700);
        let fifo = dir.path().join("fifo");
        let c = CString::new(fifo.as_os_str().as_bytes()).unwrap();
        // SAFETY: c is a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        assert!(matches!(
            refusal(&fifo, Policy::Stream),
            Refusal::NotRegular("FIFO")
        ));
        let open = dir_with_mode(0o777);
        let err = create_output(&open.path().join("x"), Policy::Atomic).unwrap_err();
        assert!(matches!(err.reason, Refusal::UnsafeDir { .. }), "{err}");
        assert!(err.to_string().contains("world-writable"), "{err}");
    }

    #[test]
    fn a_sticky_shared_directory_takes_only_new_files() {
        let dir = dir_with_mode(0o1777);
        let path = dir.path().join("new.ndjson");
        let mut out = create_output(&path, Policy::Stream).unwrap();
        out.write_all(b"first\n").unwrap();
        drop(out.commit().unwrap());
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "first\n");
        for policy in [Policy::Stream, Policy::Atomic] {
            assert!(matches!(
                refusal(&path, policy),
                Refusal::ExistsInSharedDir { .. }
            ));
        }
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "first\n");
    }

    #[test]
    fn an_existing_file_is_replaced_never_written_through() {
        let dir = dir_with_mode(0o700);
        let path = dir.path().join("out");
        let other_link = dir.path().join("other-link");
        std::fs::write(&path, "old").unwrap();
        std::fs::hard_link(&path, &other_link).unwrap();
        for policy in [Policy::Stream, Policy::Atomic] {
            let mut out = create_output(&path, policy).unwrap();
            out.write_all(b"new").unwrap();
            drop(out.commit().unwrap());
            assert_eq!(std::fs::read_to_string(&path).unwrap(), "new");
            assert_eq!(std::fs::read_to_string(&other_link).unwrap(), "old");
        }
    }

    #[test]
    fn an_uncommitted_atomic_output_leaves_the_old_file_and_no_temp() {
        let dir = dir_with_mode(0o700);
        let path = dir.path().join("merged.ndjson");
        std::fs::write(&path, "previous").unwrap();
        let mut out = create_output(&path, Policy::Atomic).unwrap();
        out.write_all(b"half").unwrap();
        drop(out);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "previous");
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 1, "temporary file left behind: {names:?}");
    }

    #[test]
    fn a_symlinked_parent_in_a_private_directory_is_followed() {
        let dir = dir_with_mode(0o700);
        let real = dir.path().join("real");
        std::fs::create_dir(&real).unwrap();
        symlink(&real, dir.path().join("via")).unwrap();
        write_output(&dir.path().join("via/../via/f"), b"x").unwrap();
        assert_eq!(std::fs::read(real.join("f")).unwrap(), b"x");
        assert_eq!(
            std::fs::metadata(real.join("f")).unwrap().uid(),
            // SAFETY: geteuid has no preconditions.
            unsafe { libc::geteuid() }
        );
    }
}
