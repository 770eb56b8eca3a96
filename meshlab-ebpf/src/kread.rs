//! Kernel memory reads through BTF-resolved offsets, and TCP/IP header parsing of an skb.

use aya_ebpf::helpers::{bpf_probe_read_kernel, bpf_skc_to_tcp_sock};
use meshlab_common::{ConnInfo, KFUNC_PLACEHOLDER_RDONLY_CAST};

use crate::globals::offset;
use crate::prefilter::{TracedConn, traced_conn};
use crate::turn::turn_sampled;

/// How a program reads a field of a kernel struct it holds a pointer to.
///
/// tp_btf, fentry and fexit programs receive BTF-typed pointers: the verifier checks a plain
/// load from them against vmlinux BTF (the offsets are frozen read-only globals, so it sees
/// constants) and JITs it as a fault-tolerant load, a few instructions instead of a
/// bpf_probe_read_kernel helper call (~60 ns each on the AMD VM host, ~11 ns on the Intel one
/// since: `cargo xtask bench helpers`, docs/benchmarks-kernel.md).
/// raw_tp and kprobe programs get untyped integers and must use the helper.
///
/// Direct loads only work on a typed pointer (an argument, or a struct pointer loaded
/// directly from one) and only within the struct's BTF type. Bytes behind a `char *`
/// (skb->head), char arrays (skb->cb) and a socket behind an untrusted pointer (skb->sk) are
/// retyped with the kfunc `bpf_rdonly_cast` where the kernel has it ([`cast`]; Linux 6.2+),
/// and stay [`read`]s elsewhere. Fields of the `struct tcp_sock` a `struct sock *` argument
/// points to are outside `struct sock`: [`KernelRead::tcp_load`] retypes the pointer first.
pub trait KernelRead {
    /// A load is an inlined instruction, not a helper call.
    const DIRECT: bool;
    fn load<T: Copy>(base: u64, off: usize) -> Option<T>;
    /// A field at `off` of the `struct tcp_sock` that socket `sk` is; `None` if it is not a
    /// full TCP socket (BtfLoad) or the read fails. With BtfLoad `sk` must be the program's
    /// own argument: a pointer loaded from a field (skb->sk, socket->sk) is not trusted, and
    /// the verifier refuses it as bpf_skc_to_tcp_sock's argument (`R1 type=rcu_ptr_`).
    fn tcp_load<T: Copy>(sk: u64, off: usize) -> Option<T>;
}

/// Direct loads from BTF-typed pointers (tp_btf, fentry, fexit).
pub struct BtfLoad;

impl KernelRead for BtfLoad {
    const DIRECT: bool = true;
    #[inline(always)]
    fn load<T: Copy>(base: u64, off: usize) -> Option<T> {
        if base == 0 {
            return None;
        }
        // SAFETY: the verifier admits this load only as a checked BTF field access, which
        // the JIT makes fault-tolerant (a bad address reads as zero instead of faulting).
        Some(unsafe { core::ptr::read_volatile((base as usize + off) as *const T) })
    }

    /// bpf_skc_to_tcp_sock returns `sk` typed as `struct tcp_sock *` (NULL unless it is a full
    /// TCP socket), so the field is a direct load. That helper is a few checks (trivial
    /// helpers such as bpf_get_current_pid_tgid cost 3-8 ns) where
    /// bpf_probe_read_kernel costs ~11-60 ns depending on the host (`cargo xtask bench
    /// helpers`, docs/benchmarks-kernel.md).
    #[inline(always)]
    fn tcp_load<T: Copy>(sk: u64, off: usize) -> Option<T> {
        if sk == 0 {
            return None;
        }
        // SAFETY: the helper accepts any BTF socket pointer and checks the socket itself.
        let tp = unsafe { bpf_skc_to_tcp_sock(sk as *mut core::ffi::c_void) };
        Self::load(tp as u64, off)
    }
}

/// bpf_probe_read_kernel (raw_tp, kprobe).
pub struct ProbeRead;

impl KernelRead for ProbeRead {
    const DIRECT: bool = false;
    #[inline(always)]
    fn load<T: Copy>(base: u64, off: usize) -> Option<T> {
        read(base, off)
    }

    /// raw_tp and kprobe programs may not call bpf_skc_to_tcp_sock (a BTF-typed helper).
    #[inline(always)]
    fn tcp_load<T: Copy>(sk: u64, off: usize) -> Option<T> {
        read(sk, off)
    }
}

