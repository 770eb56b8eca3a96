//! A kernel-only turn's RX stages, kept compactly until the turn finishes.
//!
//! A turn cannot look its RX stages up when it finishes: the index evicts RX events a window
//! after they happen, and a turn finishes a window after its last send. So the stages found at
//! its last recv are kept, for every turn of a window: at the dense capture's peak these were
//! 110 MiB of the merge's heap (round 41 of docs/benchmarks-merge-ab.md), 11 [`Point`]s of 64
//! bytes per turn, each with a whole [`Stamp`]. Kernel stamps carry no clock-conversion error
//! or sample, and an absent stage needs only its expected bit: [`StoredStages`] keeps the
//! observed stamps' time, origin and place (40 bytes each) and two bit sets. Stages it cannot
//! hold so (a NIC-clock time with its error, a point of another owner, another list of ids)
//! are kept whole. Peak RSS of the dense capture's merge -9 to -11 % (round 44).

use super::chain::{Point, RX_KERNEL, Stages};
use super::event::{Origin, Place, Stamp};
use super::reader::ReaderTimeline;
use super::time::{NodeId, NodeTime};

/// [`Stages`] of [`RX_KERNEL`], stored; [`StoredStages::expand`] gives them back unchanged.
pub(crate) enum StoredStages {
    Compact(CompactStages),
    Whole(Box<Stages>),
}

pub(crate) struct CompactStages {
    /// The observed points' stamps, in [`RX_KERNEL`] order.
    stamps: Box<[KernelStamp]>,
    /// Bit `i`: `RX_KERNEL[i]` was observed (its stamp is the next one in `stamps`).
    observed: u16,
    /// Bit `i`: `RX_KERNEL[i]` is expected.
    expected: u16,
    retransmitted: bool,
    stale_context: bool,
    reader: Option<ReaderTimeline>,
    thread: Option<u32>,
}

/// A [`Stamp`] without error and sample (both at their "none" values in kernel events).
#[derive(Clone, Copy)]
struct KernelStamp {
    ns: u64,
    line: u64,
    place: Place,
    file: u16,
    node: NodeId,
}

const _: () = assert!(RX_KERNEL.len() <= u16::BITS as usize);
const _: () = assert!(std::mem::size_of::<KernelStamp>() == 40);

impl KernelStamp {
    fn of(stamp: &Stamp) -> Option<KernelStamp> {
        (stamp.error_ns == 0 && stamp.sample == u32::MAX).then_some(KernelStamp {
            ns: stamp.time.absolute_ns(),
            line: stamp.origin.line,
            place: stamp.place,
            file: stamp.origin.file,
            node: stamp.time.node(),
        })
    }

    fn stamp(self) -> Stamp {
        Stamp {
            time: NodeTime::new(self.node, self.ns),
            error_ns: 0,
            sample: u32::MAX,
            origin: Origin {
                file: self.file,
                line: self.line,
            },
            place: self.place,
        }
    }
}

impl StoredStages {
    pub fn store(stages: Stages) -> StoredStages {
        match CompactStages::of(&stages) {
            Some((stamps, observed, expected)) => StoredStages::Compact(CompactStages {
                stamps,
                observed,
                expected,
                retransmitted: stages.retransmitted,
                stale_context: stages.stale_context,
                reader: stages.reader,
                thread: stages.thread,
            }),
            None => StoredStages::Whole(Box::new(stages)),
        }
    }

    pub fn expand(self) -> Stages {
        let c = match self {
            StoredStages::Compact(c) => c,
            StoredStages::Whole(stages) => return *stages,
        };
        let mut stamps = c.stamps.iter();
        let bit = |set: u16, i: usize| set >> i & 1 == 1;
        let points = RX_KERNEL
            .iter()
            .enumerate()
            .map(|(i, &id)| Point {
                id,
                stamp: bit(c.observed, i).then(|| {
                    let s = stamps.next().expect("a stamp per observed bit");
                    s.stamp()
                }),
                expected: bit(c.expected, i),
                owner: 0,
            })
            .collect();
        Stages {
            points,
            retransmitted: c.retransmitted,
            stale_context: c.stale_context,
            reader: c.reader,
            thread: c.thread,
        }
    }
}

