//! Converting userland timestamps (declared realtime, tai, boottime or monotonic) to their
//! node's CLOCK_MONOTONIC through the node's clock samples (startup record + periodic `clock`
//! records), with the conversion's error bound.
//!
//! A sample holds all four clocks read back to back; `monotonic_ns` is the midpoint of two
//! MONOTONIC reads that bracket the others, so each other clock was read within
//! `bracket_ns / 2` (rounded up) of it. A timestamp converts through the sample nearest to it
//! in its own clock (offsets drift with NTP slew; the nearest sample has the least drift).

use crate::schema::{ClockId, ClockSample};

use super::event::{Origin, Place, Stamp};
use super::nic_clock::NicClockMap;
use super::time::{NodeId, NodeTime};

/// A userland timestamp converted to node monotonic time, with its error bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Converted {
    pub time: NodeTime,
    pub error_ns: u64,
    /// Index of the clock sample used (`u32::MAX` for monotonic input, which needs none).
    pub sample: u32,
}

impl Converted {
    /// The stamp of a probe point at this time (probes have no kernel [`Place`]).
    pub fn stamp(self, origin: Origin) -> Stamp {
        Stamp {
            time: self.time,
            error_ns: self.error_ns,
            sample: self.sample,
            origin,
            place: Place::default(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClockError {
    #[error(
        "no clock samples for this node: its kernel recording (startup/clock records) is needed to convert a `{0:?}` timestamp"
    )]
    NoSamples(ClockId),
    #[error("timestamp {ts_ns} in {clock:?} converts to before the node's monotonic zero")]
    OutOfRange { clock: ClockId, ts_ns: u64 },
}

/// One node's clock samples, kept sorted per clock for nearest-sample lookup.
#[derive(Debug, Default, Clone)]
pub struct ClockTable {
    samples: Vec<ClockSample>,
    /// Per declared clock (realtime, tai, boottime): sample indices sorted by that clock.
    sorted: [Vec<usize>; 3],
    nic: NicClockMap,
}

fn reading(s: &ClockSample, clock: ClockId) -> u64 {
    match clock {
        ClockId::Realtime => s.realtime_ns,
        ClockId::Tai => s.tai_ns,
        ClockId::Boottime => s.boottime_ns,
        ClockId::Monotonic => s.monotonic_ns,
    }
}

const NON_MONOTONIC: [ClockId; 3] = [ClockId::Realtime, ClockId::Tai, ClockId::Boottime];

impl ClockTable {
    pub fn push(&mut self, mut sample: ClockSample) {
        self.nic.extend(std::mem::take(&mut sample.nic_clocks));
        self.samples.push(sample);
    }

    /// The node's NIC clocks (`record --hw-timestamps`), sealed with the table.
    pub fn nic(&self) -> &NicClockMap {
        &self.nic
    }

    /// Sorts the per-clock indices; call once after all samples are pushed.
    pub fn seal(&mut self) {
        self.nic.seal();
        for (slot, clock) in NON_MONOTONIC.iter().enumerate() {
            let mut idx: Vec<usize> = (0..self.samples.len()).collect();
            idx.sort_by_key(|&i| reading(&self.samples[i], *clock));
            self.sorted[slot] = idx;
        }
    }

    /// Converts `ts_ns` declared in `clock` to `node`'s monotonic time.
    pub fn to_monotonic(
        &self,
        node: NodeId,
        clock: ClockId,
        ts_ns: u64,
    ) -> Result<Converted, ClockError> {
        if clock == ClockId::Monotonic {
            return Ok(Converted {
                time: NodeTime::new(node, ts_ns),
                error_ns: 0,
                sample: u32::MAX,
            });
        }
        let slot = NON_MONOTONIC
            .iter()
            .position(|c| *c == clock)
            .expect("non-monotonic clock");
        let order = &self.sorted[slot];
        if order.is_empty() {
            return Err(ClockError::NoSamples(clock));
        }
        // Nearest sample in the declared clock: the neighbours around the insertion point.
        let pos = order.partition_point(|&i| reading(&self.samples[i], clock) <= ts_ns);
        let candidates = [pos.checked_sub(1), (pos < order.len()).then_some(pos)];
        let nearest_index = candidates
            .into_iter()
            .flatten()
            .map(|p| order[p])
            .min_by_key(|&i| reading(&self.samples[i], clock).abs_diff(ts_ns))
            .expect("at least one sample");
        let nearest = &self.samples[nearest_index];
        let mono = i128::from(ts_ns) - i128::from(reading(nearest, clock))
            + i128::from(nearest.monotonic_ns);
        let mono = u64::try_from(mono).map_err(|_| ClockError::OutOfRange { clock, ts_ns })?;
        Ok(Converted {
            time: NodeTime::new(node, mono),
            error_ns: nearest.bracket_ns.div_ceil(2),
            sample: nearest_index as u32,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(rt: u64, mono: u64, bracket: u64) -> ClockSample {
        ClockSample {
            node: None,
            realtime_ns: rt,
            monotonic_ns: mono,
            tai_ns: rt + 37_000_000_000,
            boottime_ns: mono + 5,
            bracket_ns: bracket,
            nic_clocks: Vec::new(),
        }
    }

    #[test]
    fn converts_through_the_nearest_sample_and_carries_its_bracket() {
        let mut t = ClockTable::default();
        // The realtime-monotonic offset steps by 1000 ns between the samples (NTP slew).
        t.push(sample(1_000_000_000, 1_000, 40));
        t.push(sample(2_000_000_000, 1_000_001_000 + 1_000, 61));
        t.seal();
        let n = NodeId(0);
        let early = t.to_monotonic(n, ClockId::Realtime, 1_200_000_000).unwrap();
        assert_eq!(early.time.absolute_ns(), 200_001_000);
        assert_eq!(early.error_ns, 20);
        let late = t.to_monotonic(n, ClockId::Realtime, 1_900_000_000).unwrap();
        assert_eq!(late.time.absolute_ns(), 900_002_000);
        assert_eq!(late.error_ns, 31);
        let tai = t
            .to_monotonic(n, ClockId::Tai, 37_000_000_000 + 1_000_000_100)
            .unwrap();
        assert_eq!(tai.time.absolute_ns(), 1_100);
        let boot = t.to_monotonic(n, ClockId::Boottime, 1_005).unwrap();
        assert_eq!(boot.time.absolute_ns(), 1_000);
    }

    #[test]
    fn monotonic_passes_through_and_missing_samples_are_an_error() {
        let t = ClockTable::default();
        let m = t.to_monotonic(NodeId(2), ClockId::Monotonic, 77).unwrap();
        assert_eq!((m.time.absolute_ns(), m.error_ns), (77, 0));
        assert_eq!(
            t.to_monotonic(NodeId(2), ClockId::Realtime, 77),
            Err(ClockError::NoSamples(ClockId::Realtime))
        );
    }
}
