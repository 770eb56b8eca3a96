//! Boot files for one kernel: the uncompressed vmlinux (qemu boots it directly through its PVH
//! note, skipping the bzImage decompressor, which is slow under TCG) and an initramfs holding
//! busybox, the modules needed to reach the 9p root, and the init script.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};

use super::cpio::NewcArchive;
use super::kernel::{InstalledKernel, KernelLabel};
use super::vmlinux::{extract_vmlinux, pipe_through};

/// Modules the init script loads, in the order their dependencies allow; 9pnet, netfs and
/// virtio-net's failover helpers come in through modules.dep.
const WANTED_MODULES: &[&str] = &["virtio_pci", "virtio_net", "9p", "9pnet_virtio", "overlay"];
const INIT_SCRIPT: &str = include_str!("init.sh");
const BUSYBOX: &str = "/bin/busybox";

/// What `run` needs to boot a prepared kernel.
#[derive(Debug, Clone)]
pub struct BootFiles {
    pub release: String,
    pub vmlinux: PathBuf,
    pub initramfs: PathBuf,
}

pub fn boot_dir(label: KernelLabel) -> PathBuf {
    crate::target_dir().join("vm").join(label.as_str())
}

/// Installs what is missing and (re)builds the boot files when their inputs changed.
pub fn prepare(label: KernelLabel) -> Result<BootFiles> {
    let started = Instant::now();
    super::apt::ensure_tools()?;
    let kernel = super::apt::ensure_kernel(label)?;
    let files = build_boot_files(label, &kernel)?;
    eprintln!(
        "vm prepare: kernel {label} ({}) ready in {:.1} s: {} {}",
        files.release,
        started.elapsed().as_secs_f64(),
        files.vmlinux.display(),
        files.initramfs.display()
    );
    Ok(files)
}

/// The boot files for `label`, rebuilt first if the installed kernel, busybox or this code's
/// init script changed since they were built; never installs anything.
pub fn prepared(label: KernelLabel) -> Result<BootFiles> {
    let kernel = super::kernel::find_installed(Path::new("/"), label).with_context(|| {
        format!("kernel {label} is not installed: run `cargo xtask vm prepare --kernel {label}`")
    })?;
    build_boot_files(label, &kernel)
}

/// The boot files as last built, whatever their inputs.
fn last_built(label: KernelLabel) -> Result<BootFiles> {
    let dir = boot_dir(label);
    let release = std::fs::read_to_string(dir.join("release"))
        .with_context(|| format!("kernel {label} is not prepared: run `cargo xtask vm prepare`"))?;
    let files = BootFiles {
        release: release.trim().to_owned(),
        vmlinux: dir.join("vmlinux"),
        initramfs: dir.join("initramfs.cpio"),
    };
    if !files.vmlinux.is_file() || !files.initramfs.is_file() {
        bail!(
            "{} is incomplete: run `cargo xtask vm prepare --kernel {label}`",
            dir.display()
        );
    }
    Ok(files)
}