/// `bpf_rdonly_cast(addr, btf_id)`: `addr` typed as a pointer to the vmlinux struct `btf_id`.
/// The verifier replaces the call by a register move and treats the result as an untrusted
/// BTF pointer: loads from it at constant offsets, each within one field of that struct, are
/// JITed as fault-tolerant loads (an unmapped address reads as zero) instead of a
/// bpf_probe_read_kernel call (see [`KernelRead`] for what one costs).
///
/// `btf_id` must be a `KernelOffsets::cast_id_*` global, non-zero (the loader leaves them 0
/// on kernels without the kfunc, where it rewrites this call into a harmless helper call; the
/// callers' `id != 0` test on the read-only global makes the verifier drop that branch), and
/// only BTF-typed programs (`KernelRead::DIRECT`) use it. The loader turns the placeholder
/// call into the kfunc call (meshlab-user/src/kernel/kfunc.rs).
#[inline(always)]
fn cast(addr: u64, btf_id: u32) -> u64 {
    let typed: u64;
    // SAFETY: a kfunc call that reads nothing and only moves `addr` into r0; r1-r5 are
    // declared clobbered as for any BPF call.
    unsafe {
        core::arch::asm!(
            "call {cast}",
            cast = const KFUNC_PLACEHOLDER_RDONLY_CAST,
            inlateout("r1") addr => _,
            inlateout("r2") u64::from(btf_id) => _,
            lateout("r0") typed,
            lateout("r3") _,
            lateout("r4") _,
            lateout("r5") _,
            options(pure, nomem, nostack),
        );
    }
    typed
}

/// A `T` at `off` of a [`cast`] pointer. `off` and `size_of::<T>()` must lie within one field
/// of the cast's struct, or the verifier refuses the program ("access beyond struct").
#[inline(always)]
fn cast_load<T: Copy>(typed: u64, off: usize) -> T {
    // SAFETY: the verifier admits this load only within a field of the cast's BTF type and
    // JITs it as a fault-tolerant load.
    unsafe { core::ptr::read_volatile((typed as usize + off) as *const T) }
}

/// `N` 8-byte words of kernel memory at `addr` (N <= CAST_WORDS_BYTES / 8): one direct load
/// each through the words struct (`KernelOffsets::cast_id_words`), or one helper read.
#[inline(always)]
fn read_words<M: KernelRead, const N: usize>(addr: u64) -> Option<[u64; N]> {
    let id = offset!(cast_id_words) as u32;
    if M::DIRECT && id != 0 {
        if addr == 0 {
            return None;
        }
        let typed = cast(addr, id);
        let mut words = [0u64; N];
        let mut i = 0;
        while i < N {
            words[i] = cast_load(typed, 8 * i);
            i += 1;
        }
        return Some(words);
    }
    read(addr, 0)
}

/// `skb_shinfo(skb)`: the shared info behind the skb's data (`skb->head + skb->end`;
/// sk_buff_data_t is an offset from head on 64-bit kernels, NET_SKBUFF_DATA_USES_OFFSET).
#[inline(always)]
pub fn skb_shinfo<M: KernelRead>(skb: u64) -> Option<u64> {
    let head: u64 = M::load(skb, offset!(sk_buff_head))?;
    let end: u32 = M::load(skb, offset!(sk_buff_end))?;
    Some(head + u64::from(end))
}

/// One 8-byte word of kernel memory at `addr` ([`read_words`]).
#[inline(always)]
pub fn read_word<M: KernelRead>(addr: u64) -> Option<u64> {
    read_words::<M, 1>(addr).map(|w| w[0])
}

