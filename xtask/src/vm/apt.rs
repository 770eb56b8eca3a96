//! Host packages for the VM runner, installed idempotently with apt-get.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail};

use super::kernel::{self, InstalledKernel, KernelLabel};

/// qemu for the guests, a static busybox for the initramfs, cpio/kmod to inspect images and
/// modules, xz/zstd to decompress Debian's kernel payload and .ko.xz modules.
pub const TOOL_PACKAGES: &[&str] = &[
    "qemu-system-x86",
    "busybox-static",
    "cpio",
    "kmod",
    "xz-utils",
    "zstd",
];

const BACKPORTS_LIST: &str = "/etc/apt/sources.list.d/meshlab-bookworm-backports.sources";

/// Installs the missing tool packages; returns the ones it installed.
pub fn ensure_tools() -> Result<Vec<String>> {
    let missing: Vec<String> = TOOL_PACKAGES
        .iter()
        .filter(|pkg| !is_installed(pkg))
        .map(|pkg| pkg.to_string())
        .collect();
    if missing.is_empty() {
        eprintln!(
            "vm prepare: tools already installed: {}",
            TOOL_PACKAGES.join(" ")
        );
        return Ok(missing);
    }
    apt_update_once()?;
    apt_install(&missing, None)?;
    eprintln!("vm prepare: installed {}", missing.join(" "));
    Ok(missing)
}

/// Returns the installed kernel for `label`, installing the generic -amd64 flavour if absent.
pub fn ensure_kernel(label: KernelLabel) -> Result<InstalledKernel> {
    if let Some(found) = kernel::find_installed(Path::new("/"), label) {
        eprintln!(
            "vm prepare: kernel {label}: {} already installed",
            found.release
        );
        return Ok(found);
    }
    apt_update_once()?;
    let (package, suite) = match resolve_kernel_package(label)? {
        Some(found) => found,
        None if label == KernelLabel::V6_12 => {
            add_backports()?;
            resolve_kernel_package(label)?.with_context(|| {
                format!(
                    "no linux-image-{label}.*-amd64 in apt sources, even with bookworm-backports"
                )
            })?
        }
        None => bail!("no linux-image-{label}.*-amd64 candidate in the apt sources"),
    };
    // The backports suite is pinned low: dependencies must come from it too.
    let target_release = suite.filter(|s| s.ends_with("-backports"));
    apt_install(std::slice::from_ref(&package), target_release.as_deref())?;
    eprintln!("vm prepare: installed {package}");
    kernel::find_installed(Path::new("/"), label).with_context(|| {
        format!("{package} installed but no /boot/vmlinuz-{label}.*-amd64 with modules.dep found")
    })
}

/// (concrete package, suite it comes from) for the label, from the meta-packages' versions.
fn resolve_kernel_package(label: KernelLabel) -> Result<Option<(String, Option<String>)>> {
    for meta in label.meta_packages() {
        let madison = command_stdout(Command::new("apt-cache").args(["madison", meta]))?;
        for (version, suite) in parse_madison(&madison) {
            if !version.starts_with(&label.release_prefix()) {
                continue;
            }
            let show = command_stdout(
                Command::new("apt-cache").args(["show", &format!("{meta}={version}")]),
            )?;
            if let Some(package) = kernel_dependency(&show, label) {
                eprintln!("vm prepare: apt offers {package} ({version}, {suite}) via {meta}");
                return Ok(Some((package, Some(suite))));
            }
        }
    }
    Ok(None)
}

/// `apt-cache madison` lines: "pkg | version | uri suite/component arch Packages".
fn parse_madison(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter_map(|line| {
            let mut fields = line.split('|').map(str::trim);
            let _package = fields.next()?;
            let version = fields.next()?;
            let source = fields.next()?;
            let suite = source.split_whitespace().nth(1)?.split('/').next()?;
            Some((version.to_owned(), suite.to_owned()))
        })
        .collect()
}

/// The concrete image package a meta-package's Depends names, e.g. linux-image-6.1.0-57-amd64.
fn kernel_dependency(show: &str, label: KernelLabel) -> Option<String> {
    let depends = show.lines().find_map(|l| l.strip_prefix("Depends:"))?;
    depends
        .split(',')
        .filter_map(|dep| dep.split_whitespace().next())
        .find(|name| {
            name.strip_prefix("linux-image-")
                .is_some_and(|release| label.matches_release(release))
        })
        .map(str::to_owned)
}

