//! `record --attach on-demand`: the hot hooks (every hook but sock_ops) are attached only while
//! the kernel side traces a connection.
//!
//! Tracepoint dispatch alone costs a c=1 redis benchmark ~11 % of its throughput with empty
//! programs on the recorder's tracepoints (docs/benchmarks.md), so a recorder whose filters
//! match nothing can only vanish into the noise by not being attached there. sock_ops stays
//! attached and counts traced connections (TRACED_LIVE, meshlab-ebpf/src/prefilter.rs); with
//! `Config::wake_on_traced` it wakes the reader with each newly traced connection's
//! `sock_established` event, and the reader attaches the hot hooks on that wakeup. Their
//! programs were loaded (verified) and attached once at start, so the tier choice and the
//! attach plan are the same as without on-demand and attaching again is only a link creation
//! per hook. They are detached again once the count has been zero for [`DETACH_AFTER`].

use std::time::{Duration, Instant};

use anyhow::Context;
use aya::Ebpf;
use aya::maps::{Array, MapData};
use meshlab_common::{Event, Hook};

use super::clock::sample_clocks;
use super::loader::{self, TierLink};
use super::plan::{HookSpec, Tier, TierSpec};
use crate::schema::{HotHooks, HotHooksChange};

/// How long no connection must be traced before the hot hooks are detached: long enough that
/// a client reconnecting at once (one connection per request) keeps them attached.
pub const DETACH_AFTER: Duration = Duration::from_secs(1);

/// Whether a tier's program can be attached again after the recorder gave up its
/// capabilities (kernel/privilege.rs): a BPF link of a loaded program needs none; kprobes and
/// classic tracepoints go through perf_event_open (CAP_PERFMON, tracefs), so hooks on those
/// tiers stay attached for the whole recording.
pub fn reattachable(tier: Tier) -> bool {
    matches!(tier, Tier::Fentry | Tier::Fexit | Tier::TpBtf | Tier::RawTp)
}

/// The hot hooks of an on-demand recording and whether they are attached now.
pub struct OnDemand {
    node: String,
    /// Every hot hook with the tier chosen at start, its program loaded.
    hooks: Vec<(&'static HookSpec, &'static TierSpec)>,
    /// The links while attached; empty while detached.
    links: Vec<(&'static TierSpec, TierLink)>,
    attached: bool,
    traced_live: Array<MapData, u64>,
    /// Start of the current window without hot-hook events (start, or the last detach).
    missing_since_ns: u64,
    /// When the traced-connection count was first seen at zero while attached.
    idle_since: Option<Instant>,
}

impl OnDemand {
    /// `hooks` are detached already (their programs loaded); `start_ns` is the recording's start.
    pub fn new(
        ebpf: &mut Ebpf,
        node: String,
        hooks: Vec<(&'static HookSpec, &'static TierSpec)>,
        start_ns: u64,
    ) -> anyhow::Result<OnDemand> {
        let map = ebpf
            .take_map("TRACED_LIVE")
            .context("TRACED_LIVE map missing")?;
        Ok(OnDemand {
            node,
            hooks,
            links: Vec::new(),
            attached: false,
            traced_live: Array::try_from(map)?,
            missing_since_ns: start_ns,
            idle_since: None,
        })
    }

    /// Whether the hot hooks are attached now.
    pub fn attached(&self) -> bool {
        self.attached
    }

    /// Connections the kernel side traces now.
    fn traced(&self) -> anyhow::Result<u64> {
        Ok(self.traced_live.get(&0, 0)?)
    }

    /// Attaches or detaches as the traced-connection count says; the record of a change.
    /// `trigger_ns` is the first `sock_established` seen while detached ([`EstablishedWatch`]).
    pub fn poll(
        &mut self,
        ebpf: &mut Ebpf,
        trigger_ns: Option<u64>,
    ) -> anyhow::Result<Option<HotHooks>> {
        let traced = self.traced()?;
        if !self.attached {
            return Ok((traced > 0).then(|| self.attach(ebpf, trigger_ns)));
        }
        if traced > 0 {
            self.idle_since = None;
            return Ok(None);
        }
        let idle = *self.idle_since.get_or_insert_with(Instant::now);
        Ok((idle.elapsed() >= DETACH_AFTER).then(|| self.detach(ebpf)))
    }

