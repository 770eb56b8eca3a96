//! Kernel struct field offsets from vmlinux BTF, handed to the eBPF programs at load.
//!
//! Rust eBPF has no CO-RE relocations, so this is how the programs stay correct across kernel
//! builds: every field they read is looked up here by name, through anonymous unions and
//! structs, and a kernel without one of them fails at start-up naming the struct and field.

use std::path::Path;

use btf_rs::{Btf, Type};
use meshlab_common::KernelOffsets;

/// Where the running kernel publishes its BTF.
pub const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";

#[derive(Debug, thiserror::Error)]
pub enum OffsetError {
    #[error("cannot read kernel BTF {path}: {source} (needs CONFIG_DEBUG_INFO_BTF=y)")]
    Read { path: String, source: btf_rs::Error },
    #[error("kernel BTF has no struct {0}")]
    NoStruct(String),
    #[error(
        "kernel struct {strukt} has no field {field} (this kernel is not supported by this meshlab version)"
    )]
    NoField { strukt: String, field: String },
    #[error("kernel struct {strukt} field {field} is a bitfield; meshlab reads whole fields only")]
    Bitfield { strukt: String, field: String },
    #[error("BTF error while resolving {strukt}.{field}: {source}")]
    Btf {
        strukt: String,
        field: String,
        source: btf_rs::Error,
    },
}

/// Parses the BTF file at `path` (offsets and kfunc ids are looked up in one parse).
pub fn read_btf(path: &Path) -> Result<Btf, OffsetError> {
    Btf::from_file(path).map_err(|source| OffsetError::Read {
        path: path.display().to_string(),
        source,
    })
}

/// Resolves every offset the kernel programs need from a parsed BTF ([`read_btf`]).
pub fn resolve_offsets_from(btf: &Btf) -> Result<KernelOffsets, OffsetError> {
    let r = Resolver { btf };
    Ok(KernelOffsets {
        sk_buff_sk: r.offset("sk_buff", "sk")?,
        sk_buff_len: r.offset("sk_buff", "len")?,
        sk_buff_data: r.offset("sk_buff", "data")?,
        sk_buff_head: r.offset("sk_buff", "head")?,
        sk_buff_network_header: r.offset("sk_buff", "network_header")?,
        sk_buff_dev: r.offset("sk_buff", "dev")?,
        sk_buff_cb: r.offset("sk_buff", "cb")?,
        sk_buff_queue_mapping: r.offset("sk_buff", "queue_mapping")?,
        sock_common_cookie: r.offset("sock", "__sk_common.skc_cookie")?,
        sock_common_family: r.offset("sock", "__sk_common.skc_family")?,
        tcp_sock_write_seq: r.offset("tcp_sock", "write_seq")?,
        tcp_sock_copied_seq: r.offset("tcp_sock", "copied_seq")?,
        tcp_sock_rcv_nxt: r.offset("tcp_sock", "rcv_nxt")?,
        net_device_ifindex: r.offset("net_device", "ifindex")?,
        task_struct_pid: r.offset("task_struct", "pid")?,
        task_struct_tgid: r.offset("task_struct", "tgid")?,
        tcp_skb_cb_seq: r.offset("tcp_skb_cb", "seq")?,
        tcp_skb_cb_end_seq: r.offset("tcp_skb_cb", "end_seq")?,
        msghdr_msg_iter: r.offset("msghdr", "msg_iter")?,
        iov_iter_count: r.offset("iov_iter", "count")?,
        napi_struct_dev: r.offset("napi_struct", "dev")?,
        sock_common_net: r.offset("sock", "__sk_common.skc_net")?,
        net_cookie: r.offset("net", "net_cookie")?,
        unix_sock_peer: r.offset("unix_sock", "peer")?,
        socket_sk: r.offset("socket", "sk")?,
        sock_ops_kern_skb: r.offset("bpf_sock_ops_kern", "skb")?,
        sk_buff_end: r.offset("sk_buff", "end")?,
        skb_shared_info_tskey: r.offset("skb_shared_info", "tskey")?,
        skb_shared_info_hwtstamps: r.offset("skb_shared_info", "hwtstamps")?,
        // Filled by kfunc::set_cast_ids, which knows whether the kernel has the kfunc.
        cast_id_words: 0,
        cast_id_tcp_skb_cb: 0,
        cast_id_tcp_sock: 0,
    })
}

struct Resolver<'a> {
    btf: &'a Btf,
}

