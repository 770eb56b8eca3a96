//! The live [`PhcReader`]: PTP_SYS_OFFSET_EXTENDED on `/dev/ptpN`, opened read-only before the
//! recorder drops its capabilities (the ioctl needs none on an open descriptor).

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;

use super::phc::{PhcReader, Reading, Triple};
use crate::schema::PhcSysClock;

/// PTP_MAX_SAMPLES of include/uapi/linux/ptp_clock.h.
const PTP_MAX_SAMPLES: usize = 25;

/// `struct ptp_clock_time`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct PtpClockTime {
    sec: i64,
    nsec: u32,
    reserved: u32,
}

/// `struct ptp_sys_offset_extended` (6.11+ layout; before, `clockid` was `rsv[0]`, which had
/// to be 0 = CLOCK_REALTIME, so the same struct serves both).
#[repr(C)]
struct PtpSysOffsetExtended {
    n_samples: u32,
    clockid: libc::clockid_t,
    rsv: [u32; 2],
    ts: [[PtpClockTime; 3]; PTP_MAX_SAMPLES],
}

/// `_IOWR('=', 9, struct ptp_sys_offset_extended)`.
const PTP_SYS_OFFSET_EXTENDED: libc::c_ulong = (3 << 30)
    | ((std::mem::size_of::<PtpSysOffsetExtended>() as libc::c_ulong) << 16)
    | ((b'=' as libc::c_ulong) << 8)
    | 9;

fn ns(t: PtpClockTime) -> u64 {
    (t.sec as u64).wrapping_mul(1_000_000_000) + u64::from(t.nsec)
}

/// An open `/dev/ptpN`.
pub struct LivePhc {
    file: File,
    /// Set after the kernel refused CLOCK_MONOTONIC (EINVAL, before 6.11): read realtime.
    realtime_only: bool,
}

impl LivePhc {
    pub fn open(index: u32) -> io::Result<Self> {
        let file = File::options()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(format!("/dev/ptp{index}"))?;
        Ok(Self {
            file,
            realtime_only: false,
        })
    }

    fn ioctl(&self, samples: u32, clock: libc::clockid_t) -> io::Result<Vec<Triple>> {
        let mut req = PtpSysOffsetExtended {
            n_samples: samples.min(PTP_MAX_SAMPLES as u32),
            clockid: clock,
            rsv: [0; 2],
            ts: [[PtpClockTime::default(); 3]; PTP_MAX_SAMPLES],
        };
        // SAFETY: `req` is a live struct of the size encoded in the request number.
        let rc = unsafe { libc::ioctl(self.file.as_raw_fd(), PTP_SYS_OFFSET_EXTENDED, &mut req) };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(req.ts[..req.n_samples as usize]
            .iter()
            .map(|t| Triple {
                before_ns: ns(t[0]),
                phc_ns: ns(t[1]),
                after_ns: ns(t[2]),
            })
            .collect())
    }
}

/// CLOCK_REALTIME - CLOCK_MONOTONIC from a REALTIME read between two MONOTONIC reads, and the
/// bracket of those.
fn realtime_offset() -> (i128, u64) {
    let read = |clock| {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: valid out-pointer; both clocks exist on every kernel this runs on.
        unsafe { libc::clock_gettime(clock, &mut ts) };
        ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
    };
    let before = read(libc::CLOCK_MONOTONIC);
    let realtime = read(libc::CLOCK_REALTIME);
    let after = read(libc::CLOCK_MONOTONIC);
    let middle = before + (after - before) / 2;
    (i128::from(realtime) - i128::from(middle), after - before)
}

impl PhcReader for LivePhc {
    fn read(&mut self, samples: u32) -> io::Result<Reading> {
        if !self.realtime_only {
            match self.ioctl(samples, libc::CLOCK_MONOTONIC) {
                Ok(triples) => {
                    return Ok(Reading {
                        sys_clock: PhcSysClock::Monotonic,
                        triples,
                        realtime_offset_ns: 0,
                        offset_bracket_ns: 0,
                    });
                }
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => self.realtime_only = true,
                Err(e) => return Err(e),
            }
        }
        let triples = self.ioctl(samples, libc::CLOCK_REALTIME)?;
        let (offset, bracket) = realtime_offset();
        Ok(Reading {
            sys_clock: PhcSysClock::RealtimeConverted,
            triples,
            realtime_offset_ns: offset,
            offset_bracket_ns: bracket,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uapi_layout_and_request_number() {
        // include/uapi/linux/ptp_clock.h: 16-byte clock times, 16-byte head, 25 x 3 times.
        assert_eq!(std::mem::size_of::<PtpClockTime>(), 16);
        assert_eq!(std::mem::size_of::<PtpSysOffsetExtended>(), 1216);
        assert_eq!(PTP_SYS_OFFSET_EXTENDED, 0xc4c0_3d09);
    }

    #[test]
    fn realtime_offset_is_bracketed() {
        let (offset, bracket) = realtime_offset();
        assert!(bracket < 1_000_000, "bracket {bracket} ns");
        // REALTIME is after 2020 while MONOTONIC counts from boot (less than a few years).
        assert!(offset > 1_500_000_000_000_000_000, "{offset}");
    }

    #[test]
    fn a_missing_clock_is_an_error_not_a_panic() {
        // No machine here has a PHC with this index.
        let e = LivePhc::open(4095).err().expect("no /dev/ptp4095");
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
    }
}
