//! The save / set / restore order of `--hw-timestamps` on fake devices.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::io;
use std::rc::Rc;

use super::*;

/// Fake devices: their current config, shared with the test after the switch owns the fake.
#[derive(Clone, Default)]
struct Fake {
    configs: Rc<RefCell<BTreeMap<String, HwStampConfig>>>,
    /// Devices whose set fails; `true`: after applying the TX type (a driver that is wrong).
    refuse_set: BTreeMap<String, bool>,
    calls: Rc<RefCell<Vec<String>>>,
}

impl Fake {
    fn with(devs: &[(&str, HwStampConfig)]) -> Self {
        let fake = Self::default();
        for (dev, c) in devs {
            fake.configs.borrow_mut().insert(dev.to_string(), *c);
        }
        fake
    }

    fn config(&self, dev: &str) -> HwStampConfig {
        self.configs.borrow()[dev]
    }
}

impl HwStampIoctl for Fake {
    fn get(&mut self, dev: &str) -> Result<HwStampConfig, HwStampError> {
        self.calls.borrow_mut().push(format!("get {dev}"));
        self.configs
            .borrow()
            .get(dev)
            .copied()
            .ok_or_else(|| HwStampError::Get(io::Error::from_raw_os_error(libc::EOPNOTSUPP)))
    }

    fn set(&mut self, dev: &str, c: HwStampConfig) -> Result<HwStampConfig, HwStampError> {
        self.calls
            .borrow_mut()
            .push(format!("set {dev} {}/{}", c.tx_type, c.rx_filter));
        let mut configs = self.configs.borrow_mut();
        let current = configs.get_mut(dev).expect("set on a known device");
        if let Some(&partial) = self.refuse_set.get(dev) {
            if partial {
                current.tx_type = c.tx_type;
            }
            return Err(HwStampError::Set(io::Error::from_raw_os_error(
                libc::ERANGE,
            )));
        }
        *current = c;
        Ok(c)
    }
}

const OFF: HwStampConfig = HwStampConfig {
    flags: 0,
    tx_type: 0,
    rx_filter: 0,
};
/// Set by someone else before the recording (ptp4l: TX on, PTPv2 event filter 12).
const PTP4L: HwStampConfig = HwStampConfig {
    flags: 0,
    tx_type: 1,
    rx_filter: 12,
};

fn stamping_nic(dev: &str, rx_all: bool) -> DeviceContext {
    let filters = if rx_all {
        vec!["none", "all"]
    } else {
        vec!["none", "ptpv2-event"]
    };
    DeviceContext {
        dev: dev.into(),
        timestamping: Some(Timestamping {
            hardware_tx: true,
            hardware_rx: true,
            phc_index: Some(0),
            tx_types: vec!["off".into(), "on".into()],
            rx_filters: filters.into_iter().map(String::from).collect(),
            ..Timestamping::default()
        }),
        ..DeviceContext::default()
    }
}

fn virtio(dev: &str) -> DeviceContext {
    DeviceContext {
        dev: dev.into(),
        timestamping: Some(Timestamping {
            software_tx: true,
            software_rx: true,
            ..Timestamping::default()
        }),
        ..DeviceContext::default()
    }
}

#[test]
fn saved_set_and_restored_at_a_normal_end() {
    let fake = Fake::with(&[("eth0", PTP4L), ("eth1", OFF)]);
    let mut devices = vec![stamping_nic("eth0", true), stamping_nic("eth1", false)];
    let mut switch = HwStampSwitch::switch_on(fake.clone(), &mut devices);
    assert!(switch.any_switched());
    let on = HwStampConfig {
        flags: 0,
        tx_type: TX_ON,
        rx_filter: FILTER_ALL,
    };
    assert_eq!(fake.config("eth0"), on);
    // No `all` filter offered: TX on, the RX filter it had.
    assert_eq!(
        fake.config("eth1"),
        HwStampConfig {
            tx_type: TX_ON,
            ..OFF
        }
    );
    let eth0 = devices[0].hw_timestamps.clone().expect("recorded");
    assert_eq!(eth0.outcome, HwTimestampsOutcome::SwitchedOn);
    assert_eq!((eth0.previous, eth0.active), (Some(PTP4L), Some(on)));
    assert!(switch.restore().is_empty());
    assert_eq!((fake.config("eth0"), fake.config("eth1")), (PTP4L, OFF));
    let calls = fake.calls.borrow().len();
    drop(switch);
    assert_eq!(
        fake.calls.borrow().len(),
        calls,
        "restored once, not again on drop"
    );
}

