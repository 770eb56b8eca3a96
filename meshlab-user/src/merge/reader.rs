//! The reader thread's scheduler state while a message waits in its socket, from the thread's
//! switch-out / switch-in / wake-up events (docs/segments.md, "The reader's scheduler state").
//!
//! `rx_socket_queue` (data queued, the reader was not woken by it) mixes three situations a
//! reader must tell apart: the thread was running other work (its process's time), it was
//! runnable but had no CPU (preempted: scheduler queueing), or it slept on something else.
//! [`ReaderTimeline`] holds the thread's state from the data's arrival to its copy, and
//! [`ReaderTimeline::split`] cuts a span of that wait by it.

use super::segments::ReaderState;

/// A scheduler event of one thread, as the kernel index keeps them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SchedEvent {
    /// sched_switch onto the thread.
    On,
    /// sched_switch away from it; `runnable`: prev_state was TASK_RUNNING (preempted or
    /// yielded, it stays on the run queue).
    Off { runnable: bool },
    /// sched_waking of the thread.
    Woken,
}

impl SchedEvent {
    /// A switch-out with its `prev_state` (the task's raw state: 0 = TASK_RUNNING). Without
    /// one (a hand-written line) it counts as a sleep: the missing wake-up before the next
    /// switch-in still shows a preemption.
    pub fn off(prev_state: Option<u64>) -> SchedEvent {
        SchedEvent::Off {
            runnable: prev_state == Some(0),
        }
    }
}

/// The reader's state over one message's wait: `(from ns, state)` in time order, the first at
/// the data's arrival.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ReaderTimeline {
    /// sk_data_ready of the message (node ns): names the `rx_socket_queue` span it splits.
    pub ready_ns: u64,
    pub states: Vec<(u64, ReaderState)>,
}

impl ReaderTimeline {
    /// The timeline from the reader's events in `[lo, hi]` (time order; `hi` is its copy of the
    /// data, so it runs at `hi`) and its last event before `lo`.
    pub fn build(lo: u64, before: Option<SchedEvent>, events: &[(u64, SchedEvent)]) -> Self {
        let mut state = initial_state(before, events);
        let mut states = vec![(lo, state)];
        for (i, &(ns, ev)) in events.iter().enumerate() {
            state = match ev {
                SchedEvent::On => ReaderState::Busy,
                SchedEvent::Off { runnable: true } => ReaderState::Runnable,
                // A sleeping thread runs again only after a wake-up: switched in again without
                // one, it was preempted after setting its sleep state (raw prev_state has no
                // preempt flag), so it stayed runnable.
                SchedEvent::Off { runnable: false } => match events.get(i + 1) {
                    Some((_, SchedEvent::On)) => ReaderState::Runnable,
                    Some(_) => ReaderState::Blocked,
                    None => ReaderState::Unknown,
                },
                // Waking a thread still on its CPU (about to sleep) leaves it running.
                SchedEvent::Woken if state == ReaderState::Blocked => ReaderState::Runnable,
                SchedEvent::Woken => state,
            };
            states.push((ns.max(lo), state));
        }
        ReaderTimeline {
            ready_ns: lo,
            states,
        }
    }

    /// `[a, b)` cut where the state changes: `(start, dur, state)`, adjacent equal states
    /// joined, empty pieces left out; the durations sum to `b - a` exactly.
    pub fn split(&self, a: u64, b: u64) -> Vec<(u64, u64, ReaderState)> {
        let at_a = self
            .states
            .iter()
            .take_while(|(ns, _)| *ns <= a)
            .last()
            .map_or(ReaderState::Unknown, |&(_, s)| s);
        let mut pieces: Vec<(u64, u64, ReaderState)> = vec![(a, 0, at_a)];
        let changes = self.states.iter().filter(|(ns, _)| *ns > a && *ns < b);
        for &(ns, state) in changes {
            let last = pieces.last_mut().expect("starts with one piece");
            if last.2 != state {
                last.1 = ns - last.0;
                pieces.push((ns, 0, state));
            }
        }
        let last = pieces.last_mut().expect("starts with one piece");
        last.1 = b - last.0;
        pieces.retain(|p| p.1 > 0);
        pieces
    }
}

