//! A running recording: drains the ring buffer into the output (binary capture or NDJSON,
//! see [`super::output`]), writes clock and drop records,
//! shows progress, and on stop detaches everything before the final exact accounting.

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::time::{Duration, Instant};

use anyhow::Context;
use aya::Ebpf;
use aya::maps::PerCpuArray;
use meshlab_common::{HOOK_COUNT, Hook};
use tokio::io::unix::AsyncFd;
use tokio::signal::unix::{SignalKind, signal};

use super::clock::sample_clocks;
use super::diag::KernelLog;
use super::loader;
use super::nic::phc::PhcSampler;
use super::ondemand::{EstablishedWatch, OnDemand};
use super::output::RecordingOutput;
use super::plan::TierSpec;
use super::ring::EventRings;
use super::selfcost::OwnPrograms;
use crate::schema::{
    ClockSample, DropShare, Drops, HookCounts, Record, SelfCost, StopReason, Summary,
};

/// Creates the ready file (signal handlers are in place) and drops every capability: everything
/// is attached and every file is open, so nothing from here on needs one (kernel/privilege.rs).
/// `keep_net_admin`: `record --hw-timestamps` switched a device on, and putting its config
/// back at exit (SIOCSHWTSTAMP) needs CAP_NET_ADMIN, so that one is kept.
fn announce_ready(
    ready_file: Option<&std::path::Path>,
    keep_net_admin: bool,
) -> anyhow::Result<()> {
    if let Some(ready) = ready_file {
        crate::output::create_output(ready, crate::output::Policy::Stream)?.commit()?;
    }
    let keep = if keep_net_admin {
        super::privilege::NET_ADMIN_BIT
    } else {
        0
    };
    super::privilege::drop_all_but(keep).context("dropping capabilities after attaching")?;
    log::debug!("capabilities dropped (kept mask {keep:#x})");
    Ok(())
}

/// How often the reader drains events that were submitted without a wakeup while events come.
pub const DRAIN_EVERY: Duration = Duration::from_millis(10);
/// The longest pause between drains while they find nothing. What can pile up meanwhile is
/// bounded by the kernel's forced wakeups (record.rs, WAKEUP_FRACTION), not by this pause.
const DRAIN_IDLE_MAX: Duration = Duration::from_millis(320);

/// The pause before the next drain: [`DRAIN_EVERY`] after a drain that found events or a
/// wakeup from the kernel, doubling up to [`DRAIN_IDLE_MAX`] after drains that found none. A recorder whose filters match
/// nothing then wakes a few times a second instead of a hundred (plus the 1 s housekeeping).
struct DrainPace(Duration);

impl DrainPace {
    /// A wakeup from the kernel: events come again, drain at the busy pace from now on;
    /// true when the pace was backed off (the pending drain is too far away).
    fn busy(&mut self) -> bool {
        std::mem::replace(&mut self.0, DRAIN_EVERY) != DRAIN_EVERY
    }

    /// [`Self::busy`], and the pending drain moved to the busy pace when it was further away.
    fn wakeup(&mut self, drain: std::pin::Pin<&mut tokio::time::Sleep>) {
        if self.busy() {
            drain.reset(tokio::time::Instant::now() + DRAIN_EVERY);
        }
    }

    fn next(&mut self, found: bool) -> Duration {
        self.0 = if found {
            DRAIN_EVERY
        } else {
            (self.0 * 2).min(DRAIN_IDLE_MAX)
        };
        self.0
    }
}
/// Records written per pass before the event loop looks at signals and timers again.
const BATCH: usize = 4096;

