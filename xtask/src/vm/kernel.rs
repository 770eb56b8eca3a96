//! Which stock Debian kernels the runner boots, and where their installed files are.

use std::cmp::Ordering;
use std::path::{Path, PathBuf};

use clap::ValueEnum;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum KernelLabel {
    /// Debian 12 (bookworm) 6.1 LTS.
    #[value(name = "6.1")]
    V6_1,
    /// Debian 6.12 for bookworm (bookworm-security, or bookworm-backports where only that has it).
    #[value(name = "6.12")]
    V6_12,
}

impl KernelLabel {
    pub const ALL: [KernelLabel; 2] = [KernelLabel::V6_1, KernelLabel::V6_12];

    pub fn as_str(self) -> &'static str {
        match self {
            KernelLabel::V6_1 => "6.1",
            KernelLabel::V6_12 => "6.12",
        }
    }

    /// Releases of this label start with this ("6.1." must not match "6.12.").
    pub fn release_prefix(self) -> String {
        format!("{}.", self.as_str())
    }

    /// Meta-packages whose dependency names the concrete kernel package, most specific first.
    pub fn meta_packages(self) -> &'static [&'static str] {
        match self {
            KernelLabel::V6_1 => &["linux-image-amd64"],
            KernelLabel::V6_12 => &["linux-image-6.12-amd64", "linux-image-amd64"],
        }
    }

    /// Whether an installed release (e.g. `6.12.117+deb12-amd64`) is this label's generic flavour.
    /// The -cloud flavour has no 9p and -rt changes scheduling: neither is wanted.
    pub fn matches_release(self, release: &str) -> bool {
        release.starts_with(&self.release_prefix())
            && release.ends_with("-amd64")
            && !release.ends_with("-cloud-amd64")
            && !release.ends_with("-rt-amd64")
    }
}

impl std::fmt::Display for KernelLabel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A kernel installed on the host: /boot/vmlinuz-<release> and /lib/modules/<release>.
#[derive(Debug, Clone)]
pub struct InstalledKernel {
    pub release: String,
    pub vmlinuz: PathBuf,
    pub modules_dir: PathBuf,
}

/// The newest installed kernel of `label` under `root` ("/" on a real host), if any.
pub fn find_installed(root: &Path, label: KernelLabel) -> Option<InstalledKernel> {
    let entries = std::fs::read_dir(root.join("boot")).ok()?;
    let mut releases: Vec<String> = entries
        .filter_map(|entry| entry.ok())
        .filter_map(|entry| {
            let name = entry.file_name().into_string().ok()?;
            name.strip_prefix("vmlinuz-").map(str::to_owned)
        })
        .filter(|release| label.matches_release(release))
        .filter(|release| {
            root.join("lib/modules")
                .join(release)
                .join("modules.dep")
                .is_file()
        })
        .collect();
    releases.sort_by(|a, b| compare_versions(a, b));
    let release = releases.pop()?;
    Some(InstalledKernel {
        vmlinuz: root.join("boot").join(format!("vmlinuz-{release}")),
        modules_dir: root.join("lib/modules").join(&release),
        release,
    })
}

/// Orders version strings by their numeric runs ("6.1.0-57" after "6.1.0-9").
pub fn compare_versions(a: &str, b: &str) -> Ordering {
    fn chunks(s: &str) -> Vec<Result<u64, String>> {
        let mut out = Vec::new();
        let mut rest = s;
        while let Some(first) = rest.chars().next() {
            let is_digit = first.is_ascii_digit();
            let end = rest
                .find(|c: char| c.is_ascii_digit() != is_digit)
                .unwrap_or(rest.len());
            let (chunk, tail) = rest.split_at(end);
            out.push(if is_digit {
                Ok(chunk.parse().unwrap_or(u64::MAX))
            } else {
                Err(chunk.to_owned())
            });
            rest = tail;
        }
        out
    }
    chunks(a).cmp(&chunks(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_compare_by_numeric_runs() {
        assert_eq!(
            compare_versions("6.1.0-57-amd64", "6.1.0-9-amd64"),
            Ordering::Greater
        );
        assert_eq!(
            compare_versions("6.12.117+deb12", "6.12.99+deb12"),
            Ordering::Greater
        );
    }

    #[test]
    fn label_matches_only_its_generic_flavour() {
        assert!(KernelLabel::V6_1.matches_release("6.1.0-57-amd64"));
        assert!(!KernelLabel::V6_1.matches_release("6.12.117+deb12-amd64"));
        assert!(!KernelLabel::V6_1.matches_release("6.1.0-57-cloud-amd64"));
        assert!(KernelLabel::V6_12.matches_release("6.12.117+deb12-amd64"));
        assert!(!KernelLabel::V6_12.matches_release("6.12.117+deb12-rt-amd64"));
    }

    #[test]
    fn newest_installed_release_with_modules_wins() {
        let root = std::env::temp_dir().join(format!("meshlab-vm-kernel-{}", std::process::id()));
        for release in [
            "6.1.0-9-amd64",
            "6.1.0-57-amd64",
            "6.1.0-60-amd64",
            "6.12.1-amd64",
        ] {
            std::fs::create_dir_all(root.join("boot")).expect("boot");
            std::fs::write(root.join(format!("boot/vmlinuz-{release}")), b"").expect("vmlinuz");
            // 6.1.0-60 has no modules: a half-removed kernel must not be picked.
            if release != "6.1.0-60-amd64" {
                let modules = root.join("lib/modules").join(release);
                std::fs::create_dir_all(&modules).expect("modules");
                std::fs::write(modules.join("modules.dep"), b"").expect("modules.dep");
            }
        }
        let found = find_installed(&root, KernelLabel::V6_1).map(|k| k.release);
        let _ = std::fs::remove_dir_all(&root);
        assert_eq!(found.as_deref(), Some("6.1.0-57-amd64"));
    }
}