/// The state at the data's arrival, from the first switch in the window (the reader must be
/// on a CPU at the copy): switched out first => it was running; switched in first => it was
/// off the CPU, asleep if a wake-up came before that switch-in, else runnable (preempted, or
/// woken before the data came). Without any switch it ran throughout if its last event before
/// was a switch-in (a wake-up then found it still on its CPU); otherwise events are missing
/// and the state is unknown.
fn initial_state(before: Option<SchedEvent>, events: &[(u64, SchedEvent)]) -> ReaderState {
    let woken_first = matches!(events.first(), Some((_, SchedEvent::Woken)));
    match events.iter().find(|(_, e)| *e != SchedEvent::Woken) {
        Some((_, SchedEvent::Off { .. })) => ReaderState::Busy,
        Some(_) if woken_first => ReaderState::Blocked,
        Some(_) => ReaderState::Runnable,
        None if before == Some(SchedEvent::On) => ReaderState::Busy,
        None => ReaderState::Unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::ReaderState::{Blocked, Busy, Runnable, Unknown};
    use super::*;

    const PREEMPTED: SchedEvent = SchedEvent::Off { runnable: true };
    const SLEPT: SchedEvent = SchedEvent::Off { runnable: false };

    fn states(before: Option<SchedEvent>, events: &[(u64, SchedEvent)]) -> Vec<(u64, ReaderState)> {
        ReaderTimeline::build(100, before, events).states
    }

    #[test]
    fn running_throughout_is_busy() {
        assert_eq!(states(Some(SchedEvent::On), &[]), [(100, Busy)]);
        // Nothing known about the thread: not guessed.
        assert_eq!(states(None, &[]), [(100, Unknown)]);
        assert_eq!(states(Some(PREEMPTED), &[]), [(100, Unknown)]);
    }

    #[test]
    fn preempted_while_the_data_waits_is_runqueue_wait() {
        let t = states(
            Some(SchedEvent::On),
            &[(150, PREEMPTED), (400, SchedEvent::On)],
        );
        assert_eq!(t, [(100, Busy), (150, Runnable), (400, Busy)]);
        // Already on the run queue when the data came: the first switch is a switch-in.
        assert_eq!(
            states(Some(PREEMPTED), &[(300, SchedEvent::On)]),
            [(100, Runnable), (300, Busy)]
        );
    }

    #[test]
    fn preempted_with_a_sleep_state_set_is_runnable() {
        // Switched out with a sleep state but in again without a wake-up: it never slept.
        let t = states(None, &[(150, SLEPT), (400, SchedEvent::On)]);
        assert_eq!(t, [(100, Busy), (150, Runnable), (400, Busy)]);
    }

    #[test]
    fn asleep_on_something_else_then_woken() {
        let t = states(
            None,
            &[
                (150, SLEPT),
                (200, SchedEvent::Woken),
                (260, SchedEvent::On),
            ],
        );
        assert_eq!(
            t,
            [(100, Busy), (150, Blocked), (200, Runnable), (260, Busy)]
        );
        // Asleep already when the data came.
        let t = states(
            Some(SLEPT),
            &[(200, SchedEvent::Woken), (260, SchedEvent::On)],
        );
        assert_eq!(t, [(100, Blocked), (200, Runnable), (260, Busy)]);
    }

    #[test]
    fn a_wakeup_while_running_changes_nothing_and_lost_events_are_unknown() {
        let t = states(None, &[(120, SchedEvent::Woken), (150, PREEMPTED)]);
        assert_eq!(t, [(100, Busy), (120, Busy), (150, Runnable)]);
        let woken = [(120, SchedEvent::Woken)];
        assert_eq!(
            states(Some(SchedEvent::On), &woken),
            [(100, Busy), (120, Busy)]
        );
        assert_eq!(states(None, &woken), [(100, Unknown), (120, Unknown)]);
        let t = states(
            Some(SchedEvent::On),
            &[
                (120, PREEMPTED),
                (130, SchedEvent::On),
                (140, SchedEvent::Woken),
            ],
        );
        assert_eq!(t[3], (140, Busy));
        // A switch-out to sleep with nothing after it, yet the thread copied the data.
        assert_eq!(states(None, &[(150, SLEPT)]), [(100, Busy), (150, Unknown)]);
    }

    #[test]
    fn switch_out_state_from_prev_state() {
        assert_eq!(SchedEvent::off(Some(0)), PREEMPTED);
        assert_eq!(SchedEvent::off(Some(1)), SLEPT);
        assert_eq!(SchedEvent::off(Some(2)), SLEPT);
        assert_eq!(SchedEvent::off(None), SLEPT);
    }

    #[test]
    fn split_joins_equal_states_and_sums_exactly() {
        let t = ReaderTimeline {
            ready_ns: 100,
            states: vec![(100, Busy), (150, Runnable), (170, Runnable), (400, Busy)],
        };
        assert_eq!(
            t.split(100, 500),
            [(100, 50, Busy), (150, 250, Runnable), (400, 100, Busy)]
        );
        // Clipped to a shorter span (a probe's read_ready ends the wait first).
        assert_eq!(t.split(100, 300), [(100, 50, Busy), (150, 150, Runnable)]);
        // A change at the span's start leaves no empty piece.
        assert_eq!(t.split(150, 160), [(150, 10, Runnable)]);
        let sum: u64 = t.split(100, 450).iter().map(|p| p.1).sum();
        assert_eq!(sum, 350);
    }
}