pub struct Session {
    ebpf: Ebpf,
    attached: Vec<&'static TierSpec>,
    own: OwnPrograms,
    node: String,
    out: RecordingOutput,
    ring: Option<EventRings>,
    last_drops_total: u64,
    /// `record -v`: the programs' diagnostics, printed once a second and at the end.
    kernel_log: Option<KernelLog>,
    /// `record --attach on-demand`: the hot hooks, attached while a connection is traced.
    on_demand: Option<OnDemand>,
    /// Armed while the hot hooks are detached: the trigger of the next attachment.
    watch: EstablishedWatch,
    /// Keep CAP_NET_ADMIN when dropping capabilities (see [`announce_ready`]).
    keep_net_admin: bool,
    /// `record --hw-timestamps`: NIC clocks read into every clock record.
    nic_clocks: Option<PhcSampler>,
}

/// Per-hook hit and drop counters, summed over CPUs, plus drops per CPU.
struct Counters {
    hits: [u64; HOOK_COUNT as usize],
    drops: [u64; HOOK_COUNT as usize],
    drops_per_cpu: Vec<u64>,
}

impl Session {
    pub fn new(
        mut ebpf: Ebpf,
        attached: Vec<&'static TierSpec>,
        own: OwnPrograms,
        node: String,
        out: RecordingOutput,
        kernel_log: Option<KernelLog>,
    ) -> anyhow::Result<Self> {
        let ring = EventRings::new(&mut ebpf, &super::loader::event_rings_used())?;
        Ok(Self {
            ebpf,
            attached,
            own,
            node,
            out,
            ring: Some(ring),
            last_drops_total: 0,
            kernel_log,
            on_demand: None,
            watch: EstablishedWatch::default(),
            keep_net_admin: false,
            nic_clocks: None,
        })
    }

    /// Keeps CAP_NET_ADMIN past the capability drop (`record --hw-timestamps` restores the
    /// devices' stamping config at exit with it).
    pub fn keep_net_admin(mut self, keep: bool) -> Self {
        self.keep_net_admin = keep;
        self
    }

    /// Reads these NIC clocks into every clock record (`record --hw-timestamps`).
    pub fn with_nic_clocks(mut self, sampler: Option<PhcSampler>) -> Self {
        self.nic_clocks = sampler;
        self
    }

    /// The node's clocks now, with its NIC clocks when there are any.
    fn clock_record(&mut self) -> ClockSample {
        let mut sample = sample_clocks(Some(&self.node));
        if let Some(phc) = &mut self.nic_clocks {
            sample.nic_clocks = phc.sample();
        }
        sample
    }

    /// Records with the hot hooks attached on demand (they are detached now).
    pub fn with_on_demand(mut self, on_demand: OnDemand) -> Self {
        self.watch.arm(!on_demand.attached());
        self.on_demand = Some(on_demand);
        self
    }

    /// Attaches or detaches the hot hooks as the kernel's traced-connection count says, and
    /// writes a `hot_hooks` record for a change (called after every drain and every second).
    fn poll_on_demand(&mut self) -> anyhow::Result<()> {
        let Some(on_demand) = self.on_demand.as_mut() else {
            return Ok(());
        };
        if let Some(change) = on_demand.poll(&mut self.ebpf, self.watch.first_ns())? {
            self.watch.arm(!on_demand.attached());
            self.write_record(&Record::HotHooks(change))?;
        }
        Ok(())
    }

    pub fn write_record(&mut self, record: &Record) -> std::io::Result<()> {
        self.out.write_record(record)
    }