#[test]
fn restored_on_drop_and_on_an_error_path() {
    let fake = Fake::with(&[("eth0", OFF)]);
    let mut devices = vec![stamping_nic("eth0", true)];
    drop(HwStampSwitch::switch_on(fake.clone(), &mut devices));
    assert_eq!(fake.config("eth0"), OFF);

    fn record_that_fails(fake: &Fake, devices: &mut [DeviceContext]) -> anyhow::Result<()> {
        let _switch = HwStampSwitch::switch_on(fake.clone(), devices);
        assert_eq!(fake.config("eth0").tx_type, TX_ON);
        anyhow::bail!("disk full")
    }
    assert!(record_that_fails(&fake, &mut devices).is_err());
    assert_eq!(fake.config("eth0"), OFF);
}

#[test]
fn a_device_without_hardware_stamping_is_untouched() {
    let fake = Fake::with(&[("eth0", OFF)]);
    let mut devices = vec![
        virtio("eth0"),
        DeviceContext {
            dev: "eth9".into(),
            ..Default::default()
        },
    ];
    let switch = HwStampSwitch::switch_on(fake.clone(), &mut devices);
    assert!(!switch.any_switched());
    assert!(fake.calls.borrow().is_empty(), "{:?}", fake.calls.borrow());
    for d in &devices {
        let hw = d.hw_timestamps.as_ref().expect("recorded");
        assert_eq!(hw.outcome, HwTimestampsOutcome::NotCapable);
        assert!(hw.previous.is_none() && hw.error.is_some());
    }
    assert!(doctor_line(&devices[0]).starts_with("would leave it alone"));
    let line = doctor_line(&stamping_nic("x", true));
    assert!(line.contains("TX on, RX all"), "{line}");
    assert!(line.contains("/dev/ptp0 with every clock record"), "{line}");
}

#[test]
fn a_failed_set_or_get_leaves_nothing_changed() {
    let mut fake = Fake::with(&[("eth0", PTP4L), ("eth1", OFF)]);
    fake.refuse_set.insert("eth0".into(), false);
    fake.refuse_set.insert("eth1".into(), true);
    // eth2 answers no SIOCGHWTSTAMP: without the config to restore it is not set.
    let mut devices = vec![
        stamping_nic("eth0", true),
        stamping_nic("eth1", true),
        stamping_nic("eth2", true),
    ];
    let switch = HwStampSwitch::switch_on(fake.clone(), &mut devices);
    assert!(!switch.any_switched());
    assert_eq!(fake.config("eth0"), PTP4L);
    // eth1's driver applied part of the refused set: it was put back at once.
    assert_eq!(fake.config("eth1"), OFF);
    assert!(
        !fake
            .calls
            .borrow()
            .iter()
            .any(|c| c.starts_with("set eth2"))
    );
    for d in &devices {
        let hw = d.hw_timestamps.as_ref().expect("recorded");
        assert_eq!(hw.outcome, HwTimestampsOutcome::Failed, "{}", d.dev);
        assert!(hw.previous.is_none(), "nothing to restore for {}", d.dev);
    }
    let error = |i: usize| {
        let hw = devices[i].hw_timestamps.as_ref().unwrap();
        hw.error.clone().unwrap_or_default()
    };
    assert!(error(0).contains("SIOCSHWTSTAMP"), "{}", error(0));
    assert!(error(2).contains("SIOCGHWTSTAMP"), "{}", error(2));
}
