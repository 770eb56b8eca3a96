//! Raw BPF programs and maps through bpf(2), so xtask needs no eBPF library: a few-line
//! assembler, map creation, program load, raw tracepoint and XDP attach and a ring buffer
//! drain. Used for the empty floor program (crate::bpffloor), the helper micro-benchmark
//! (crate::bench_helpers) and truth's loss on the wire (crate::wire_loss).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use anyhow::{Result, bail};

const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_RAW_TRACEPOINT_OPEN: libc::c_long = 17;
const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_PROG_TYPE_RAW_TRACEPOINT: u32 = 17;
pub const BPF_PROG_TYPE_XDP: u32 = 6;
/// `enum bpf_attach_type` BPF_XDP: a BPF link on a network device's XDP hook.
const BPF_XDP: u32 = 37;
pub const BPF_MAP_TYPE_ARRAY: u32 = 2;
pub const BPF_MAP_TYPE_PERCPU_ARRAY: u32 = 6;
pub const BPF_MAP_TYPE_RINGBUF: u32 = 27;

/// Helper ids (include/uapi/linux/bpf.h, `___BPF_FUNC_MAPPER`).
pub mod helper {
    pub const MAP_LOOKUP_ELEM: i32 = 1;
    pub const KTIME_GET_NS: i32 = 5;
    pub const GET_PRANDOM_U32: i32 = 7;
    pub const GET_SMP_PROCESSOR_ID: i32 = 8;
    pub const GET_CURRENT_PID_TGID: i32 = 14;
    pub const GET_CURRENT_TASK: i32 = 35;
    pub const PROBE_READ_KERNEL: i32 = 113;
    pub const RINGBUF_OUTPUT: i32 = 130;
    pub const RINGBUF_RESERVE: i32 = 131;
    pub const RINGBUF_SUBMIT: i32 = 132;
}

/// `bpf_ringbuf_submit` flag: no reader wakeup (what the recorder passes for most events).
pub const BPF_RB_NO_WAKEUP: i32 = 1;

/// Register numbers; r10 is the read-only frame pointer.
pub const R0: u8 = 0;
pub const R1: u8 = 1;
pub const R2: u8 = 2;
pub const R3: u8 = 3;
pub const R4: u8 = 4;
pub const R6: u8 = 6;
pub const R7: u8 = 7;
pub const R8: u8 = 8;
pub const R10: u8 = 10;

/// A program under construction: one u64 per instruction, in `struct bpf_insn` byte order.
#[derive(Default)]
pub struct Asm {
    insns: Vec<u64>,
}

fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> u64 {
    u64::from(code)
        | u64::from(dst | (src << 4)) << 8
        | u64::from(off as u16) << 16
        | u64::from(imm as u32) << 32
}