    pub fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }

    /// Records until `duration`, SIGINT, SIGTERM or SIGHUP; returns a one-line summary for stderr.
    /// `ready_file` is created once the signal handlers are in place, so a controller that
    /// waits for it can stop the recording with a signal at any time after.
    pub fn run(
        mut self,
        duration: Option<Duration>,
        clock_every: Duration,
        ready_file: Option<&std::path::Path>,
    ) -> anyhow::Result<String> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let started = Instant::now();
        let start_ns = sample_clocks(None).monotonic_ns;
        if self.nic_clocks.is_some() {
            // The startup record's clocks have no NIC clock: place the first stamps.
            let sample = self.clock_record();
            self.write_record(&Record::Clock(sample))?;
        }
        let reason = runtime.block_on(self.read_loop(duration, clock_every, ready_file))?;
        self.detach_and_drain()?;
        let counters = self.read_counters()?;
        self.write_drops_if_changed(&counters, true)?;
        let end = self.clock_record();
        self.write_record(&Record::Clock(end.clone()))?;
        let received = self.out.received().iter().sum();
        let summary = Summary {
            node: self.node.clone(),
            ts_ns: end.monotonic_ns,
            duration_ns: end.monotonic_ns.saturating_sub(start_ns),
            received,
            dropped: counters.drops.iter().sum(),
            per_hook: self.per_hook_counts(&counters),
            reason,
            self_cost: self.self_cost(received, &counters.hits),
        };
        self.write_record(&Record::Summary(summary.clone()))?;
        self.flush()?;
        if self.out.unknown_hooks() > 0 {
            log::warn!(
                "{} records had an unknown hook id",
                self.out.unknown_hooks()
            );
        }
        warn_of_drops(summary.received, summary.dropped);
        let per_hook: Vec<String> = summary
            .per_hook
            .iter()
            .map(|(k, v)| format!("{k}={}", v.received))
            .collect();
        Ok(format!(
            "meshlab record: node {} {:.1}s ({}): {} events, {} dropped [{}]",
            self.node,
            started.elapsed().as_secs_f64(),
            reason.as_str(),
            summary.received,
            summary.dropped,
            per_hook.join(" ")
        ))
    }

    /// Detaches first, so no event can be produced after the counters are read; then drains
    /// what is still in the buffer: received + dropped == hits holds exactly.
    fn detach_and_drain(&mut self) -> anyhow::Result<()> {
        for spec in std::mem::take(&mut self.attached) {
            if let Err(e) = loader::detach_tier(&mut self.ebpf, spec) {
                log::warn!("detaching {}: {e}", spec.program);
            }
        }
        self.drain()?;
        if let Some(log) = &mut self.kernel_log {
            log.flush();
        }
        Ok(())
    }

    /// meshlab's own cost; a failed read is a warning (the recording itself is whole) and
    /// leaves the field out rather than writing a figure that was not measured.
    fn self_cost(&self, received: u64, hits: &[u64]) -> Option<SelfCost> {
        match self.own.finish(received, hits) {
            Ok(cost) => {
                for (program, missed) in &cost.missed_runs {
                    log::warn!(
                        "{program}: the kernel skipped it {missed} times (a BPF program was \
                         already running on that CPU): those events are lost, not in dropped"
                    );
                }
                Some(cost)
            }
            Err(e) => {
                log::warn!("meshlab's own cost not written: {e}");
                None
            }
        }
    }

    /// Hits, drops and received events of every hook that saw any.
    fn per_hook_counts(&self, counters: &Counters) -> BTreeMap<String, HookCounts> {
        let mut per_hook = BTreeMap::new();
        let received = self.out.received();
        for hook in Hook::ALL {
            let i = hook as usize;
            if counters.hits[i] + received[i] > 0 {
                per_hook.insert(
                    hook.name().to_owned(),
                    HookCounts {
                        hits: counters.hits[i],
                        dropped: counters.drops[i],
                        received: received[i],
                    },
                );
            }
        }
        per_hook
    }

    async fn read_loop(
        &mut self,
        duration: Option<Duration>,
        clock_every: Duration,
        ready_file: Option<&std::path::Path>,
    ) -> anyhow::Result<StopReason> {
        let mut ring = register(self.ring.take().context("ring buffer already taken")?)?;
        let mut sigint = signal(SignalKind::interrupt())?;
        let mut sigterm = signal(SignalKind::terminate())?;
        // A closed terminal or `kill -HUP` stops like SIGTERM, with the final accounting.
        let mut sighup = signal(SignalKind::hangup())?;
        announce_ready(ready_file, self.keep_net_admin)?;
        let deadline = duration.map(|d| tokio::time::Instant::now() + d);
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        let mut pace = DrainPace(DRAIN_EVERY);
        let drain = tokio::time::sleep(DRAIN_EVERY);
        tokio::pin!(drain);
        let mut last_clock = Instant::now();
        let progress = std::io::stderr().is_terminal();
        let mut last_received: u64 = 0;
        let reason = loop {
            tokio::select! {
                guard = ring.readable_mut() => {
                    let mut guard = guard?;
                    // A bounded batch, then back to select!: a producer faster than this
                    // reader must not starve the signal and timer branches.
                    if drain_batch(guard.get_inner_mut(), &mut self.out, &mut self.watch)? {
                        guard.clear_ready();
                    }
                    pace.wakeup(drain.as_mut());
                    self.poll_on_demand()?;
                }
                _ = &mut drain => {
                    // Events submitted without a wakeup (below the wakeup threshold).
                    let found = drain_pending(ring.get_mut(), &mut self.out, &mut self.watch)?;
                    drain.as_mut().reset(tokio::time::Instant::now() + pace.next(found));
                    self.poll_on_demand()?;
                }
                _ = tick.tick() => {
                    // Pending first: an on-demand attach needs its sock_established (delay_ns).
                    drain_pending(ring.get_mut(), &mut self.out, &mut self.watch)?;
                    let clock_due = last_clock.elapsed() >= clock_every;
                    self.each_second(clock_due, progress.then_some(&mut last_received))?;
                    if clock_due {
                        last_clock = Instant::now();
                    }
                }
                _ = sigint.recv() => break StopReason::Sigint,
                _ = sigterm.recv() => break StopReason::Sigterm,
                _ = sighup.recv() => break StopReason::Sighup,
                _ = sleep_until(deadline) => break StopReason::Duration,
            }
        };
        if progress {
            eprintln!();
        }
        self.ring = Some(ring.into_inner());
        Ok(reason)
    }

    /// The once-a-second work: drop records, a clock record when `clock_due`, the progress
    /// line when the terminal shows one (`last_received` is the total at the previous line).
    fn each_second(
        &mut self,
        clock_due: bool,
        last_received: Option<&mut u64>,
    ) -> anyhow::Result<()> {
        if let Some(log) = &mut self.kernel_log {
            log.flush();
        }
        self.poll_on_demand()?;
        let counters = self.read_counters()?;
        self.write_drops_if_changed(&counters, false)?;
        if clock_due {
            let sample = self.clock_record();
            self.write_record(&Record::Clock(sample))?;
        }
        if let Some(last_received) = last_received {
            let total = self.out.received_total();
            eprint!(
                "\r\x1b[Krecording: {} events/s, {} total, {} dropped",
                total - *last_received,
                total,
                self.last_drops_total
            );
            *last_received = total;
        }
        self.out.flush()?;
        Ok(())
    }

    /// The final drain: every record left in the rings, merged in time order with no horizon
    /// (no program runs any more; a record still being written is waited for, briefly).
    fn drain(&mut self) -> anyhow::Result<()> {
        let ring = self.ring.as_mut().context("ring buffer missing")?;
        let (out, watch) = (&mut self.out, &mut self.watch);
        ring.flush(|record| {
            watch.see(record);
            out.write_ring_record(record)
        })
    }

    fn read_counters(&self) -> anyhow::Result<Counters> {
        let hits: PerCpuArray<_, u64> =
            PerCpuArray::try_from(self.ebpf.map("HITS").context("HITS map missing")?)?;
        let drops: PerCpuArray<_, u64> =
            PerCpuArray::try_from(self.ebpf.map("DROPS").context("DROPS map missing")?)?;
        let mut c = Counters {
            hits: [0; HOOK_COUNT as usize],
            drops: [0; HOOK_COUNT as usize],
            drops_per_cpu: Vec::new(),
        };
        for i in 0..HOOK_COUNT {
            c.hits[i as usize] = hits.get(&i, 0)?.iter().sum();
            let per_cpu = drops.get(&i, 0)?;
            if c.drops_per_cpu.len() < per_cpu.len() {
                c.drops_per_cpu.resize(per_cpu.len(), 0);
            }
            for (cpu, n) in per_cpu.iter().enumerate() {
                c.drops_per_cpu[cpu] += n;
                c.drops[i as usize] += n;
            }
        }
        Ok(c)
    }

    /// A `drops` record whenever the counters moved (and always at the end).
    fn write_drops_if_changed(&mut self, c: &Counters, always: bool) -> anyhow::Result<()> {
        let total: u64 = c.drops.iter().sum();
        if total == self.last_drops_total && !always {
            return Ok(());
        }
        self.last_drops_total = total;
        let per_hook = Hook::ALL
            .iter()
            .filter(|h| c.drops[**h as usize] > 0)
            .map(|h| (h.name().to_owned(), c.drops[*h as usize]))
            .collect();
        let record = Drops {
            node: self.node.clone(),
            ts_ns: sample_clocks(None).monotonic_ns,
            per_hook,
            per_cpu: c.drops_per_cpu.clone(),
            total,
        };
        self.write_record(&Record::Drops(record))?;
        Ok(())
    }
}