fn build_boot_files(label: KernelLabel, kernel: &InstalledKernel) -> Result<BootFiles> {
    let dir = boot_dir(label);
    let stamp = input_stamp(kernel)?;
    let stamp_path = dir.join("stamp");
    if std::fs::read_to_string(&stamp_path).is_ok_and(|old| old == stamp)
        && let Ok(files) = last_built(label)
    {
        return Ok(files);
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let _ = std::fs::remove_file(&stamp_path);
    let bzimage = std::fs::read(&kernel.vmlinuz)
        .with_context(|| format!("reading {}", kernel.vmlinuz.display()))?;
    let vmlinux = extract_vmlinux(&bzimage)
        .with_context(|| format!("extracting vmlinux from {}", kernel.vmlinuz.display()))?;
    write_atomically(&dir.join("vmlinux"), &vmlinux)?;
    let initramfs = build_initramfs(kernel)?;
    write_atomically(&dir.join("initramfs.cpio"), &initramfs)?;
    write_atomically(&dir.join("release"), kernel.release.as_bytes())?;
    // Written last: a build interrupted half-way is rebuilt next time.
    write_atomically(&stamp_path, stamp.as_bytes())?;
    eprintln!(
        "vm prepare: built {} (vmlinux {} MiB, initramfs {} KiB)",
        dir.display(),
        vmlinux.len() >> 20,
        initramfs.len() >> 10
    );
    last_built(label)
}

/// Everything the boot files are derived from; a change in any of them triggers a rebuild.
fn input_stamp(kernel: &InstalledKernel) -> Result<String> {
    let mut stamp = format!("release {}\n", kernel.release);
    for path in [kernel.vmlinuz.as_path(), Path::new(BUSYBOX)] {
        let meta = std::fs::metadata(path).with_context(|| format!("stat {}", path.display()))?;
        let mtime = meta
            .modified()?
            .duration_since(std::time::UNIX_EPOCH)?
            .as_secs();
        stamp += &format!("{} {} {mtime}\n", path.display(), meta.len());
    }
    stamp += &format!("modules {WANTED_MODULES:?}\n{INIT_SCRIPT}");
    Ok(stamp)
}

fn build_initramfs(kernel: &InstalledKernel) -> Result<Vec<u8>> {
    let busybox = std::fs::read(BUSYBOX).with_context(|| format!("reading {BUSYBOX}"))?;
    if has_program_interpreter(&busybox) {
        bail!("{BUSYBOX} is dynamically linked: install busybox-static");
    }
    let mut archive = NewcArchive::default();
    for dir in [
        "bin", "dev", "proc", "sys", "mnt", "mnt/host", "mnt/rw", "mnt/root", "lib",
    ] {
        archive.dir(dir);
    }
    archive.dir("lib/modules");
    archive.char_device("dev/console", 0o600, 5, 1);
    archive.file("bin/busybox", 0o755, &busybox);
    archive.file("init", 0o755, INIT_SCRIPT.as_bytes());
    let modules = module_load_order(&kernel.modules_dir, WANTED_MODULES)?;
    let mut order = String::new();
    for module in &modules {
        let data = read_module(module)?;
        let name = module_name(module);
        archive.file(&format!("lib/modules/{name}.ko"), 0o644, &data);
        order += &format!("{name}.ko\n");
    }
    archive.file("modules.order", 0o644, order.as_bytes());
    eprintln!(
        "vm prepare: {} modules: {}",
        kernel.release,
        order.lines().collect::<Vec<_>>().join(" ")
    );
    Ok(archive.finish())
}

/// ELF PT_INTERP present = dynamically linked.
fn has_program_interpreter(elf: &[u8]) -> bool {
    let read = |at: usize, len: usize| -> u64 {
        elf.get(at..at + len)
            .map(|b| {
                b.iter()
                    .rev()
                    .fold(0u64, |acc, &x| (acc << 8) | u64::from(x))
            })
            .unwrap_or(0)
    };
    let (phoff, phentsize, phnum) = (read(0x20, 8), read(0x36, 2), read(0x38, 2));
    (0..phnum).any(|i| read((phoff + i * phentsize) as usize, 4) == 3)
}

/// Module files (under `modules_dir`) to insmod, dependencies first. Built-in modules are skipped.
pub fn module_load_order(modules_dir: &Path, wanted: &[&str]) -> Result<Vec<PathBuf>> {
    let dep_path = modules_dir.join("modules.dep");
    let dep_text = std::fs::read_to_string(&dep_path)
        .with_context(|| format!("reading {}", dep_path.display()))?;
    let builtin = std::fs::read_to_string(modules_dir.join("modules.builtin")).unwrap_or_default();
    let builtin: HashSet<String> = builtin.lines().map(|l| module_name(Path::new(l))).collect();
    let mut deps: HashMap<String, (String, Vec<String>)> = HashMap::new();
    for line in dep_text.lines() {
        let Some((module, rest)) = line.split_once(':') else {
            continue;
        };
        let needs = rest
            .split_whitespace()
            .map(|d| module_name(Path::new(d)))
            .collect();
        deps.insert(module_name(Path::new(module)), (module.to_owned(), needs));
    }
    let mut order = Vec::new();
    let mut seen = HashSet::new();
    for name in wanted {
        let name = name.replace('-', "_");
        if builtin.contains(&name) {
            continue;
        }
        if !deps.contains_key(&name) {
            bail!(
                "module {name} is neither in {} nor built in",
                dep_path.display()
            );
        }
        visit(&name, &deps, &mut seen, &mut order);
    }
    Ok(order.into_iter().map(|rel| modules_dir.join(rel)).collect())
}

fn visit(
    name: &str,
    deps: &HashMap<String, (String, Vec<String>)>,
    seen: &mut HashSet<String>,
    order: &mut Vec<String>,
) {
    if !seen.insert(name.to_owned()) {
        return;
    }
    if let Some((path, needs)) = deps.get(name) {
        for need in needs {
            visit(need, deps, seen, order);
        }
        order.push(path.clone());
    }
}

/// "kernel/net/9p/9pnet_virtio.ko.xz" -> "9pnet_virtio" (kernel module names use '_').
pub fn module_name(path: &Path) -> String {
    let file = path
        .file_name()
        .and_then(|f| f.to_str())
        .unwrap_or_default();
    let stem = file.split(".ko").next().unwrap_or(file);
    stem.replace('-', "_")
}

/// Module bytes, decompressed: busybox insmod loads plain ELF only.
fn read_module(path: &Path) -> Result<Vec<u8>> {
    let raw = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .unwrap_or_default();
    let plain = match ext {
        "ko" => raw,
        "xz" => pipe_through("xz", &["-dc"], &raw)?,
        "zst" => pipe_through("zstd", &["-dcq"], &raw)?,
        "gz" => pipe_through("gzip", &["-dc"], &raw)?,
        other => bail!("{}: unknown module compression .{other}", path.display()),
    };
    if !plain.starts_with(b"\x7fELF") {
        bail!("{}: not an ELF module after decompression", path.display());
    }
    Ok(plain)
}

fn write_atomically(path: &Path, data: &[u8]) -> Result<()> {
    // Unique per process: two runs rebuilding the same kernel's files must not interleave.
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, data).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming to {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn module_names_drop_directories_and_compression() {
        assert_eq!(
            module_name(Path::new("kernel/net/9p/9pnet_virtio.ko.xz")),
            "9pnet_virtio"
        );
        assert_eq!(
            module_name(Path::new("kernel/fs/overlayfs/overlay.ko")),
            "overlay"
        );
        assert_eq!(
            module_name(Path::new("net_failover.ko.zst")),
            "net_failover"
        );
    }

    #[test]
    fn dependencies_load_first_and_builtins_are_skipped() {
        let dir = std::env::temp_dir().join(format!("meshlab-vm-deps-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        std::fs::write(
            dir.join("modules.dep"),
            "kernel/fs/9p/9p.ko.xz: kernel/fs/netfs/netfs.ko.xz kernel/net/9p/9pnet.ko.xz\n\
             kernel/net/9p/9pnet_virtio.ko.xz: kernel/net/9p/9pnet.ko.xz\n\
             kernel/net/9p/9pnet.ko.xz:\nkernel/fs/netfs/netfs.ko.xz:\n",
        )
        .expect("modules.dep");
        std::fs::write(
            dir.join("modules.builtin"),
            "kernel/fs/overlayfs/overlay.ko\n",
        )
        .expect("builtin");
        let order = module_load_order(&dir, &["9p", "9pnet_virtio", "overlay"]);
        let missing = module_load_order(&dir, &["virtio_net"]);
        let _ = std::fs::remove_dir_all(&dir);
        let names: Vec<String> = order
            .expect("order")
            .iter()
            .map(|p| module_name(p))
            .collect();
        assert_eq!(names, ["netfs", "9pnet", "9p", "9pnet_virtio"]);
        assert!(
            missing
                .unwrap_err()
                .to_string()
                .contains("virtio_net is neither")
        );
    }

    #[test]
    fn static_busybox_has_no_interpreter_but_test_binaries_do() {
        if let Ok(busybox) = std::fs::read(BUSYBOX) {
            assert!(!has_program_interpreter(&busybox));
        }
        let me = std::fs::read(std::env::current_exe().expect("exe")).expect("read self");
        assert!(
            has_program_interpreter(&me),
            "test binaries link glibc dynamically"
        );
    }
}