impl Asm {
    fn push(&mut self, code: u8, dst: u8, src: u8, off: i16, imm: i32) -> &mut Asm {
        self.insns.push(insn(code, dst, src, off, imm));
        self
    }
    /// `dst = imm` (64-bit).
    pub fn mov_imm(&mut self, dst: u8, imm: i32) -> &mut Asm {
        self.push(0xb7, dst, 0, 0, imm)
    }
    /// `dst = src` (64-bit).
    pub fn mov_reg(&mut self, dst: u8, src: u8) -> &mut Asm {
        self.push(0xbf, dst, src, 0, 0)
    }
    /// `dst += imm` (64-bit).
    pub fn add_imm(&mut self, dst: u8, imm: i32) -> &mut Asm {
        self.push(0x07, dst, 0, 0, imm)
    }
    /// `dst = map` (ld_imm64 with BPF_PSEUDO_MAP_FD: the verifier turns the fd into the map).
    pub fn ld_map(&mut self, dst: u8, map: &OwnedFd) -> &mut Asm {
        self.push(0x18, dst, 1, 0, map.as_raw_fd());
        self.push(0, 0, 0, 0, 0)
    }
    /// `*(u64 *)(dst + off) = imm`.
    pub fn st_u64(&mut self, dst: u8, off: i16, imm: i32) -> &mut Asm {
        self.push(0x7a, dst, 0, off, imm)
    }
    /// `*(u32 *)(dst + off) = imm`.
    pub fn st_u32(&mut self, dst: u8, off: i16, imm: i32) -> &mut Asm {
        self.push(0x62, dst, 0, off, imm)
    }
    /// `*(u64 *)(dst + off) = src`.
    pub fn stx_u64(&mut self, dst: u8, off: i16, src: u8) -> &mut Asm {
        self.push(0x7b, dst, src, off, 0)
    }
    /// `*(u32 *)(dst + off) = src`.
    pub fn stx_u32(&mut self, dst: u8, off: i16, src: u8) -> &mut Asm {
        self.push(0x63, dst, src, off, 0)
    }
    /// `dst = *(u64 *)(src + off)`.
    pub fn ldx_u64(&mut self, dst: u8, src: u8, off: i16) -> &mut Asm {
        self.push(0x79, dst, src, off, 0)
    }
    /// `lock *(u64 *)(dst + off) += src`.
    pub fn atomic_add_u64(&mut self, dst: u8, off: i16, src: u8) -> &mut Asm {
        self.push(0xdb, dst, src, off, 0)
    }
    /// `src = atomic_fetch_add((u64 *)(dst + off), src)`: the old value comes back in `src`.
    pub fn atomic_fetch_add_u64(&mut self, dst: u8, off: i16, src: u8) -> &mut Asm {
        const BPF_FETCH: i32 = 0x01;
        self.push(0xdb, dst, src, off, BPF_FETCH)
    }
    /// `dst &= imm` (64-bit).
    pub fn and_imm(&mut self, dst: u8, imm: i32) -> &mut Asm {
        self.push(0x57, dst, 0, 0, imm)
    }
    /// `dst <<= imm` (64-bit).
    pub fn lsh_imm(&mut self, dst: u8, imm: i32) -> &mut Asm {
        self.push(0x67, dst, 0, 0, imm)
    }
    /// `dst += src` (64-bit).
    pub fn add_reg(&mut self, dst: u8, src: u8) -> &mut Asm {
        self.push(0x0f, dst, src, 0, 0)
    }
    /// `dst -= src` (64-bit).
    pub fn sub_reg(&mut self, dst: u8, src: u8) -> &mut Asm {
        self.push(0x1f, dst, src, 0, 0)
    }
    pub fn call(&mut self, helper: i32) -> &mut Asm {
        self.push(0x85, 0, 0, 0, helper)
    }
    /// `if reg == 0 goto <label>`; returns the jump's index for [`Asm::label_here`].
    pub fn jeq_zero_fwd(&mut self, reg: u8) -> usize {
        self.push(0x15, reg, 0, 0, 0);
        self.insns.len() - 1
    }
    /// `if reg != 0 goto <label>`; returns the jump's index for [`Asm::label_here`].
    pub fn jne_zero_fwd(&mut self, reg: u8) -> usize {
        self.push(0x55, reg, 0, 0, 0);
        self.insns.len() - 1
    }
    /// `if (u32)reg < imm goto <label>` (a 32-bit compare: `imm` is not sign-extended);
    /// returns the jump's index for [`Asm::label_here`].
    pub fn jlt32_imm_fwd(&mut self, reg: u8, imm: u32) -> usize {
        self.push(0xa6, reg, 0, 0, imm as i32);
        self.insns.len() - 1
    }
    /// `if reg > imm goto <label>` (unsigned, 64-bit); returns the jump's index for
    /// [`Asm::label_here`].
    pub fn jgt_imm_fwd(&mut self, reg: u8, imm: i32) -> usize {
        self.push(0x25, reg, 0, 0, imm);
        self.insns.len() - 1
    }
    /// `goto <label>`; returns the jump's index for [`Asm::label_here`].
    pub fn ja_fwd(&mut self) -> usize {
        self.push(0x05, 0, 0, 0, 0);
        self.insns.len() - 1
    }
    /// Points the forward jump at index `jump` to the next instruction.
    pub fn label_here(&mut self, jump: usize) -> &mut Asm {
        let off = (self.insns.len() - jump - 1) as u64;
        self.insns[jump] = (self.insns[jump] & !(0xffff << 16)) | (off & 0xffff) << 16;
        self
    }
    /// `r0 = 0; exit`.
    pub fn exit_zero(&mut self) -> &mut Asm {
        self.exit_with(0)
    }
    /// `r0 = value; exit`.
    pub fn exit_with(&mut self, value: i32) -> &mut Asm {
        self.mov_imm(R0, value);
        self.push(0x95, 0, 0, 0, 0)
    }
    pub fn insns(&self) -> &[u64] {
        &self.insns
    }
}