/// A field at `off` of the `struct tcp_sock` at `sk`, for a pointer the verifier does not
/// trust (loaded from a field, e.g. skb->sk), which bpf_skc_to_tcp_sock refuses. The caller
/// knows `sk` is a full TCP socket (a traced connection's): nothing checks it here, as with
/// the helper read it replaces.
#[inline(always)]
pub fn untrusted_tcp_load<M: KernelRead, T: Copy>(sk: u64, off: usize) -> Option<T> {
    let id = offset!(cast_id_tcp_sock) as u32;
    if M::DIRECT && id != 0 {
        if sk == 0 {
            return None;
        }
        return Some(cast_load(cast(sk, id), off));
    }
    read(sk, off)
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
pub fn traced_sock<M: KernelRead>(sk: u64) -> Option<(u64, TracedConn)> {
    let cookie = sock_cookie::<M>(sk);
    Some((cookie, traced_conn(cookie)?))
}

/// [`traced_sock`] for the hooks that only read a turn's sampling decision (all but the first
/// of a message): `None` also between sampled turns. For a connection with a slot of its own
/// that is one inlined array read, as cheap as an untraced socket.
/// Hooks with a unix-socket fallback then try it, which a TCP socket fails on its family.
#[inline(always)]
pub fn sampled_sock<M: KernelRead>(sk: u64) -> Option<(u64, &'static ConnInfo)> {
    let (cookie, conn) = traced_sock::<M>(sk)?;
    let info = conn.info();
    turn_sampled(info).then_some((cookie, info))
}

/// A 16-byte address as two native-endian words of its bytes (IPv4-mapped for IPv4): what the
/// parser and the tuple compares work on, two registers instead of 16 byte loads and spills.
pub type Addr = [u64; 2];

/// The words of a 16-byte address field of a [`meshlab_common::TupleKey`] (8-byte aligned).
#[inline(always)]
pub fn addr_words(addr: &[u8; 16]) -> Addr {
    // SAFETY: TupleKey is 8-byte aligned and its addresses sit at offsets 0 and 16, so the
    // reference is 8-byte aligned; any bytes are valid u64s.
    unsafe { *(addr as *const [u8; 16]).cast::<Addr>() }
}

/// The bytes of an address held as words (for an event's saddr/daddr).
#[inline(always)]
pub fn addr_bytes(words: Addr) -> [u8; 16] {
    // SAFETY: same size, any bytes valid.
    unsafe { core::mem::transmute::<Addr, [u8; 16]>(words) }
}

/// TCP segment facts parsed from an skb's headers.
pub struct TcpSegment {
    pub saddr: Addr,
    pub daddr: Addr,
    pub sport: u16,
    pub dport: u16,
    pub seq: u32,
    /// Payload bytes (whole GSO/GRO super-packet).
    pub len: u32,
}

const ETH_P_IP_VERSION: u64 = 4;
const ETH_P_IPV6_VERSION: u64 = 6;
const IPPROTO_TCP: u64 = 6;
const IPV6_HEADER_LEN: u64 = 40;
/// `skb->transport_header` is `(u16)~0U` when unset.
const HEADER_UNSET: u16 = 0xffff;
const IPV4_HEADER_LEN: u64 = 20;
/// `::ffff:0.0.0.0` as the second word of an IPv4-mapped address (bytes 10 and 11 = 0xff).
const IPV4_MAPPED_MARK: u64 = 0xffff_0000;

/// Byte `n` (0-7) of a word read from memory (little endian: byte 0 is the low byte).
#[inline(always)]
fn byte(word: u64, n: u32) -> u64 {
    (word >> (8 * n)) & 0xff
}

/// Parses IPv4/IPv6 + TCP from `skb`'s network header. `None` for non-TCP packets.
///
/// The payload length is `skb->len` minus everything from `skb->data` to the end of the TCP
/// header, so it covers GSO (TX) and GRO (RX) super-packets, whose IP length field does not.
/// The bytes are read as 8-byte words and fields taken out with shifts (a byte array came out
/// as ~40 byte loads and stack spills per packet in the translated code): on tp_btf with
/// `bpf_rdonly_cast`, one direct load per word ([`read_words`]: a cast to `struct iphdr`
/// would allow loads within its fields only, twice as many loads, none of them a helper
/// call either way); elsewhere one or two bulk helper reads, not field by field.
///
/// The first read covers a whole option-less IPv4 header plus the first 20 bytes of TCP, or
/// the fixed IPv6 header: every TCP packet the stack hands these hooks has at least this much
/// in its linear part (IPv4 20 + TCP 20, or IPv6 40).
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
    let ip: [u64; 5] = read_words::<M, 5>(nh)?;
    let first = byte(ip[0], 0);
    // (saddr, daddr, TCP header start, its first 16 bytes as two words)
    let (saddr, daddr, th, tcp) = match first >> 4 {
        ETH_P_IP_VERSION => {
            if byte(ip[1], 1) != IPPROTO_TCP {
                return None;
            }
            // Source: bytes 12-15 (high half of word 1); destination: bytes 16-19.
            let saddr = [0, IPV4_MAPPED_MARK | (ip[1] & 0xffff_ffff_0000_0000)];
            let daddr = [0, IPV4_MAPPED_MARK | (ip[2] << 32)];
            let ihl = (first & 0x0f) * 4;
            let th = nh + ihl;
            let tcp = if ihl == IPV4_HEADER_LEN {
                // TCP bytes 0-15 are header bytes 20-35.
                [(ip[2] >> 32) | (ip[3] << 32), (ip[3] >> 32) | (ip[4] << 32)]
            } else {
                read_words::<M, 2>(th)?
            };
            (saddr, daddr, th, tcp)
        }
        ETH_P_IPV6_VERSION => {
            // Extension headers are not walked: TCP directly after the fixed header only.
            if byte(ip[0], 6) != IPPROTO_TCP {
                return None;
            }
            let th = nh + IPV6_HEADER_LEN;
            ([ip[1], ip[2]], [ip[3], ip[4]], th, read_words::<M, 2>(th)?)
        }
        _ => return None,
    };
    let header_end = th + (byte(tcp[1], 4) >> 4) * 4;
    let consumed = header_end.checked_sub(data)?;
    Some(TcpSegment {
        saddr,
        daddr,
        sport: u16::from_be(tcp[0] as u16),
        dport: u16::from_be((tcp[0] >> 16) as u16),
        seq: u32::from_be((tcp[0] >> 32) as u32),
        len: u64::from(skb_len).checked_sub(consumed).unwrap_or(0) as u32,
    })
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
/// With `bpf_rdonly_cast`, `skb->cb` is cast to `struct tcp_skb_cb` and the two fields are
/// direct loads (one 8-byte load across both would be refused: it spans two fields).
#[inline(always)]
pub fn tcp_skb_cb_range<M: KernelRead>(skb: u64) -> Option<(u32, u32)> {
    if skb == 0 {
        return None;
    }
    let cb = skb + offset!(sk_buff_cb) as u64;
    let id = offset!(cast_id_tcp_skb_cb) as u32;
    if M::DIRECT && id != 0 {
        let typed = cast(cb, id);
        return Some((
            cast_load(typed, offset!(tcp_skb_cb_seq)),
            cast_load(typed, offset!(tcp_skb_cb_end_seq)),
        ));
    }
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
