//! Placing a NIC's hardware stamps (its PHC's time: the `aux` of `tx_tstamp_hw`) on the node's
//! CLOCK_MONOTONIC through the `nic_clocks` of its clock records (`record --hw-timestamps`).
//!
//! A PHC and the system clock run at rates a few ppm apart (ptp4l may even steer the PHC to
//! another machine), so a stamp between two samples is interpolated along the line through
//! them, and one outside every pair is moved by the nearest sample's offset. The bound is the
//! readings' (half their windows); what the clocks did between two samples is not in it.
//!
//! A stamp does not say which device stamped it, so only a node with exactly one NIC clock
//! has its stamps placed; with more, they stay where the kernel reported them.

use crate::schema::NicClockSample;

/// [`super::event::Stamp::sample`] of a hardware stamp placed through a NIC clock: a space of
/// its own above every userland clock sample's index, so no two stamps converted through
/// different clocks look like one clock to the error bound.
pub const NIC_SAMPLE_BASE: u32 = 1 << 31;

/// A hardware stamp on the node's monotonic clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OnMonotonic {
    pub ns: u64,
    pub error_ns: u64,
    /// The Stamp's `sample`: [`NIC_SAMPLE_BASE`] + the index of the nearest NIC-clock sample.
    pub sample: u32,
}

/// One node's NIC-clock samples, sorted by PHC time once all are in.
#[derive(Debug, Default, Clone)]
pub struct NicClockMap {
    samples: Vec<NicClockSample>,
    /// Set by [`Self::seal`]: the samples are of exactly one NIC clock, so stamps can be placed.
    one_clock: bool,
}

impl NicClockMap {
    pub fn extend(&mut self, samples: impl IntoIterator<Item = NicClockSample>) {
        self.samples.extend(samples);
    }

    /// Sorts by PHC time and decides whether stamps can be placed; call once after every
    /// sample is in (not per stamp: a long recording has thousands of samples).
    pub fn seal(&mut self) {
        self.samples.sort_by_key(|s| s.phc_ns);
        self.one_clock = self
            .samples
            .first()
            .is_some_and(|first| self.samples.iter().all(|s| s.phc_index == first.phc_index));
    }

    /// Whether hardware stamps are placed on the monotonic clock ([`Self::to_monotonic`] can
    /// answer): exactly one NIC clock was sampled.
    pub fn places_stamps(&self) -> bool {
        self.one_clock
    }

    /// `phc_ns` on the monotonic clock, or `None` (no NIC clock, or several).
    pub fn to_monotonic(&self, phc_ns: u64) -> Option<OnMonotonic> {
        if !self.one_clock {
            return None;
        }
        let pos = self.samples.partition_point(|s| s.phc_ns <= phc_ns);
        let before = pos.checked_sub(1).map(|i| (i, &self.samples[i]));
        let after = self.samples.get(pos).map(|s| (pos, s));
        let (ns, error_ns, nearest) = match (before, after) {
            (Some((i, a)), Some((j, b))) if b.phc_ns > a.phc_ns => {
                let nearest = if phc_ns - a.phc_ns <= b.phc_ns - phc_ns {
                    i
                } else {
                    j
                };
                let error = a.window_ns.max(b.window_ns).div_ceil(2);
                (interpolate(a, b, phc_ns)?, error, nearest)
            }
            (Some((i, s)), _) | (None, Some((i, s))) => {
                let ns = i128::from(s.monotonic_ns) + i128::from(phc_ns) - i128::from(s.phc_ns);
                (u64::try_from(ns).ok()?, s.window_ns.div_ceil(2), i)
            }
            (None, None) => return None,
        };
        Some(OnMonotonic {
            ns,
            error_ns,
            sample: NIC_SAMPLE_BASE | u32::try_from(nearest).ok()?,
        })
    }
}

/// `phc_ns` on the line through `a` and `b` (`a.phc_ns <= phc_ns < b.phc_ns`).
fn interpolate(a: &NicClockSample, b: &NicClockSample, phc_ns: u64) -> Option<u64> {
    let (pa, pb) = (i128::from(a.phc_ns), i128::from(b.phc_ns));
    let (ma, mb) = (i128::from(a.monotonic_ns), i128::from(b.monotonic_ns));
    let ns = ma + (i128::from(phc_ns) - pa) * (mb - ma) / (pb - pa);
    u64::try_from(ns).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::PhcSysClock;

    fn sample(phc_index: u32, phc_ns: u64, monotonic_ns: u64, window_ns: u64) -> NicClockSample {
        NicClockSample {
            dev: "eth0".into(),
            phc_index,
            phc_ns,
            monotonic_ns,
            window_ns,
            sys_clock: PhcSysClock::Monotonic,
        }
    }

    fn map(samples: Vec<NicClockSample>) -> NicClockMap {
        let mut m = NicClockMap::default();
        m.extend(samples);
        m.seal();
        m
    }

    #[test]
    fn between_samples_the_stamp_is_interpolated() {
        // The PHC runs 100 ppm fast: 1 s of monotonic time is 1.0001 s of PHC time.
        let m = map(vec![
            sample(0, 6_000_100_000, 2_000_000_000, 300),
            sample(0, 5_000_000_000, 1_000_000_000, 200),
        ]);
        let mid = m.to_monotonic(5_500_050_000).expect("placed");
        assert_eq!(mid.ns, 1_500_000_000);
        assert_eq!(mid.error_ns, 150, "the wider of the two windows, halved");
        // Nearest sample: the first (sorted by PHC time, index 0).
        assert_eq!(mid.sample, NIC_SAMPLE_BASE);
    }

    #[test]
    fn outside_the_samples_the_nearest_offset_moves_it() {
        let m = map(vec![
            sample(0, 5_000_000_000, 1_000_000_000, 200),
            sample(0, 6_000_100_000, 2_000_000_000, 301),
        ]);
        let late = m.to_monotonic(6_000_100_400).expect("placed");
        assert_eq!((late.ns, late.error_ns), (2_000_000_400, 151));
        assert_eq!(late.sample, NIC_SAMPLE_BASE | 1);
        let early = m.to_monotonic(4_999_999_000).expect("placed");
        assert_eq!((early.ns, early.error_ns), (999_999_000, 100));
    }

    #[test]
    fn no_clock_or_several_clocks_place_nothing() {
        assert_eq!(NicClockMap::default().to_monotonic(1), None);
        let two = map(vec![
            sample(0, 5_000_000_000, 1_000_000_000, 200),
            sample(1, 9_000_000_000, 1_000_000_000, 200),
        ]);
        assert_eq!(two.to_monotonic(5_000_000_000), None);
    }
}
