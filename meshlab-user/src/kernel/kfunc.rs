//! Kernel function (kfunc) calls in the eBPF object, resolved by this loader.
//!
//! aya 0.14 neither emits nor relocates kfunc calls (docs/toolchain.md). The programs write each
//! kfunc call as `call <placeholder>` ([`meshlab_common::KFUNC_CALL_PLACEHOLDERS`]); before aya
//! parses the object, [`patch_object`] rewrites every such instruction into a kfunc call
//! (src_reg = BPF_PSEUDO_KFUNC_CALL, off = 0: vmlinux, imm = the function's BTF id), or, on a
//! kernel without the function, into a call of a helper every kernel has. The second case is
//! never executed: the caller gates the code with a read-only global the verifier sees as 0.

use btf_rs::{Btf, Type};
use meshlab_common::{CAST_WORDS_BYTES, KFUNC_CALL_PLACEHOLDERS, KernelOffsets};
use object::{Object, ObjectSection, SectionKind};

/// BPF_JMP | BPF_CALL.
const OP_CALL: u8 = 0x85;
/// include/uapi/linux/bpf.h: src_reg of a call to a kernel function.
const BPF_PSEUDO_KFUNC_CALL: u8 = 2;
/// BPF_FUNC_ktime_get_ns: takes no argument and exists in every kernel eBPF runs on; the
/// stand-in for a kfunc the kernel lacks.
const HARMLESS_HELPER: i32 = 5;
const INSN_BYTES: usize = 8;

/// The kfuncs sock_ops TX timestamps need (`Config::tx_timestamps`, Linux 6.15+).
pub const TX_TSTAMP_KFUNCS: [&str; 2] = ["bpf_cast_to_kern_ctx", "bpf_sock_ops_enable_tx_tstamp"];
/// Retypes a kernel address for direct loads (Linux 6.2+); gated by the
/// `KernelOffsets::cast_id_*` type ids ([`set_cast_ids`]).
pub const RDONLY_CAST_KFUNC: &str = "bpf_rdonly_cast";
/// The struct whose 8-byte fields serve as words over raw kernel bytes
/// (`KernelOffsets::cast_id_words`): on x86-64 every field of `struct user_regs_struct` is an
/// `unsigned long`. Checked in BTF before use ([`words_struct_id`]).
const WORDS_STRUCT: &str = "user_regs_struct";

#[derive(Debug, thiserror::Error)]
pub enum KfuncError {
    #[error("the embedded eBPF object does not parse: {0}")]
    Parse(#[from] object::Error),
    #[error(
        "the embedded eBPF object has no call placeholder for kfunc {0} (built from other sources than this loader?)"
    )]
    NoPlaceholder(&'static str),
}

/// The vmlinux BTF ids of the kfuncs the object calls, `None` where the kernel lacks one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KfuncIds(pub Vec<(&'static str, Option<u32>)>);

impl KfuncIds {
    /// Looks every kfunc of [`KFUNC_CALL_PLACEHOLDERS`] up as a FUNC in `btf`.
    pub fn resolve(btf: &Btf) -> Self {
        let ids = KFUNC_CALL_PLACEHOLDERS
            .iter()
            .map(|(name, _)| (*name, func_id(btf, name)))
            .collect();
        KfuncIds(ids)
    }

    /// The BTF id of kfunc `name`, `None` if the kernel lacks it.
    pub fn id(&self, name: &str) -> Option<u32> {
        self.0
            .iter()
            .find(|(n, _)| *n == name)
            .and_then(|(_, id)| *id)
    }

    /// Every kfunc of `names` resolved: the object's calls of them can be used.
    pub fn all_present(&self, names: &[&str]) -> bool {
        names.iter().all(|name| self.id(name).is_some())
    }

    /// The kfuncs of `names` the kernel lacks.
    pub fn missing<'n>(&self, names: &[&'n str]) -> Vec<&'n str> {
        names
            .iter()
            .filter(|name| self.id(name).is_none())
            .copied()
            .collect()
    }
}

/// Fills the `cast_id_*` fields of `offsets`: the vmlinux BTF ids of the struct types the
/// tp_btf programs hand to `bpf_rdonly_cast`, each 0 (the programs then read with
/// bpf_probe_read_kernel) when the kernel lacks the kfunc or the type.
pub fn set_cast_ids(offsets: &mut KernelOffsets, btf: &Btf, kfuncs: &KfuncIds) {
    let usable = kfuncs.id(RDONLY_CAST_KFUNC).is_some();
    let id = |found: Option<u32>| if usable { found.unwrap_or(0) } else { 0 };
    offsets.cast_id_words = id(words_struct_id(btf, WORDS_STRUCT));
    offsets.cast_id_tcp_skb_cb = id(struct_id(btf, "tcp_skb_cb"));
    offsets.cast_id_tcp_sock = id(struct_id(btf, "tcp_sock"));
}

/// The id of the struct named `name` that has members (not a forward declaration).
fn struct_id(btf: &Btf, name: &str) -> Option<u32> {
    btf.resolve_ids_by_name(name).ok()?.into_iter().find(
        |id| matches!(btf.resolve_type_by_id(*id), Ok(Type::Struct(s)) if !s.members.is_empty()),
    )
}

