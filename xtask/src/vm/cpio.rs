//! A minimal writer for the cpio "newc" format the kernel unpacks as initramfs.
//!
//! Written here rather than with `cpio -o` so the archive can hold /dev/console (a device node,
//! which the kernel opens for init's stdio before anything is mounted) without mknod on the host,
//! and so the bytes are reproducible (fixed mtime and inode numbers).

#[derive(Default)]
pub struct NewcArchive {
    bytes: Vec<u8>,
    next_inode: u32,
}

const DIR: u32 = 0o040000;
const REGULAR: u32 = 0o100000;
const CHAR_DEVICE: u32 = 0o020000;

impl NewcArchive {
    pub fn dir(&mut self, path: &str) {
        self.entry(path, DIR | 0o755, (0, 0), &[]);
    }

    pub fn file(&mut self, path: &str, mode: u32, data: &[u8]) {
        self.entry(path, REGULAR | mode, (0, 0), data);
    }

    pub fn char_device(&mut self, path: &str, mode: u32, major: u32, minor: u32) {
        self.entry(path, CHAR_DEVICE | mode, (major, minor), &[]);
    }

    pub fn finish(mut self) -> Vec<u8> {
        self.entry("TRAILER!!!", 0, (0, 0), &[]);
        self.bytes
    }

    fn entry(&mut self, path: &str, mode: u32, rdev: (u32, u32), data: &[u8]) {
        self.next_inode += 1;
        let nlink = if mode & DIR == DIR { 2 } else { 1 };
        let fields = [
            self.next_inode,
            mode,
            0, // uid
            0, // gid
            nlink,
            0, // mtime: fixed so the archive is reproducible
            data.len() as u32,
            0, // devmajor
            0, // devminor
            rdev.0,
            rdev.1,
            path.len() as u32 + 1, // name size includes the NUL
            0,                     // check (unused by newc)
        ];
        self.bytes.extend_from_slice(b"070701");
        for field in fields {
            self.bytes
                .extend_from_slice(format!("{field:08x}").as_bytes());
        }
        self.bytes.extend_from_slice(path.as_bytes());
        self.bytes.push(0);
        self.pad();
        self.bytes.extend_from_slice(data);
        self.pad();
    }

    fn pad(&mut self) {
        while !self.bytes.len().is_multiple_of(4) {
            self.bytes.push(0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_aligned_and_end_with_trailer() {
        let mut archive = NewcArchive::default();
        archive.dir("bin");
        archive.file("init", 0o755, b"#!/bin/sh\n");
        archive.char_device("dev/console", 0o600, 5, 1);
        let bytes = archive.finish();
        assert_eq!(bytes.len() % 4, 0);
        assert!(bytes.starts_with(b"070701"));
        let text = String::from_utf8_lossy(&bytes);
        assert!(text.contains("init\0"));
        assert!(text.contains("#!/bin/sh\n"));
        assert!(text.contains("TRAILER!!!\0"));
        // The header of "init" records its size (10 bytes) in field 7.
        let init_header = text
            .find("070701")
            .map(|_| text.match_indices("070701").nth(1));
        let (at, _) = init_header.flatten().expect("second header");
        assert_eq!(&text[at + 6 + 6 * 8..at + 6 + 7 * 8], "0000000a");
    }

    #[test]
    fn cpio_tool_lists_the_archive_when_installed() {
        let Ok(mut child) = std::process::Command::new("cpio")
            .args(["-t", "--quiet"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
        else {
            eprintln!("SKIP: cpio not installed (cargo xtask vm prepare installs it)");
            return;
        };
        let mut archive = NewcArchive::default();
        archive.dir("lib");
        archive.file("lib/a.ko", 0o644, &[1, 2, 3]);
        let bytes = archive.finish();
        let mut stdin = child.stdin.take().expect("stdin");
        std::io::Write::write_all(&mut stdin, &bytes).expect("write archive");
        drop(stdin);
        let out = child.wait_with_output().expect("cpio -t");
        assert!(out.status.success());
        assert_eq!(String::from_utf8_lossy(&out.stdout), "lib\nlib/a.ko\n");
    }
}
