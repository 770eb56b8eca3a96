//! Sampling the node's clocks back to back, so userland timestamps in any clock can be
//! converted to the kernel events' CLOCK_MONOTONIC (docs/clock-discipline.md).

use crate::schema::ClockSample;

fn now(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out-pointer; these clock ids exist on every Linux since 2.6.39.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// CLOCK_MONOTONIC read twice around REALTIME, TAI and BOOTTIME. The midpoint is the
/// monotonic time of the sample; the distance bounds the conversion error. Of a few tries the
/// tightest bracket is kept (a preemption in the middle would widen it).
pub fn sample_clocks(node: Option<&str>) -> ClockSample {
    const TRIES: usize = 5;
    let mut best: Option<ClockSample> = None;
    for _ in 0..TRIES {
        let before = now(libc::CLOCK_MONOTONIC);
        let realtime = now(libc::CLOCK_REALTIME);
        let tai = now(libc::CLOCK_TAI);
        let boottime = now(libc::CLOCK_BOOTTIME);
        let after = now(libc::CLOCK_MONOTONIC);
        let sample = ClockSample {
            node: node.map(str::to_owned),
            realtime_ns: realtime,
            monotonic_ns: before + (after - before) / 2,
            tai_ns: tai,
            boottime_ns: boottime,
            bracket_ns: after - before,
            nic_clocks: Vec::new(),
        };
        if best
            .as_ref()
            .is_none_or(|b| sample.bracket_ns < b.bracket_ns)
        {
            best = Some(sample);
        }
    }
    best.expect("TRIES > 0")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sample_is_bracketed_and_clocks_are_consistent() {
        let s = sample_clocks(Some("A"));
        assert!(s.bracket_ns < 1_000_000, "bracket {} ns", s.bracket_ns);
        // BOOTTIME includes suspend, so it is never behind MONOTONIC.
        assert!(s.boottime_ns + s.bracket_ns >= s.monotonic_ns);
        // REALTIME is after 2020 on any machine running this test.
        assert!(s.realtime_ns > 1_577_836_800_000_000_000);
        assert_eq!(s.node.as_deref(), Some("A"));
    }
}