impl Resolver<'_> {
    /// Byte offset of `path` (dot-separated member names) inside `struct strukt`. Anonymous
    /// struct/union members are searched transparently, as C does.
    fn offset(&self, strukt: &str, path: &str) -> Result<u32, OffsetError> {
        let err_ctx = |source| OffsetError::Btf {
            strukt: strukt.into(),
            field: path.into(),
            source,
        };
        let mut current = self.find_struct(strukt)?;
        let mut bits = 0u32;
        let mut parts = path.split('.').peekable();
        while let Some(name) = parts.next() {
            let (member_bits, member_type) = self
                .find_member(&current, name)
                .map_err(err_ctx)?
                .ok_or_else(|| OffsetError::NoField {
                    strukt: strukt.into(),
                    field: path.into(),
                })?;
            bits += member_bits;
            if parts.peek().is_some() {
                current = match member_type {
                    Type::Struct(s) | Type::Union(s) => s,
                    _ => {
                        return Err(OffsetError::NoField {
                            strukt: strukt.into(),
                            field: path.into(),
                        });
                    }
                };
            }
        }
        if !bits.is_multiple_of(8) {
            return Err(OffsetError::Bitfield {
                strukt: strukt.into(),
                field: path.into(),
            });
        }
        Ok(bits / 8)
    }

    /// The struct named `name` with members (skipping forward declarations and empty stubs).
    fn find_struct(&self, name: &str) -> Result<btf_rs::Struct, OffsetError> {
        let types = self
            .btf
            .resolve_types_by_name(name)
            .map_err(|_| OffsetError::NoStruct(name.into()))?;
        types
            .into_iter()
            .find_map(|t| match t {
                Type::Struct(s) if !s.members.is_empty() => Some(s),
                _ => None,
            })
            .ok_or_else(|| OffsetError::NoStruct(name.into()))
    }

    /// Finds `name` among `strukt`'s members, descending into anonymous members. Returns the
    /// member's bit offset from the start of `strukt` and its type with modifiers stripped.
    fn find_member(
        &self,
        strukt: &btf_rs::Struct,
        name: &str,
    ) -> Result<Option<(u32, Type)>, btf_rs::Error> {
        for member in &strukt.members {
            let member_name = self.btf.resolve_name(member).unwrap_or_default();
            let ty = self.strip_modifiers(self.btf.resolve_chained_type(member)?)?;
            if member_name == name {
                return Ok(Some((member.bit_offset(), ty)));
            }
            if member_name.is_empty()
                && let Type::Struct(inner) | Type::Union(inner) = &ty
                && let Some((bits, found)) = self.find_member(inner, name)?
            {
                return Ok(Some((member.bit_offset() + bits, found)));
            }
        }
        Ok(None)
    }

    /// Follows typedef/const/volatile/restrict/type-tag links to the underlying type.
    fn strip_modifiers(&self, mut ty: Type) -> Result<Type, btf_rs::Error> {
        loop {
            ty = match &ty {
                Type::Typedef(t) => self.btf.resolve_chained_type(t)?,
                Type::Const(t) | Type::Volatile(t) | Type::Restrict(t) => {
                    self.btf.resolve_chained_type(t)?
                }
                Type::TypeTag(t) => self.btf.resolve_chained_type(t)?,
                _ => return Ok(ty),
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs on every machine that has kernel BTF (all CI machines here do): the offsets must be
    /// consistent with facts that hold on every Linux build.
    #[test]
    fn running_kernel_offsets_are_plausible() {
        if !Path::new(VMLINUX_BTF).exists() {
            eprintln!("SKIP: {VMLINUX_BTF} missing");
            assert!(
                !meshlab_testkit::privileged::skipping_forbidden(),
                "BTF required in CI"
            );
            return;
        }
        let off = read_btf(Path::new(VMLINUX_BTF))
            .and_then(|btf| resolve_offsets_from(&btf))
            .expect("resolve");
        // struct sock starts with struct sock_common; tcp_skb_cb starts with seq, end_seq.
        assert!(
            off.sock_common_cookie > 0 && off.sock_common_cookie < 256,
            "{off:?}"
        );
        assert_eq!(off.tcp_skb_cb_seq, 0);
        assert_eq!(off.tcp_skb_cb_end_seq, 4);
        // In sk_buff, head precedes data and both follow the header offsets' union area.
        assert_eq!(
            off.sk_buff_data,
            off.sk_buff_head + 8,
            "head and data are adjacent pointers"
        );
        assert!(off.sk_buff_network_header > off.sk_buff_queue_mapping);
        // sk_buff_data_t tail, end precede head (the TX timestamp key is read through end).
        assert_eq!(
            off.sk_buff_end + 4,
            off.sk_buff_head,
            "end is the u32 before head"
        );
        // skb_shared_info: hwtstamps (8 bytes), gso_type, then tskey (the RX and TX stamps).
        assert_eq!(
            off.skb_shared_info_hwtstamps + 12,
            off.skb_shared_info_tskey,
            "hwtstamps, gso_type, tskey"
        );
        assert_ne!(off.task_struct_pid, off.task_struct_tgid);
        assert_eq!(
            off.task_struct_tgid,
            off.task_struct_pid + 4,
            "pid and tgid are adjacent"
        );
    }

    #[test]
    fn missing_field_names_struct_and_field() {
        if !Path::new(VMLINUX_BTF).exists() {
            eprintln!("SKIP: {VMLINUX_BTF} missing");
            return;
        }
        let btf = Btf::from_file(VMLINUX_BTF).unwrap();
        let err = Resolver { btf: &btf }
            .offset("sk_buff", "no_such_field")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("sk_buff") && err.contains("no_such_field"),
            "{err}"
        );
        let err = Resolver { btf: &btf }
            .offset("no_such_struct_xyz", "a")
            .unwrap_err()
            .to_string();
        assert!(err.contains("no_such_struct_xyz"), "{err}");
    }
}