/// [`struct_id`], if the struct's first [`CAST_WORDS_BYTES`] bytes are 8-byte integer fields
/// at every 8-byte offset: the verifier admits an 8-byte load from a cast pointer only within
/// one field, so each word the programs load must be exactly one field.
fn words_struct_id(btf: &Btf, name: &str) -> Option<u32> {
    let id = struct_id(btf, name)?;
    let Ok(Type::Struct(s)) = btf.resolve_type_by_id(id) else {
        return None;
    };
    let word_at = |bits: u32| {
        s.members.iter().any(|m| {
            m.bit_offset() == bits
                && m.bitfield_size().is_none()
                && matches!(strip_modifiers(btf, btf.resolve_chained_type(m)), Some(Type::Int(i)) if i.size() == 8)
        })
    };
    (0..CAST_WORDS_BYTES / 8)
        .all(|word| word_at(word * 64))
        .then_some(id)
}

/// Follows typedef/const/volatile/restrict/type-tag links to the underlying type.
fn strip_modifiers(btf: &Btf, ty: btf_rs::Result<Type>) -> Option<Type> {
    let mut ty = ty.ok()?;
    loop {
        ty = match &ty {
            Type::Typedef(t) => btf.resolve_chained_type(t).ok()?,
            Type::Const(t) | Type::Volatile(t) | Type::Restrict(t) => {
                btf.resolve_chained_type(t).ok()?
            }
            Type::TypeTag(t) => btf.resolve_chained_type(t).ok()?,
            _ => return Some(ty),
        };
    }
}

fn func_id(btf: &Btf, name: &str) -> Option<u32> {
    let ids = btf.resolve_ids_by_name(name).ok()?;
    ids.into_iter()
        .find(|id| matches!(btf.resolve_type_by_id(*id), Ok(Type::Func(_))))
}

/// A copy of `object` (8-byte aligned, as the ELF parser needs) with every kfunc call
/// placeholder in its code sections rewritten for this kernel.
pub fn patch_object(object: &[u8], ids: &KfuncIds) -> Result<AlignedBytes, KfuncError> {
    let mut out = AlignedBytes::copy_of(object);
    let ranges: Vec<(usize, usize)> = object::File::parse(object)?
        .sections()
        .filter(|s| s.kind() == SectionKind::Text)
        .filter_map(|s| s.file_range())
        .map(|(start, len)| (start as usize, len as usize))
        .collect();
    for (name, placeholder) in KFUNC_CALL_PLACEHOLDERS {
        let id = ids
            .0
            .iter()
            .find(|(n, _)| *n == name)
            .and_then(|(_, id)| *id);
        let mut found = 0;
        for &(start, len) in &ranges {
            found += patch_range(&mut out.bytes_mut()[start..start + len], placeholder, id);
        }
        if found == 0 {
            return Err(KfuncError::NoPlaceholder(name));
        }
    }
    Ok(out)
}

/// Rewrites the placeholder calls among the instructions in `code`; returns how many.
fn patch_range(code: &mut [u8], placeholder: i32, id: Option<u32>) -> usize {
    let wanted = placeholder_insn(placeholder);
    let mut count = 0;
    for insn in code.chunks_exact_mut(INSN_BYTES) {
        if insn != wanted {
            continue;
        }
        // Byte 1 holds dst_reg (low nibble) and src_reg (high nibble) on little endian.
        let (src, imm) = match id {
            Some(id) => (BPF_PSEUDO_KFUNC_CALL << 4, id as i32),
            None => (0, HARMLESS_HELPER),
        };
        insn[1] = src;
        insn[4..8].copy_from_slice(&imm.to_le_bytes());
        count += 1;
    }
    count
}

/// `call <placeholder>` as the BPF assembler encodes it: a helper call, registers and offset 0.
fn placeholder_insn(placeholder: i32) -> [u8; INSN_BYTES] {
    let imm = placeholder.to_le_bytes();
    [OP_CALL, 0, 0, 0, imm[0], imm[1], imm[2], imm[3]]
}

/// Bytes on an 8-byte boundary (an ELF parser reads its headers in place).
pub struct AlignedBytes {
    words: Vec<u64>,
    len: usize,
}

impl AlignedBytes {
    fn copy_of(bytes: &[u8]) -> Self {
        let mut words = vec![0u64; bytes.len().div_ceil(8)];
        for (word, chunk) in words.iter_mut().zip(bytes.chunks(8)) {
            let mut buf = [0u8; 8];
            buf[..chunk.len()].copy_from_slice(chunk);
            // Native order: the bytes land in memory exactly as they were.
            *word = u64::from_ne_bytes(buf);
        }
        AlignedBytes {
            words,
            len: bytes.len(),
        }
    }