    fn attach(&mut self, ebpf: &mut Ebpf, trigger_ns: Option<u64>) -> HotHooks {
        let started = Instant::now();
        let mut names = Vec::with_capacity(self.hooks.len());
        for &(hook, spec) in &self.hooks {
            // It attached at start; a failure now is the kernel's (out of memory, a module
            // gone), said per hook: the record lists only the hooks that attached.
            match loader::attach_loaded(ebpf, spec, None) {
                Ok(link) => {
                    self.links.push((spec, link));
                    names.push(hook.name.to_owned());
                }
                Err(e) => log::warn!("{}: attaching on demand failed: {e}", hook.name),
            }
        }
        self.attached = true;
        self.idle_since = None;
        let ts_ns = sample_clocks(None).monotonic_ns;
        let delay_ns = trigger_ns.map(|t| ts_ns.saturating_sub(t));
        // The attach calls' own share of the delay; the rest is the wakeup reaching the reader.
        log::info!(
            "hot hooks attached: a connection is traced{}; {} hooks attached in {:.3} ms; their events before this are missing",
            delay_ns.map_or(String::new(), |d| format!(
                ", {:.3} ms after its sock_established",
                d as f64 / 1e6
            )),
            names.len(),
            started.elapsed().as_secs_f64() * 1e3
        );
        HotHooks {
            node: self.node.clone(),
            ts_ns,
            change: HotHooksChange::Attached,
            hooks: names,
            missing_since_ns: Some(self.missing_since_ns),
            trigger_ns,
            delay_ns,
        }
    }

    fn detach(&mut self, ebpf: &mut Ebpf) -> HotHooks {
        let mut names = Vec::with_capacity(self.links.len());
        for (spec, link) in std::mem::take(&mut self.links) {
            if let Err(e) = loader::detach_link(ebpf, spec, link) {
                log::warn!("detaching {}: {e}", spec.program);
            }
            if let Some((hook, _)) = self.hooks.iter().find(|(_, s)| std::ptr::eq(*s, spec)) {
                names.push(hook.name.to_owned());
            }
        }
        self.attached = false;
        self.idle_since = None;
        let ts_ns = sample_clocks(None).monotonic_ns;
        self.missing_since_ns = ts_ns;
        log::info!(
            "hot hooks detached: no connection traced for {DETACH_AFTER:?}; attached again with the next one"
        );
        HotHooks {
            node: self.node.clone(),
            ts_ns,
            change: HotHooksChange::Detached,
            hooks: names,
            missing_since_ns: None,
            trigger_ns: None,
            delay_ns: None,
        }
    }
}

/// Notes the time of the first `sock_established` event the reader passes while armed (the
/// hot hooks detached): the connection that triggers the next attachment.
#[derive(Default)]
pub struct EstablishedWatch {
    armed: bool,
    first_ns: Option<u64>,
}

/// Offsets inside a raw event: the watch reads two fields without decoding the event.
const HOOK_OFFSET: usize = std::mem::offset_of!(Event, hook);
const TS_OFFSET: usize = std::mem::offset_of!(Event, ts_ns);

impl EstablishedWatch {
    /// Watches (or stops watching) from now on; the time noted so far is forgotten.
    pub fn arm(&mut self, armed: bool) {
        self.armed = armed;
        self.first_ns = None;
    }

    /// One raw ring record (at least an [`Event`]; shorter ones are the output's error).
    #[inline]
    pub fn see(&mut self, record: &[u8]) {
        if !self.armed || self.first_ns.is_some() || record.len() < std::mem::size_of::<Event>() {
            return;
        }
        let hook = u16::from_ne_bytes([record[HOOK_OFFSET], record[HOOK_OFFSET + 1]]);
        if hook == Hook::SockEstablished as u16 {
            let ts: [u8; 8] = record[TS_OFFSET..TS_OFFSET + 8]
                .try_into()
                .expect("8 bytes");
            self.first_ns = Some(u64::from_ne_bytes(ts));
        }
    }

    pub fn first_ns(&self) -> Option<u64> {
        self.first_ns
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_bpf_link_tiers_are_attached_on_demand() {
        let on_demand: Vec<Tier> = Tier::ALL
            .iter()
            .copied()
            .filter(|t| reattachable(*t))
            .collect();
        assert_eq!(
            on_demand,
            [Tier::Fentry, Tier::Fexit, Tier::TpBtf, Tier::RawTp]
        );
    }

    fn raw(hook: Hook, ts_ns: u64) -> Vec<u8> {
        let mut bytes = vec![0u8; std::mem::size_of::<Event>()];
        bytes[HOOK_OFFSET..HOOK_OFFSET + 2].copy_from_slice(&(hook as u16).to_ne_bytes());
        bytes[TS_OFFSET..TS_OFFSET + 8].copy_from_slice(&ts_ns.to_ne_bytes());
        bytes
    }

    #[test]
    fn the_watch_notes_the_first_established_only_while_armed() {
        let mut watch = EstablishedWatch::default();
        watch.see(&raw(Hook::SockEstablished, 5));
        assert_eq!(watch.first_ns(), None, "not armed");
        watch.arm(true);
        watch.see(&raw(Hook::TcpProbe, 6));
        watch.see(&raw(Hook::SockEstablished, 7));
        watch.see(&raw(Hook::SockEstablished, 9));
        assert_eq!(watch.first_ns(), Some(7), "the first one");
        watch.arm(false);
        assert_eq!(watch.first_ns(), None, "forgotten when disarmed");
    }
}