/// `union bpf_attr` for BPF_PROG_LOAD, up to prog_name; the tail is zero (the kernel requires
/// unknown trailing bytes to be zero).
#[repr(C)]
struct ProgLoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    tail: [u8; 64],
}

/// `union bpf_attr` for BPF_MAP_CREATE, up to map_name.
#[repr(C)]
struct MapCreateAttr {
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    map_flags: u32,
    inner_map_fd: u32,
    numa_node: u32,
    map_name: [u8; 16],
    tail: [u8; 64],
}

/// `union bpf_attr` for BPF_RAW_TRACEPOINT_OPEN.
#[repr(C)]
struct RawTracepointOpenAttr {
    name: u64,
    prog_fd: u32,
    pad: u32,
    cookie: u64,
}

fn bpf<T>(cmd: libc::c_long, attr: &mut T) -> std::io::Result<OwnedFd> {
    // SAFETY: `attr` is a properly laid out bpf_attr prefix of the given size; every pointer
    // in it refers to memory that outlives the call.
    let fd = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr as *mut T, size_of::<T>()) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this new descriptor; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// A name for bpf(2): at most 15 bytes and a NUL.
fn object_name(name: &str) -> Result<[u8; 16]> {
    if name.len() > 15 {
        bail!("BPF object name {name:?} is longer than 15 bytes");
    }
    let mut out = [0u8; 16];
    out[..name.len()].copy_from_slice(name.as_bytes());
    Ok(out)
}

pub fn map_create(map_type: u32, value_size: u32, max_entries: u32, name: &str) -> Result<OwnedFd> {
    let key_size = if map_type == BPF_MAP_TYPE_RINGBUF {
        0
    } else {
        4
    };
    let mut attr = MapCreateAttr {
        map_type,
        key_size,
        value_size,
        max_entries,
        map_flags: 0,
        inner_map_fd: 0,
        numa_node: 0,
        map_name: object_name(name)?,
        tail: [0; 64],
    };
    bpf(BPF_MAP_CREATE, &mut attr).map_err(|e| anyhow::anyhow!("creating map {name}: {e}"))
}

/// Loads a raw tracepoint program (GPL: bpf_probe_read_kernel is GPL-only); on a verifier
/// rejection the error carries the verifier's log.
pub fn load_raw_tp(name: &str, asm: &Asm) -> Result<OwnedFd> {
    load_program(BPF_PROG_TYPE_RAW_TRACEPOINT, name, asm)
}

/// Loads a program of type `prog_type` ([`load_raw_tp`]'s license and verifier log).
pub fn load_program(prog_type: u32, name: &str, asm: &Asm) -> Result<OwnedFd> {
    let license = c"GPL";
    let mut log = vec![0u8; 64 * 1024];
    let mut attr = ProgLoadAttr {
        prog_type,
        insn_cnt: asm.insns().len() as u32,
        insns: asm.insns().as_ptr() as u64,
        license: license.as_ptr() as u64,
        log_level: 0,
        log_size: 0,
        log_buf: 0,
        kern_version: 0,
        prog_flags: 0,
        prog_name: object_name(name)?,
        tail: [0; 64],
    };
    if let Ok(fd) = bpf(BPF_PROG_LOAD, &mut attr) {
        return Ok(fd);
    }
    // Load again with the log on only to explain the failure (a log costs nothing otherwise).
    attr.log_level = 1;
    attr.log_size = log.len() as u32;
    attr.log_buf = log.as_mut_ptr() as u64;
    let err = bpf(BPF_PROG_LOAD, &mut attr).err();
    let text = String::from_utf8_lossy(&log);
    bail!(
        "loading BPF program {name}: {err:?}\n{}",
        text.trim_end_matches('\0')
    )
}

/// Attaches `program` to raw tracepoint `tracepoint`; closing the returned link detaches it.
pub fn attach_raw_tp(program: &OwnedFd, tracepoint: &str) -> Result<OwnedFd> {
    let tp = std::ffi::CString::new(tracepoint)?;
    let mut open = RawTracepointOpenAttr {
        name: tp.as_ptr() as u64,
        prog_fd: program.as_raw_fd() as u32,
        pad: 0,
        cookie: 0,
    };
    bpf(BPF_RAW_TRACEPOINT_OPEN, &mut open)
        .map_err(|e| anyhow::anyhow!("attaching to raw tracepoint {tracepoint}: {e}"))
}

