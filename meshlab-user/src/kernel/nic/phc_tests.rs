//! The PHC sample choice and conversion, and which devices are sampled, on fake clocks.

use std::cell::RefCell;
use std::rc::Rc;

use super::*;
use crate::schema::{HwTimestamps, Timestamping};

fn triple(before_ns: u64, phc_ns: u64, after_ns: u64) -> Triple {
    Triple {
        before_ns,
        phc_ns,
        after_ns,
    }
}

fn monotonic(triples: Vec<Triple>) -> Reading {
    Reading {
        sys_clock: PhcSysClock::Monotonic,
        triples,
        realtime_offset_ns: 0,
        offset_bracket_ns: 0,
    }
}

#[test]
fn the_tightest_triple_is_the_sample() {
    let reading = monotonic(vec![
        triple(1_000, 50_000_700, 1_800),
        // Preempted between the reads: 5 us window, not chosen.
        triple(2_000, 50_001_900, 7_000),
        triple(8_000, 50_007_100, 8_200),
    ]);
    let s = best_sample("eth0", 2, &reading).expect("a sample");
    assert_eq!(
        (s.phc_ns, s.monotonic_ns, s.window_ns),
        (50_007_100, 8_100, 200)
    );
    assert_eq!((s.dev.as_str(), s.phc_index), ("eth0", 2));
    assert_eq!(s.sys_clock, PhcSysClock::Monotonic);
}

#[test]
fn realtime_readings_move_to_monotonic_and_widen_the_window() {
    // Realtime = monotonic + 1e18; the pair read after the call had a 300 ns bracket.
    let offset = 1_000_000_000_000_000_000u64;
    let reading = Reading {
        sys_clock: PhcSysClock::RealtimeConverted,
        triples: vec![triple(offset + 10_000, 99, offset + 10_400)],
        realtime_offset_ns: i128::from(offset),
        offset_bracket_ns: 300,
    };
    let s = best_sample("eth0", 0, &reading).expect("a sample");
    assert_eq!((s.monotonic_ns, s.window_ns), (10_200, 700));
    assert_eq!(s.sys_clock, PhcSysClock::RealtimeConverted);
}

#[test]
fn no_usable_triple_is_no_sample() {
    assert_eq!(best_sample("eth0", 0, &monotonic(Vec::new())), None);
    // System clock read backwards (a broken driver): nothing to bound the PHC read with.
    let backwards = monotonic(vec![triple(2_000, 5, 1_000)]);
    assert_eq!(best_sample("eth0", 0, &backwards), None);
}

/// A PHC `ahead` ns ahead of the monotonic clock, read `reads` times; fails while `failing`.
struct FakePhc {
    ahead: u64,
    reads: Rc<RefCell<u32>>,
    failing: Rc<RefCell<bool>>,
}

impl PhcReader for FakePhc {
    fn read(&mut self, samples: u32) -> io::Result<Reading> {
        if *self.failing.borrow() {
            return Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP));
        }
        let n = {
            let mut reads = self.reads.borrow_mut();
            *reads += 1;
            u64::from(*reads)
        };
        let triples = (0..u64::from(samples))
            .map(|i| {
                let before = n * 1_000_000 + i * 1_000;
                triple(before, before + 50 + self.ahead, before + 100 + i)
            })
            .collect();
        Ok(monotonic(triples))
    }
}

fn device(dev: &str, phc: Option<u32>, outcome: HwTimestampsOutcome) -> DeviceContext {
    DeviceContext {
        dev: dev.into(),
        timestamping: Some(Timestamping {
            hardware_tx: true,
            phc_index: phc,
            ..Timestamping::default()
        }),
        hw_timestamps: Some(HwTimestamps {
            outcome,
            previous: None,
            active: None,
            error: None,
        }),
        ..DeviceContext::default()
    }
}

#[test]
fn only_switched_on_devices_with_a_phc_are_sampled() {
    let devices = [
        device("eth0", Some(3), HwTimestampsOutcome::SwitchedOn),
        device("eth1", Some(4), HwTimestampsOutcome::NotCapable),
        device("eth2", None, HwTimestampsOutcome::SwitchedOn),
        device("eth3", Some(5), HwTimestampsOutcome::SwitchedOn),
    ];
    let opened = RefCell::new(Vec::new());
    let failing = Rc::new(RefCell::new(false));
    let sampler = PhcSampler::open(&devices, |index| {
        opened.borrow_mut().push(index);
        if index == 5 {
            return Err(io::Error::from_raw_os_error(libc::ENOENT));
        }
        Ok(Box::new(FakePhc {
            ahead: 1_000_000_000,
            reads: Rc::default(),
            failing: failing.clone(),
        }))
    });
    assert_eq!(
        *opened.borrow(),
        [3, 5],
        "eth1 not switched on, eth2 has no PHC"
    );
    let mut sampler = sampler.expect("eth0's PHC opened");
    let samples = sampler.sample();
    assert_eq!(samples.len(), 1);
    let s = &samples[0];
    assert_eq!((s.dev.as_str(), s.phc_index), ("eth0", 3));
    // The first triple (window 100 ns) of the first read at 1 ms.
    assert_eq!(
        (s.monotonic_ns, s.phc_ns, s.window_ns),
        (1_000_050, 1_001_000_050, 100)
    );
}

#[test]
fn a_failing_phc_is_left_out_while_it_fails_and_back_after() {
    let devices = [device("eth0", Some(0), HwTimestampsOutcome::SwitchedOn)];
    let failing = Rc::new(RefCell::new(true));
    let reads = Rc::new(RefCell::new(0));
    let mut sampler = PhcSampler::open(&devices, |_| {
        Ok(Box::new(FakePhc {
            ahead: 0,
            reads: reads.clone(),
            failing: failing.clone(),
        }))
    })
    .expect("opened");
    assert!(sampler.sample().is_empty());
    assert!(sampler.sample().is_empty());
    *failing.borrow_mut() = false;
    assert_eq!(sampler.sample().len(), 1);
    assert_eq!(*reads.borrow(), 1);
}

#[test]
fn nothing_to_sample_is_no_sampler() {
    let devices = [device("eth0", None, HwTimestampsOutcome::SwitchedOn)];
    assert!(PhcSampler::open(&devices, |_| unreachable!("no PHC to open")).is_none());
}
