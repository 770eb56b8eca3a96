//! `record --hw-timestamps`: the NIC clocks (PHCs) read against CLOCK_MONOTONIC with every
//! clock record, so a hardware stamp (NIC-clock time) can be placed on the node's monotonic
//! clock. A PHC runs free of the system clock (its own oscillator, or disciplined by ptp4l to
//! another machine's), so one offset at start-up is not enough: it is sampled all along.
//!
//! The reading is PTP_SYS_OFFSET_EXTENDED (include/uapi/linux/ptp_clock.h): the driver reads
//! the system clock, the PHC, the system clock, `n_samples` times, as close together as it
//! can. The tightest triple wins. Since 6.11 the caller picks the system clock
//! (`clockid`: CLOCK_MONOTONIC here); older kernels refuse a non-zero `clockid` (it was a
//! reserved word) and read CLOCK_REALTIME, converted through a REALTIME/MONOTONIC pair.
//!
//! The ioctl sits behind [`PhcReader`] so the choice of sample and the conversion are proven
//! on a fake clock: no machine this project runs on has a PHC (virtio has none).

use std::io;

use crate::schema::{DeviceContext, HwTimestampsOutcome, NicClockSample, PhcSysClock};

/// Triples per reading: enough to find an uninterrupted one, far below the kernel's 25.
pub const SAMPLES_PER_READING: u32 = 5;

/// One (system clock before, PHC, system clock after) triple, ns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Triple {
    pub before_ns: u64,
    pub phc_ns: u64,
    pub after_ns: u64,
}

/// What one PTP_SYS_OFFSET_EXTENDED call returned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reading {
    pub sys_clock: PhcSysClock,
    pub triples: Vec<Triple>,
    /// For `RealtimeConverted`: CLOCK_REALTIME minus CLOCK_MONOTONIC right after the call,
    /// and the bracket of that pair (ns); `(0, 0)` for `Monotonic`.
    pub realtime_offset_ns: i128,
    pub offset_bracket_ns: u64,
}

/// A PHC that can be read against the system clock.
pub trait PhcReader {
    fn read(&mut self, samples: u32) -> io::Result<Reading>;
}

/// The sample of `reading` for the clock record: its tightest triple, on CLOCK_MONOTONIC.
/// `None` when the reading holds no usable triple (none, or one whose clocks ran backwards).
pub fn best_sample(dev: &str, phc_index: u32, reading: &Reading) -> Option<NicClockSample> {
    let best = reading
        .triples
        .iter()
        .filter(|t| t.after_ns >= t.before_ns)
        .min_by_key(|t| t.after_ns - t.before_ns)?;
    let window = best.after_ns - best.before_ns;
    let middle = i128::from(best.before_ns + window / 2);
    let monotonic = u64::try_from(middle - reading.realtime_offset_ns).ok()?;
    Some(NicClockSample {
        dev: dev.to_owned(),
        phc_index,
        phc_ns: best.phc_ns,
        monotonic_ns: monotonic,
        window_ns: window + reading.offset_bracket_ns,
        sys_clock: reading.sys_clock,
    })
}

/// The PHCs of the traced devices, read at every clock record.
pub struct PhcSampler {
    clocks: Vec<Phc>,
}

struct Phc {
    dev: String,
    index: u32,
    reader: Box<dyn PhcReader>,
    /// A failed reading is reported once per device, not once per clock record.
    warned: bool,
}

impl PhcSampler {
    /// Opens, with `open`, the PHC of every device `--hw-timestamps` switched on. A device
    /// without a PHC, or whose PHC does not open, is reported and skipped. `None` when no PHC
    /// is left.
    pub fn open(
        devices: &[DeviceContext],
        mut open: impl FnMut(u32) -> io::Result<Box<dyn PhcReader>>,
    ) -> Option<Self> {
        let mut clocks = Vec::new();
        for ctx in devices.iter().filter(|c| stamps_in_hardware(c)) {
            let Some(index) = ctx.timestamping.as_ref().and_then(|t| t.phc_index) else {
                log::warn!(
                    "--hw-timestamps: {} has no NIC clock (PHC): its hardware stamps cannot be \
                     placed on the system clock",
                    ctx.dev
                );
                continue;
            };
            match open(index) {
                Ok(reader) => clocks.push(Phc {
                    dev: ctx.dev.clone(),
                    index,
                    reader,
                    warned: false,
                }),
                Err(e) => log::warn!("--hw-timestamps: {}: /dev/ptp{index}: {e}", ctx.dev),
            }
        }
        (!clocks.is_empty()).then_some(Self { clocks })
    }

    /// One sample per PHC that could be read now.
    pub fn sample(&mut self) -> Vec<NicClockSample> {
        let mut out = Vec::with_capacity(self.clocks.len());
        for phc in &mut self.clocks {
            let sample = phc.reader.read(SAMPLES_PER_READING).and_then(|r| {
                best_sample(&phc.dev, phc.index, &r)
                    .ok_or_else(|| io::Error::other("no triple with ordered system clocks"))
            });
            match sample {
                Ok(s) => out.push(s),
                Err(e) if !phc.warned => {
                    phc.warned = true;
                    log::warn!(
                        "--hw-timestamps: {}: reading /dev/ptp{} failed ({e}); clock records \
                         lack it while it fails",
                        phc.dev,
                        phc.index
                    );
                }
                Err(_) => {}
            }
        }
        out
    }
}

/// Whether `record --hw-timestamps` switched `ctx`'s hardware stamping on (a device left
/// alone stamps nothing this recording asked for).
fn stamps_in_hardware(ctx: &DeviceContext) -> bool {
    ctx.hw_timestamps
        .as_ref()
        .is_some_and(|h| h.outcome == HwTimestampsOutcome::SwitchedOn)
}

#[cfg(test)]
#[path = "phc_tests.rs"]
mod tests;