/// `union bpf_attr` for BPF_LINK_CREATE, up to flags; the tail (the per-type union) is zero.
#[repr(C)]
struct LinkCreateAttr {
    prog_fd: u32,
    target_ifindex: u32,
    attach_type: u32,
    flags: u32,
    tail: [u8; 48],
}

/// Attaches XDP `program` to the device `ifindex` of the calling thread's network namespace
/// (the kernel picks the driver's native hook where there is one); closing the returned link
/// detaches it, and so does the process's exit.
pub fn attach_xdp(program: &OwnedFd, ifindex: u32) -> Result<OwnedFd> {
    let mut attr = LinkCreateAttr {
        prog_fd: program.as_raw_fd() as u32,
        target_ifindex: ifindex,
        attach_type: BPF_XDP,
        flags: 0,
        tail: [0; 48],
    };
    bpf(BPF_LINK_CREATE, &mut attr)
        .map_err(|e| anyhow::anyhow!("attaching XDP to interface {ifindex}: {e}"))
}

/// A BPF ring buffer that userspace only drains (moves the consumer position up to the
/// producer's) so that reservations keep succeeding; nothing is read.
pub struct RingDrain {
    pub map: OwnedFd,
    bytes: u64,
    consumer: *mut u64,
    producer: *const u64,
    page: usize,
    /// Highest number of unconsumed bytes seen at a drain.
    max_backlog: std::sync::atomic::AtomicU64,
}

impl RingDrain {
    pub fn new(bytes: u32, name: &str) -> Result<RingDrain> {
        let map = map_create(BPF_MAP_TYPE_RINGBUF, 0, bytes, name)?;
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
        let fd = map.as_raw_fd();
        let prot = libc::PROT_READ | libc::PROT_WRITE;
        // The ring's first page holds the consumer position (writable), the second the
        // producer position (read-only) (kernel/bpf/ringbuf.c).
        // SAFETY: mapping the ring's own control pages; checked for MAP_FAILED below.
        let consumer =
            unsafe { libc::mmap(std::ptr::null_mut(), page, prot, libc::MAP_SHARED, fd, 0) };
        // SAFETY: as above.
        let producer = unsafe {
            let off = page as libc::off_t;
            libc::mmap(
                std::ptr::null_mut(),
                page,
                libc::PROT_READ,
                libc::MAP_SHARED,
                fd,
                off,
            )
        };
        if consumer == libc::MAP_FAILED || producer == libc::MAP_FAILED {
            bail!("mmap of ring {name}: {}", std::io::Error::last_os_error());
        }
        Ok(RingDrain {
            map,
            bytes: u64::from(bytes),
            consumer: consumer.cast(),
            producer: producer.cast(),
            page,
            max_backlog: 0.into(),
        })
    }

    /// Consumes everything produced so far; returns whether the ring may have been full.
    /// Several threads may drain at once: the consumer position only ever moves forward.
    pub fn drain(&self) -> bool {
        use std::sync::atomic::{AtomicU64, Ordering};
        // SAFETY: both positions are 8-byte aligned u64s at the start of mapped pages that
        // live as long as `self`; the kernel updates them atomically.
        let (prod, cons) = unsafe {
            (
                AtomicU64::from_ptr(self.producer.cast_mut()),
                AtomicU64::from_ptr(self.consumer),
            )
        };
        let p = prod.load(Ordering::Acquire);
        let backlog = p.saturating_sub(cons.fetch_max(p, Ordering::AcqRel));
        self.max_backlog.fetch_max(backlog, Ordering::Relaxed);
        // A reservation fails once the next record would not fit; 4 KiB covers any record
        // the benchmark writes.
        backlog + 4096 > self.bytes
    }

    pub fn max_backlog(&self) -> u64 {
        self.max_backlog.load(std::sync::atomic::Ordering::Relaxed)
    }
}

// SAFETY: the two pointers refer to this ring's own mappings, valid until drop wherever the
// value lives; they are only accessed atomically (drain).
unsafe impl Send for RingDrain {}
// SAFETY: as above.
unsafe impl Sync for RingDrain {}

impl Drop for RingDrain {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly the two pages mapped in `new`.
        unsafe {
            libc::munmap(self.consumer.cast(), self.page);
            libc::munmap(self.producer.cast_mut().cast(), self.page);
        }
    }
}
