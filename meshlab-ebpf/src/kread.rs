//! Kernel memory reads through BTF-resolved offsets, and TCP/IP header parsing of an skb.

use aya_ebpf::helpers::bpf_probe_read_kernel;
use meshlab_common::ConnInfo;

use crate::globals::offset;
use crate::prefilter::traced_conn;
use crate::turn::turn_sampled;

/// How a program reads a field of a kernel struct it holds a pointer to.
///
/// tp_btf, fentry and fexit programs receive BTF-typed pointers: the verifier checks a plain
/// load from them against vmlinux BTF (the offsets are frozen read-only globals, so it sees
/// constants) and JITs it as a fault-tolerant load, a few instructions instead of a
/// bpf_probe_read_kernel helper call (~20-30 ns each here, most of a traced event's cost).
/// raw_tp and kprobe programs get untyped integers and must use the helper.
///
/// Direct loads only work on a typed pointer (an argument, or a struct pointer loaded
/// directly from one) and only within the struct's BTF type: fields of a containing struct
/// (tcp_sock behind a `struct sock *`), bytes behind a `char *` (skb->head) and char arrays
/// (skb->cb) stay [`read`]s.
pub trait KernelRead {
    fn load<T: Copy>(base: u64, off: usize) -> Option<T>;
}

/// Direct loads from BTF-typed pointers (tp_btf, fentry, fexit).
pub struct BtfLoad;

impl KernelRead for BtfLoad {
    #[inline(always)]
    fn load<T: Copy>(base: u64, off: usize) -> Option<T> {
        if base == 0 {
            return None;
        }
        // SAFETY: the verifier admits this load only as a checked BTF field access, which
        // the JIT makes fault-tolerant (a bad address reads as zero instead of faulting).
        Some(unsafe { core::ptr::read_volatile((base as usize + off) as *const T) })
    }
}

/// bpf_probe_read_kernel (raw_tp, kprobe).
pub struct ProbeRead;

impl KernelRead for ProbeRead {
    #[inline(always)]
    fn load<T: Copy>(base: u64, off: usize) -> Option<T> {
        read(base, off)
    }
}

/// Reads a `T` at `base + off` of kernel memory. Errors (unmapped memory) become `None`.
#[inline(always)]
pub fn read<T: Copy>(base: u64, off: usize) -> Option<T> {
    if base == 0 {
        return None;
    }
    // SAFETY: bpf_probe_read_kernel validates the address; a fault returns an error.
    unsafe { bpf_probe_read_kernel((base as usize + off) as *const T) }.ok()
}

/// The socket cookie of `sk` (0 if the kernel has not assigned one yet).
#[inline(always)]
pub fn sock_cookie<M: KernelRead>(sk: u64) -> u64 {
    M::load::<u64>(sk, offset!(sock_common_cookie)).unwrap_or(0)
}

/// The traced connection `sk` belongs to: its cookie and its record, in place (the hooks that
/// decide a turn update it; see [`traced_conn`]).
#[inline(always)]
pub fn traced_sock<M: KernelRead>(sk: u64) -> Option<(u64, &'static mut ConnInfo)> {
    let cookie = sock_cookie::<M>(sk);
    Some((cookie, traced_conn(cookie)?))
}

/// [`traced_sock`] for the hooks that only read a turn's sampling decision (all but the first
/// of a message): `None` also between sampled turns. For a connection with a slot of its own
/// that is one inlined array read, as cheap as an untraced socket.
/// Hooks with a unix-socket fallback then try it, which a TCP socket fails on its family.
#[inline(always)]
pub fn sampled_sock<M: KernelRead>(sk: u64) -> Option<(u64, &'static ConnInfo)> {
    let (cookie, info) = traced_sock::<M>(sk)?;
    turn_sampled(info).then_some((cookie, &*info))
}

/// TCP segment facts parsed from an skb's headers.
pub struct TcpSegment {
    pub saddr: [u8; 16],
    pub daddr: [u8; 16],
    pub sport: u16,
    pub dport: u16,
    pub seq: u32,
    /// Payload bytes (whole GSO/GRO super-packet).
    pub len: u32,
}

const ETH_P_IP_VERSION: u8 = 4;
const ETH_P_IPV6_VERSION: u8 = 6;
const IPPROTO_TCP: u8 = 6;
const IPV6_HEADER_LEN: usize = 40;
/// `skb->transport_header` is `(u16)~0U` when unset.
const HEADER_UNSET: u16 = 0xffff;

/// Bytes read at the network header in one go: a whole option-less IPv4 header plus the first
/// 20 bytes of TCP, or the fixed IPv6 header. Every TCP packet the stack hands these hooks has
/// at least this much in its linear part (IPv4 20 + TCP 20, or IPv6 40).
const NET_HEADER_READ: usize = 40;
const IPV4_HEADER_LEN: usize = 20;
/// TCP header bytes the parser needs: ports, sequence number, data offset.
const TCP_HEADER_READ: usize = 16;

