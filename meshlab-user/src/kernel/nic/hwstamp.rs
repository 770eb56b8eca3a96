//! `record --hw-timestamps`: switches hardware stamping on for the traced devices that can
//! stamp (TX on, RX all where offered) and puts the previous config back when the recorder
//! exits. Nothing else in the system does this for meshlab: without it `tx_tstamp_hw` appears
//! only when another program (ptp4l, a test tool) happened to switch stamping on.
//!
//! The switch is an RAII guard, like `selfcost::StatsSwitch`: every way out of `record` that
//! unwinds (normal end, an error, SIGINT/SIGTERM/SIGHUP, which the session turns into a normal
//! end) drops it and restores. `kill -9` and a signal before the session's handlers are in
//! place (before `--ready-file`) leave the device switched on: the kernel does not undo it.
//!
//! The two ioctls sit behind [`HwStampIoctl`] so the save / set / restore order is proven on a
//! fake device (no NIC this project runs on can stamp in hardware).

use std::io;

use crate::schema::{
    DeviceContext, HwStampConfig, HwTimestamps, HwTimestampsOutcome, Timestamping,
};

/// HWTSTAMP_TX_ON and HWTSTAMP_FILTER_ALL (include/uapi/linux/net_tstamp.h).
pub const TX_ON: i32 = libc::HWTSTAMP_TX_ON as i32;
pub const FILTER_ALL: i32 = libc::HWTSTAMP_FILTER_ALL as i32;

#[derive(Debug, thiserror::Error)]
pub enum HwStampError {
    #[error("socket for the timestamping ioctls: {0}")]
    Socket(io::Error),
    #[error("SIOCGHWTSTAMP (reading the current config): {0}")]
    Get(io::Error),
    #[error("SIOCSHWTSTAMP: {0}")]
    Set(io::Error),
}

/// SIOCGHWTSTAMP and SIOCSHWTSTAMP on a device by name.
pub trait HwStampIoctl {
    fn get(&mut self, dev: &str) -> Result<HwStampConfig, HwStampError>;
    /// Sets `config`; returns what the driver applied (it writes the config back, and may
    /// widen the RX filter).
    fn set(&mut self, dev: &str, config: HwStampConfig) -> Result<HwStampConfig, HwStampError>;
}

/// The config `--hw-timestamps` would set over `current`, or why the device is left alone.
/// TX stamps are what meshlab uses (`tx_tstamp_hw`), so TX `on` is required; RX `all` is set
/// only where TSINFO offers it, else the current RX filter is kept.
pub fn plan(ts: Option<&Timestamping>, current: HwStampConfig) -> Result<HwStampConfig, String> {
    let ts = ts.ok_or("its timestamping capabilities could not be read (TSINFO)")?;
    if !ts.hardware_tx || !ts.tx_types.iter().any(|t| t == "on") {
        return Err("TSINFO lists no hardware-transmit stamping with TX type `on`".into());
    }
    let rx_all = ts.hardware_rx && ts.rx_filters.iter().any(|f| f == "all");
    Ok(HwStampConfig {
        flags: current.flags,
        tx_type: TX_ON,
        rx_filter: if rx_all {
            FILTER_ALL
        } else {
            current.rx_filter
        },
    })
}

/// What `doctor` says `--hw-timestamps` would do to a device.
pub fn doctor_line(ctx: &DeviceContext) -> String {
    let what = match plan(ctx.timestamping.as_ref(), HwStampConfig::default()) {
        Ok(c) if c.rx_filter == FILTER_ALL => "would switch hardware stamping on (TX on, RX all)",
        Ok(_) => "would switch hardware TX stamping on (RX filter `all` not offered: kept)",
        Err(why) => return format!("would leave it alone: {why}"),
    };
    let clock = match ctx.timestamping.as_ref().and_then(|t| t.phc_index) {
        Some(i) => format!("read its clock /dev/ptp{i} with every clock record"),
        None => "no NIC clock (PHC): its stamps cannot be placed on the system clock".into(),
    };
    format!("{what}, {clock}, and restore it at exit")
}

