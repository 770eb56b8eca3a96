//! The uncompressed ELF kernel inside a Debian bzImage (/boot/vmlinuz-*), which qemu boots
//! through its PVH note. Same idea as the kernel's scripts/extract-vmlinux, but the compressed
//! payload is located exactly through the boot protocol header instead of by scanning for magic.

use std::io::{Read, Write};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

/// The ELF vmlinux inside a bzImage, located by the boot protocol header's payload fields.
pub fn extract_vmlinux(bzimage: &[u8]) -> Result<Vec<u8>> {
    let payload = bzimage_payload(bzimage)?;
    let (tool, args): (&str, &[&str]) = match payload {
        [0x1f, 0x8b, ..] => ("gzip", &["-dc"]),
        [0xfd, b'7', b'z', b'X', b'Z', 0, ..] => ("xz", &["-dc", "--single-stream"]),
        [0x28, 0xb5, 0x2f, 0xfd, ..] => ("zstd", &["-dcq"]),
        [0x5d, 0, 0, ..] => ("xz", &["-dc", "--format=lzma"]),
        [b'B', b'Z', b'h', ..] => ("bzip2", &["-dc"]),
        _ => bail!(
            "unknown compression (payload starts {:02x?})",
            &payload[..8.min(payload.len())]
        ),
    };
    // The build appends the uncompressed size after the stream, so decompressors may complain
    // about trailing bytes: as in the kernel's scripts/extract-vmlinux, the output decides.
    let elf = pipe_through(tool, args, payload)?;
    if !elf.starts_with(b"\x7fELF") {
        bail!("{tool} {} did not produce an ELF vmlinux", args.join(" "));
    }
    Ok(elf)
}

fn bzimage_payload(bzimage: &[u8]) -> Result<&[u8]> {
    let u32_at = |at: usize| -> Result<usize> {
        let bytes = bzimage
            .get(at..at + 4)
            .context("bzImage header truncated")?;
        Ok(u32::from_le_bytes(bytes.try_into()?) as usize)
    };
    if bzimage.get(0x202..0x206) != Some(b"HdrS") {
        bail!("not a bzImage (no HdrS boot header)");
    }
    // setup_sects = 0 means 4 (boot protocol); the protected-mode kernel follows the setup code.
    let setup_sects = match bzimage[0x1f1] {
        0 => 4,
        n => usize::from(n),
    };
    let protected_mode_start = (setup_sects + 1) * 512;
    let start = protected_mode_start + u32_at(0x248)?;
    let end = start + u32_at(0x24c)?;
    bzimage
        .get(start..end)
        .context("bzImage payload_offset/payload_length point outside the file")
}

pub fn pipe_through(tool: &str, args: &[&str], input: &[u8]) -> Result<Vec<u8>> {
    let mut child = Command::new(tool)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("running {tool} (cargo xtask vm prepare installs it)"))?;
    let mut stdin = child.stdin.take().context("stdin")?;
    let input = input.to_vec();
    let writer = std::thread::spawn(move || {
        // A decompressor that stops at the end of its stream closes the pipe early: fine.
        let _ = stdin.write_all(&input);
    });
    let mut output = Vec::new();
    child
        .stdout
        .take()
        .context("stdout")?
        .read_to_end(&mut output)?;
    child.wait()?;
    let _ = writer.join();
    Ok(output)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bzimage_payload_is_found_through_the_boot_header() {
        let mut image = vec![0u8; 3 * 512 + 64];
        image[0x1f1] = 2; // setup sectors: the protected-mode kernel starts at 3 * 512
        image[0x202..0x206].copy_from_slice(b"HdrS");
        image[0x248..0x24c].copy_from_slice(&16u32.to_le_bytes());
        image[0x24c..0x250].copy_from_slice(&8u32.to_le_bytes());
        image[3 * 512 + 16..3 * 512 + 24].copy_from_slice(b"PAYLOAD!");
        assert_eq!(bzimage_payload(&image).expect("payload"), b"PAYLOAD!");
        image[0x24c..0x250].copy_from_slice(&4096u32.to_le_bytes());
        assert!(bzimage_payload(&image).is_err());
        assert!(bzimage_payload(b"not a kernel").is_err());
    }
}
