//! What a device's timestamping capabilities mean for a recording, in words: `doctor` prints it
//! before a run and `report --nic` next to the stages, so a reader knows whether the NIC and
//! wire time could have been split or is one derived segment by necessity.

use crate::schema::DeviceContext;

/// One line per device: which stamps it can give and what meshlab does with them.
pub fn verdict(ctx: &DeviceContext) -> String {
    let Some(ts) = &ctx.timestamping else {
        let why = ctx
            .unavailable
            .iter()
            .find(|u| u.starts_with("timestamping"))
            .map_or("not read", String::as_str);
        return format!("unknown ({why}): no stage relies on NIC stamps");
    };
    let software = match (ts.software_tx, ts.software_rx) {
        (true, true) => "software TX and RX",
        (true, false) => "software TX only",
        (false, true) => "software RX only",
        (false, false) => "no software stamps",
    };
    if !ts.hardware_tx && !ts.hardware_rx {
        return format!(
            "{software}; NO hardware stamps: NIC send and wire stay inside the derived network segment"
        );
    }
    let clock = ts
        .phc_index
        .map_or_else(|| "no PHC".to_owned(), |i| format!("PHC /dev/ptp{i}"));
    let hardware = match (ts.hardware_tx, ts.hardware_rx) {
        (true, true) => "hardware TX and RX",
        (true, false) => "hardware TX only",
        _ => "hardware RX only",
    };
    format!(
        "{software}; {hardware} ({clock}): tx_tstamp_hw appears only while hardware stamping is on (record --hw-timestamps switches it on, or something else did); the NIC clock is not mapped to system time"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::Timestamping;

    fn ctx(ts: Option<Timestamping>, unavailable: &[&str]) -> DeviceContext {
        DeviceContext {
            dev: "eth0".into(),
            timestamping: ts,
            unavailable: unavailable.iter().map(|s| s.to_string()).collect(),
            ..DeviceContext::default()
        }
    }

    #[test]
    fn software_only_hardware_and_unreadable_devices_are_told_apart() {
        let virtio = Timestamping {
            software_tx: true,
            software_rx: true,
            ..Timestamping::default()
        };
        let v = verdict(&ctx(Some(virtio), &[]));
        assert!(v.starts_with("software TX and RX; NO hardware"), "{v}");
        let nic = Timestamping {
            software_tx: true,
            hardware_tx: true,
            hardware_rx: true,
            phc_index: Some(3),
            ..Timestamping::default()
        };
        let v = verdict(&ctx(Some(nic), &[]));
        assert!(v.contains("hardware TX and RX (PHC /dev/ptp3)"), "{v}");
        assert!(v.starts_with("software TX only"), "{v}");
        let v = verdict(&ctx(
            None,
            &["timestamping: Operation not supported (os error 95)"],
        ));
        assert!(v.contains("Operation not supported"), "{v}");
    }
}