/// Devices switched on by this recorder, with the config to put back; restores on drop.
pub struct HwStampSwitch<I: HwStampIoctl> {
    io: I,
    saved: Vec<(String, HwStampConfig)>,
}

impl<I: HwStampIoctl> HwStampSwitch<I> {
    /// Switches every device of `devices` that can stamp and writes what happened into its
    /// `hw_timestamps`; a device left alone is reported on stderr.
    pub fn switch_on(io: I, devices: &mut [DeviceContext]) -> Self {
        let mut switch = Self {
            io,
            saved: Vec::new(),
        };
        for ctx in devices.iter_mut() {
            let outcome = switch.switch_one(ctx);
            if outcome.outcome != HwTimestampsOutcome::SwitchedOn {
                log::warn!(
                    "--hw-timestamps: {} NOT switched to hardware stamping ({}): {}",
                    ctx.dev,
                    outcome.outcome.as_str(),
                    outcome.error.as_deref().unwrap_or("")
                );
            }
            ctx.hw_timestamps = Some(outcome);
        }
        switch
    }

    /// Whether any device was switched on (its restore needs CAP_NET_ADMIN at exit).
    pub fn any_switched(&self) -> bool {
        !self.saved.is_empty()
    }

    fn switch_one(&mut self, ctx: &DeviceContext) -> HwTimestamps {
        let left_alone = |outcome, error: String| HwTimestamps {
            outcome,
            previous: None,
            active: None,
            error: Some(error),
        };
        if let Err(why) = plan(ctx.timestamping.as_ref(), HwStampConfig::default()) {
            return left_alone(HwTimestampsOutcome::NotCapable, why);
        }
        // Without the current config there is nothing to restore: do not touch the device.
        let previous = match self.io.get(&ctx.dev) {
            Ok(c) => c,
            Err(e) => return left_alone(HwTimestampsOutcome::Failed, e.to_string()),
        };
        let wanted = plan(ctx.timestamping.as_ref(), previous).expect("checked above");
        match self.io.set(&ctx.dev, wanted) {
            Ok(active) => {
                self.saved.push((ctx.dev.clone(), previous));
                HwTimestamps {
                    outcome: HwTimestampsOutcome::SwitchedOn,
                    previous: Some(previous),
                    active: Some(active),
                    error: None,
                }
            }
            Err(e) => {
                self.undo_failed_set(&ctx.dev, previous);
                left_alone(HwTimestampsOutcome::Failed, e.to_string())
            }
        }
    }

    /// A driver should apply nothing when it refuses a set; if it applied part anyway, put
    /// the previous config back so a failed set leaves the device as it was.
    fn undo_failed_set(&mut self, dev: &str, previous: HwStampConfig) {
        if self.io.get(dev).is_ok_and(|now| now != previous)
            && let Err(e) = self.io.set(dev, previous)
        {
            log::warn!("--hw-timestamps: {dev}: restoring after a failed set: {e}");
        }
    }

    /// Puts every saved config back (once: a second call does nothing); the failures.
    pub fn restore(&mut self) -> Vec<(String, HwStampError)> {
        let mut failed = Vec::new();
        for (dev, previous) in std::mem::take(&mut self.saved) {
            match self.io.set(&dev, previous) {
                Ok(_) => log::info!("--hw-timestamps: {dev}: hardware stamping config restored"),
                Err(e) => failed.push((dev, e)),
            }
        }
        failed
    }
}

impl<I: HwStampIoctl> Drop for HwStampSwitch<I> {
    fn drop(&mut self) {
        for (dev, e) in self.restore() {
            log::warn!(
                "--hw-timestamps: {dev}: could NOT restore the previous hardware stamping \
                 config ({e}); check it with `hwstamp_ctl -i {dev}`"
            );
        }
    }
}

#[cfg(test)]
#[path = "hwstamp_tests.rs"]
mod tests;