/// The ring buffer registered with tokio for readability; `into_inner()` hands it back.
fn register(ring: EventRings) -> anyhow::Result<AsyncFd<EventRings>> {
    // SAFETY: EventRings owns its epoll fd, which stays open and unchanged until
    // into_inner() hands the rings back.
    unsafe { AsyncFd::register_with_interest(ring, tokio::io::Interest::READABLE) }
        .map_err(|e| anyhow::anyhow!("registering the ring buffer with tokio: {e}"))
}

/// Writes every pending record; whether there was any.
fn drain_pending(
    ring: &mut EventRings,
    out: &mut RecordingOutput,
    watch: &mut EstablishedWatch,
) -> anyhow::Result<bool> {
    let before = out.received_total();
    while !drain_batch(ring, out, watch)? {}
    Ok(out.received_total() != before)
}

/// Writes at most [`BATCH`] ring buffer records, shown to `watch` first; true when the buffer
/// is now empty.
fn drain_batch(
    ring: &mut EventRings,
    out: &mut RecordingOutput,
    watch: &mut EstablishedWatch,
) -> anyhow::Result<bool> {
    ring.drain(BATCH, |record| {
        watch.see(record);
        out.write_ring_record(record)
    })
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// Says at the end of a recording that lost events what share that was, what it does to the
/// merge and what helps (the counts alone were easy to pass over).
fn warn_of_drops(received: u64, dropped: u64) {
    if dropped == 0 {
        return;
    }
    let share = DropShare {
        dropped,
        written: received,
    };
    log::warn!(
        "events dropped, the event rings being full: {share} of what the programs produced; \
         the requests they belonged to will be incomplete or missing from the merge. Trace \
         less (--sample-messages 1/N, --sample-conns N, a narrower --port) or give the rings \
         more room (--ring-bytes)"
    );
}

#[cfg(test)]
mod tests {
    #[test]
    fn drain_pace_backs_off_while_idle_and_returns_at_once() {
        let mut pace = super::DrainPace(super::DRAIN_EVERY);
        let idle: Vec<u64> = (0..7)
            .map(|_| pace.next(false).as_millis() as u64)
            .collect();
        assert_eq!(idle, [20, 40, 80, 160, 320, 320, 320]);
        assert_eq!(pace.next(true), super::DRAIN_EVERY);
        pace.next(false);
        assert!(pace.busy(), "a wakeup after a back-off resets the pace");
        assert!(!pace.busy(), "at the busy pace a wakeup changes nothing");
        assert_eq!(pace.next(false).as_millis(), 20);
    }
}