/// Adds bookworm-backports on the Debian mirror apt already uses (deb822 format).
fn add_backports() -> Result<()> {
    let sources = std::fs::read_to_string("/etc/apt/sources.list.d/debian.sources")
        .or_else(|_| std::fs::read_to_string("/etc/apt/sources.list"))
        .context("reading the Debian apt sources to find the mirror")?;
    let mirror = debian_mirror(&sources).context("no Debian mirror (…/debian) in apt sources")?;
    let entry = format!(
        "# Added by `cargo xtask vm prepare` for the Debian 6.12 kernel.\nTypes: deb\nURIs: {mirror}\n\
         Suites: bookworm-backports\nComponents: main\n\
         Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n"
    );
    std::fs::write(BACKPORTS_LIST, entry).with_context(|| format!("writing {BACKPORTS_LIST}"))?;
    eprintln!("vm prepare: added bookworm-backports ({mirror}) in {BACKPORTS_LIST}");
    run_checked(Command::new("apt-get").args(["update", "-q"]))
}

/// The first `…/debian` URI (not debian-security) in deb822 or one-line apt sources.
fn debian_mirror(sources: &str) -> Option<String> {
    sources
        .lines()
        .filter(|line| !line.trim_start().starts_with('#'))
        .flat_map(|line| line.split_whitespace())
        .find(|word| {
            (word.starts_with("http://") || word.starts_with("https://"))
                && word.trim_end_matches('/').ends_with("/debian")
        })
        .map(|uri| uri.trim_end_matches('/').to_owned())
}

fn is_installed(package: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${db:Status-Status}", package])
        .output()
        .is_ok_and(|out| out.status.success() && out.stdout == b"installed")
}

fn apt_update_once() -> Result<()> {
    static UPDATED: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    if UPDATED.get().is_some() {
        return Ok(());
    }
    super::ensure_root("installing packages")?;
    run_checked(Command::new("apt-get").args(["update", "-q"]))?;
    let _ = UPDATED.set(());
    Ok(())
}

fn apt_install(packages: &[String], target_release: Option<&str>) -> Result<()> {
    let mut cmd = Command::new("apt-get");
    cmd.args(["install", "-y", "-q", "--no-install-recommends"])
        .env("DEBIAN_FRONTEND", "noninteractive");
    if let Some(suite) = target_release {
        cmd.args(["-t", suite]);
    }
    cmd.args(packages);
    run_checked(&mut cmd)
}

fn run_checked(cmd: &mut Command) -> Result<()> {
    let status = crate::cleanup::status_forwarding(cmd, &format!("{cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed: {status}");
    }
    Ok(())
}

fn command_stdout(cmd: &mut Command) -> Result<String> {
    let out = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn madison_lines_give_version_and_suite() {
        let text = " linux-image-amd64 |  6.1.192-3 | http://deb.debian.org/debian-security bookworm-security/main amd64 Packages\n\
                    linux-image-amd64 | 6.12.57-1~bpo12+1 | http://deb.debian.org/debian bookworm-backports/main amd64 Packages\n";
        assert_eq!(
            parse_madison(text),
            vec![
                ("6.1.192-3".to_owned(), "bookworm-security".to_owned()),
                (
                    "6.12.57-1~bpo12+1".to_owned(),
                    "bookworm-backports".to_owned()
                ),
            ]
        );
    }

    #[test]
    fn meta_package_depends_names_the_generic_flavour() {
        let show = "Package: linux-image-6.12-amd64\nDepends: linux-image-6.12.117+deb12-amd64 (= 6.12.117-1~deb12u1)\n";
        assert_eq!(
            kernel_dependency(show, KernelLabel::V6_12).as_deref(),
            Some("linux-image-6.12.117+deb12-amd64")
        );
        assert_eq!(kernel_dependency(show, KernelLabel::V6_1), None);
    }

    #[test]
    fn mirror_skips_security_and_comments() {
        let deb822 = "# http://snapshot.debian.org/archive/debian/x\nTypes: deb\n\
                      URIs: http://deb.debian.org/debian-security\nURIs: http://deb.debian.org/debian/\n";
        assert_eq!(
            debian_mirror(deb822).as_deref(),
            Some("http://deb.debian.org/debian")
        );
    }
}