/// Parses IPv4/IPv6 + TCP from `skb`'s network header. `None` for non-TCP packets.
///
/// The payload length is `skb->len` minus everything from `skb->data` to the end of the TCP
/// header, so it covers GSO (TX) and GRO (RX) super-packets, whose IP length field does not.
/// Headers are read in one or two bulk reads, not field by field: each bpf_probe_read_kernel
/// is a helper call, and they were most of these programs' cost.
#[inline(always)]
pub fn parse_tcp<M: KernelRead>(skb: u64) -> Option<TcpSegment> {
    let head: u64 = M::load(skb, offset!(sk_buff_head))?;
    let data: u64 = M::load(skb, offset!(sk_buff_data))?;
    let skb_len: u32 = M::load(skb, offset!(sk_buff_len))?;
    let network_header: u16 = M::load(skb, offset!(sk_buff_network_header))?;
    if network_header == HEADER_UNSET {
        return None;
    }
    let nh = head + u64::from(network_header);
    let ip: [u8; NET_HEADER_READ] = read(nh, 0)?;
    let mut seg = TcpSegment {
        saddr: [0; 16],
        daddr: [0; 16],
        sport: 0,
        dport: 0,
        seq: 0,
        len: 0,
    };
    let (th, tcp) = match ip[0] >> 4 {
        ETH_P_IP_VERSION => {
            if ip[9] != IPPROTO_TCP {
                return None;
            }
            seg.saddr = ipv4_mapped([ip[12], ip[13], ip[14], ip[15]]);
            seg.daddr = ipv4_mapped([ip[16], ip[17], ip[18], ip[19]]);
            let ihl = usize::from(ip[0] & 0x0f) * 4;
            let th = nh + ihl as u64;
            if ihl == IPV4_HEADER_LEN {
                let mut tcp = [0u8; TCP_HEADER_READ];
                let mut i = 0;
                while i < TCP_HEADER_READ {
                    tcp[i] = ip[IPV4_HEADER_LEN + i];
                    i += 1;
                }
                (th, tcp)
            } else {
                (th, read(th, 0)?)
            }
        }
        ETH_P_IPV6_VERSION => {
            // Extension headers are not walked: TCP directly after the fixed header only.
            if ip[6] != IPPROTO_TCP {
                return None;
            }
            let mut i = 0;
            while i < 16 {
                seg.saddr[i] = ip[8 + i];
                seg.daddr[i] = ip[24 + i];
                i += 1;
            }
            let th = nh + IPV6_HEADER_LEN as u64;
            (th, read(th, 0)?)
        }
        _ => return None,
    };
    seg.sport = u16::from_be_bytes([tcp[0], tcp[1]]);
    seg.dport = u16::from_be_bytes([tcp[2], tcp[3]]);
    seg.seq = u32::from_be_bytes([tcp[4], tcp[5], tcp[6], tcp[7]]);
    let header_end = th + u64::from(tcp[12] >> 4) * 4;
    let consumed = header_end.checked_sub(data)?;
    seg.len = u64::from(skb_len).checked_sub(consumed).unwrap_or(0) as u32;
    Some(seg)
}

/// `::ffff:a.b.c.d`, so one 16-byte key type serves both address families.
#[inline(always)]
pub fn ipv4_mapped(v4: [u8; 4]) -> [u8; 16] {
    [
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, v4[0], v4[1], v4[2], v4[3],
    ]
}

/// `skb->dev->ifindex`, 0 if the skb has no device.
#[inline(always)]
pub fn skb_ifindex<M: KernelRead>(skb: u64) -> u32 {
    let dev: u64 = M::load(skb, offset!(sk_buff_dev)).unwrap_or(0);
    dev_ifindex::<M>(dev)
}

#[inline(always)]
pub fn dev_ifindex<M: KernelRead>(dev: u64) -> u32 {
    M::load::<i32>(dev, offset!(net_device_ifindex)).unwrap_or(0) as u32
}

/// `TCP_SKB_CB(skb)->seq` and `end_seq` (valid on the TCP RX path and in the receive queue).
#[inline(always)]
pub fn tcp_skb_cb_range(skb: u64) -> Option<(u32, u32)> {
    let cb = skb + offset!(sk_buff_cb) as u64;
    let seq_at = offset!(tcp_skb_cb_seq);
    // Adjacent in every kernel so far: one helper call instead of two. The offsets are
    // read-only globals, so the verifier keeps only the branch this kernel takes.
    if offset!(tcp_skb_cb_end_seq) == seq_at + 4 {
        let both: [u32; 2] = read(cb, seq_at)?;
        return Some((both[0], both[1]));
    }
    Some((
        read(cb, offset!(tcp_skb_cb_seq))?,
        read(cb, offset!(tcp_skb_cb_end_seq))?,
    ))
}