impl CompactStages {
    /// The observed stamps and the two bit sets, if every point fits the compact form.
    fn of(stages: &Stages) -> Option<(Box<[KernelStamp]>, u16, u16)> {
        if stages.points.len() != RX_KERNEL.len() {
            return None;
        }
        let (mut observed, mut expected) = (0u16, 0u16);
        // Exactly as many as are observed: the box then takes the vector's buffer as it is
        // (a larger capacity would be copied into a smaller one, on every recv).
        let observed_count = stages.points.iter().filter(|p| p.stamp.is_some()).count();
        let mut stamps = Vec::with_capacity(observed_count);
        for (i, (point, &id)) in stages.points.iter().zip(&RX_KERNEL).enumerate() {
            if point.id != id || point.owner != 0 {
                return None;
            }
            expected |= u16::from(point.expected) << i;
            if let Some(stamp) = &point.stamp {
                stamps.push(KernelStamp::of(stamp)?);
                observed |= 1 << i;
            }
        }
        Some((stamps.into_boxed_slice(), observed, expected))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::merge::chunked::tests::Rng;
    use crate::merge::segments::ReaderState;

    fn kernel_stamp(rng: &mut Rng) -> Stamp {
        let some = |rng: &mut Rng, v: u64| (rng.below(2) == 1).then_some(v as u32);
        let cpu = rng.below(64);
        Stamp {
            time: NodeTime::new(NodeId(rng.below(3) as u16), rng.below(1 << 40)),
            error_ns: 0,
            sample: u32::MAX,
            origin: Origin {
                file: rng.below(4) as u16,
                line: rng.below(1 << 30),
            },
            place: Place::new(some(rng, cpu), some(rng, 7), some(rng, 3), some(rng, 40)),
        }
    }

    fn random_stages(rng: &mut Rng) -> Stages {
        let points = RX_KERNEL
            .iter()
            .map(|&id| Point {
                id,
                stamp: (rng.below(3) > 0).then(|| kernel_stamp(rng)),
                expected: rng.below(2) == 1,
                owner: 0,
            })
            .collect();
        Stages {
            points,
            retransmitted: rng.below(2) == 1,
            stale_context: rng.below(2) == 1,
            reader: (rng.below(2) == 1).then(|| ReaderTimeline {
                ready_ns: rng.below(1000),
                states: vec![(rng.below(1000), ReaderState::Runnable)],
            }),
            thread: (rng.below(2) == 1).then(|| rng.below(1 << 20) as u32),
        }
    }

    /// Stores a copy of `stages`, checks it came back unchanged; whether it was compact.
    fn stored_compact(stages: &Stages) -> bool {
        let copy = Stages {
            points: stages.points.clone(),
            reader: stages.reader.clone(),
            ..*stages
        };
        let stored = StoredStages::store(copy);
        let compact = matches!(stored, StoredStages::Compact(_));
        let got = stored.expand();
        assert_eq!(got.points, stages.points);
        assert_eq!(got.retransmitted, stages.retransmitted);
        assert_eq!(got.stale_context, stages.stale_context);
        assert_eq!(got.reader, stages.reader);
        assert_eq!(got.thread, stages.thread);
        compact
    }

    #[test]
    fn kernel_stages_come_back_unchanged_from_the_compact_form() {
        let mut rng = Rng(0x5eed_57a6);
        for _ in 0..500 {
            assert!(stored_compact(&random_stages(&mut rng)));
        }
        assert!(stored_compact(&Stages::absent(&RX_KERNEL)));
    }

    /// A NIC-clock time (its conversion error and clock sample) or a point of another owner
    /// does not fit the compact form: those stages are kept whole, and come back unchanged.
    #[test]
    fn stages_the_compact_form_cannot_hold_are_kept_whole() {
        let mut rng = Rng(0x0dd_57a6);
        let with_error = |rng: &mut Rng| {
            let mut stages = random_stages(rng);
            let mut stamp = kernel_stamp(rng);
            (stamp.error_ns, stamp.sample) = (250, 3);
            stages.points[0].stamp = Some(stamp);
            stages
        };
        let owned = |rng: &mut Rng| {
            let mut stages = random_stages(rng);
            stages.points[4].owner = 1;
            stages
        };
        let short = |rng: &mut Rng| {
            let mut stages = random_stages(rng);
            stages.points.pop();
            stages
        };
        let makers: [fn(&mut Rng) -> Stages; 3] = [with_error, owned, short];
        for make in makers {
            assert!(!stored_compact(&make(&mut rng)));
        }
    }
}