    pub fn bytes(&self) -> &[u8] {
        // SAFETY: `words` owns at least `len` initialised bytes; u8 has no alignment needs.
        unsafe { std::slice::from_raw_parts(self.words.as_ptr().cast(), self.len) }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`, and the borrow is exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.words.as_mut_ptr().cast(), self.len) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::loader::EBPF_OBJECT;

    fn count_insn(bytes: &[u8], insn: [u8; 8]) -> usize {
        bytes.chunks_exact(8).filter(|c| *c == insn).count()
    }

    #[test]
    fn every_placeholder_becomes_a_kfunc_call_with_its_btf_id() {
        let ids = KfuncIds(vec![
            ("bpf_cast_to_kern_ctx", Some(63_548)),
            ("bpf_sock_ops_enable_tx_tstamp", Some(65_760)),
            ("bpf_rdonly_cast", Some(64_911)),
        ]);
        let patched = patch_object(EBPF_OBJECT, &ids).expect("patch");
        for (name, placeholder) in KFUNC_CALL_PLACEHOLDERS {
            let before = count_insn(EBPF_OBJECT, placeholder_insn(placeholder));
            assert!(before >= 1, "{name}: no placeholder in the object");
            assert_eq!(
                count_insn(patched.bytes(), placeholder_insn(placeholder)),
                0
            );
            let id = ids.0.iter().find(|(n, _)| *n == name).unwrap().1.unwrap();
            let mut kfunc = [OP_CALL, BPF_PSEUDO_KFUNC_CALL << 4, 0, 0, 0, 0, 0, 0];
            kfunc[4..].copy_from_slice(&id.to_le_bytes());
            assert_eq!(count_insn(patched.bytes(), kfunc), before, "{name}");
        }
        assert_eq!(patched.bytes().len(), EBPF_OBJECT.len());
        assert_eq!(patched.bytes().as_ptr() as usize % 8, 0);
    }

    #[test]
    fn a_missing_kfunc_becomes_a_harmless_helper_call() {
        let ids = KfuncIds(vec![
            ("bpf_cast_to_kern_ctx", Some(1)),
            ("bpf_sock_ops_enable_tx_tstamp", None),
            ("bpf_rdonly_cast", None),
        ]);
        assert!(!ids.all_present(&TX_TSTAMP_KFUNCS));
        assert_eq!(
            ids.missing(&TX_TSTAMP_KFUNCS),
            vec!["bpf_sock_ops_enable_tx_tstamp"]
        );
        let patched = patch_object(EBPF_OBJECT, &ids).expect("patch");
        let (_, enable) = KFUNC_CALL_PLACEHOLDERS[1];
        let before = count_insn(EBPF_OBJECT, placeholder_insn(enable));
        assert_eq!(count_insn(patched.bytes(), placeholder_insn(enable)), 0);
        assert!(count_insn(patched.bytes(), placeholder_insn(HARMLESS_HELPER)) >= before);
        let (_, cast) = KFUNC_CALL_PLACEHOLDERS[2];
        assert_eq!(count_insn(patched.bytes(), placeholder_insn(cast)), 0);
    }

    #[test]
    fn cast_ids_are_zero_without_the_kfunc_and_set_with_it() {
        if !std::path::Path::new(super::super::btf_offsets::VMLINUX_BTF).exists() {
            eprintln!("SKIP: no kernel BTF");
            return;
        }
        let btf = super::super::btf_offsets::read_btf(std::path::Path::new(
            super::super::btf_offsets::VMLINUX_BTF,
        ))
        .expect("btf");
        let kfuncs = KfuncIds::resolve(&btf);
        let mut offsets = KernelOffsets::default();
        set_cast_ids(
            &mut offsets,
            &btf,
            &KfuncIds(vec![(RDONLY_CAST_KFUNC, None)]),
        );
        assert_eq!(
            (
                offsets.cast_id_words,
                offsets.cast_id_tcp_skb_cb,
                offsets.cast_id_tcp_sock
            ),
            (0, 0, 0)
        );
        if kfuncs.id(RDONLY_CAST_KFUNC).is_none() {
            eprintln!("SKIP: this kernel has no {RDONLY_CAST_KFUNC}");
            return;
        }
        set_cast_ids(&mut offsets, &btf, &kfuncs);
        assert_ne!(offsets.cast_id_tcp_skb_cb, 0);
        assert_ne!(offsets.cast_id_tcp_sock, 0);
        #[cfg(target_arch = "x86_64")]
        assert_ne!(
            offsets.cast_id_words, 0,
            "user_regs_struct is all words on x86-64"
        );
        // Not a run of 8-byte fields: refused as the words type.
        assert_eq!(words_struct_id(&btf, "tcp_skb_cb"), None);
    }

    #[test]
    fn an_object_without_placeholders_is_refused_by_name() {
        let mut bytes = AlignedBytes::copy_of(EBPF_OBJECT);
        let (_, cast) = KFUNC_CALL_PLACEHOLDERS[0];
        let wanted = placeholder_insn(cast);
        for insn in bytes.bytes_mut().chunks_exact_mut(8) {
            if insn == wanted {
                insn[4] ^= 0xff;
            }
        }
        let ids = KfuncIds(vec![]);
        let err = patch_object(bytes.bytes(), &ids).err().expect("refused");
        assert!(err.to_string().contains("bpf_cast_to_kern_ctx"), "{err}");
    }
}
