//! The live [`HwStampIoctl`]: SIOCGHWTSTAMP (0x89b1) and SIOCSHWTSTAMP (0x89b0) of
//! include/uapi/linux/sockios.h on an AF_INET datagram socket, with `ifr_data` pointing at a
//! `struct hwtstamp_config` (include/uapi/linux/net_tstamp.h: `int flags, tx_type,
//! rx_filter`). The get needs no capability; the set needs CAP_NET_ADMIN, also for the
//! restore at exit (kernel/privilege.rs keeps it for that).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use super::hwstamp::{HwStampError, HwStampIoctl};
use crate::schema::HwStampConfig;

/// One socket for every device (the ioctls name the device in the ifreq).
pub struct LiveIoctl {
    sock: OwnedFd,
}

impl LiveIoctl {
    pub fn open() -> Result<Self, HwStampError> {
        // SAFETY: plain socket(2) call; the result is checked before use.
        let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM, 0) };
        if raw < 0 {
            return Err(HwStampError::Socket(io::Error::last_os_error()));
        }
        // SAFETY: `raw` is a fresh descriptor nobody else owns.
        let sock = unsafe { OwnedFd::from_raw_fd(raw) };
        Ok(Self { sock })
    }

    /// Runs `request` with `config` as `ifr_data`; the kernel writes the config back.
    fn ioctl(
        &self,
        dev: &str,
        request: libc::c_ulong,
        config: &mut HwStampConfig,
    ) -> io::Result<()> {
        let mut raw = libc::hwtstamp_config {
            flags: config.flags,
            tx_type: config.tx_type,
            rx_filter: config.rx_filter,
        };
        // SAFETY: an all-zero ifreq is valid; the name is copied in bounds (IFNAMSIZ - 1).
        let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
        for (dst, src) in (ifr.ifr_name.iter_mut()).zip(dev.bytes().take(libc::IFNAMSIZ - 1)) {
            *dst = src as libc::c_char;
        }
        ifr.ifr_ifru.ifru_data = (&raw mut raw).cast();
        // SAFETY: ifr_data points at `raw`, a struct hwtstamp_config that lives across the call.
        if unsafe { libc::ioctl(self.sock.as_raw_fd(), request as _, &mut ifr) } < 0 {
            return Err(io::Error::last_os_error());
        }
        *config = HwStampConfig {
            flags: raw.flags,
            tx_type: raw.tx_type,
            rx_filter: raw.rx_filter,
        };
        Ok(())
    }
}

impl HwStampIoctl for LiveIoctl {
    fn get(&mut self, dev: &str) -> Result<HwStampConfig, HwStampError> {
        let mut config = HwStampConfig::default();
        self.ioctl(dev, libc::SIOCGHWTSTAMP, &mut config)
            .map_err(HwStampError::Get)?;
        Ok(config)
    }

    fn set(&mut self, dev: &str, mut config: HwStampConfig) -> Result<HwStampConfig, HwStampError> {
        self.ioctl(dev, libc::SIOCSHWTSTAMP, &mut config)
            .map_err(HwStampError::Set)?;
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uapi_numbers_and_layout() {
        // include/uapi/linux/sockios.h and net_tstamp.h, checked against the libc crate.
        assert_eq!(libc::SIOCSHWTSTAMP, 0x89b0);
        assert_eq!(libc::SIOCGHWTSTAMP, 0x89b1);
        assert_eq!(std::mem::size_of::<libc::hwtstamp_config>(), 12);
        assert_eq!((libc::HWTSTAMP_TX_OFF, libc::HWTSTAMP_TX_ON), (0, 1));
        assert_eq!(
            (libc::HWTSTAMP_FILTER_NONE, libc::HWTSTAMP_FILTER_ALL),
            (0, 1)
        );
    }

    #[test]
    fn loopback_has_no_hardware_stamping() {
        // lo has no ndo_hwtstamp_get: the kernel answers EOPNOTSUPP (or EINVAL on old ones).
        let mut io = LiveIoctl::open().expect("socket");
        match io.get("lo") {
            Err(HwStampError::Get(e)) => assert!(
                matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP | libc::EINVAL)),
                "{e}"
            ),
            other => panic!("lo answered SIOCGHWTSTAMP: {other:?}"),
        }
    }
}
