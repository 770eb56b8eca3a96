//! A small client for ethtool's generic-netlink interface (the kernel's
//! `include/uapi/linux/ethtool_netlink.h`), just the GET requests the device context needs, and
//! the one ioctl netlink has no equivalent for (driver and firmware names).
//!
//! Message layout: netlink header (16 bytes), genetlink header (4 bytes), then attributes
//! (`len: u16, type: u16, payload` padded to 4 bytes). Every request carries a nested header
//! attribute naming the device.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use crate::schema::{Channels, Coalesce, Offloads, Rings, Timestamping};

const NETLINK_GENERIC: i32 = 16;
const GENL_ID_CTRL: u16 = 16;
const CTRL_CMD_GETFAMILY: u8 = 3;
const CTRL_ATTR_FAMILY_ID: u16 = 1;
const CTRL_ATTR_FAMILY_NAME: u16 = 2;
const NLMSG_ERROR: u16 = 2;
const NLM_F_REQUEST: u16 = 1;
const NLA_F_NESTED: u16 = 1 << 15;
const NLA_TYPE_MASK: u16 = !(NLA_F_NESTED | (1 << 14));

/// ETHTOOL_MSG_*_GET commands.
const MSG_FEATURES_GET: u8 = 11;
const MSG_RINGS_GET: u8 = 15;
const MSG_CHANNELS_GET: u8 = 17;
const MSG_COALESCE_GET: u8 = 19;
const MSG_TSINFO_GET: u8 = 25;
/// ETHTOOL_A_*_HEADER is attribute 1 of every request; in it, ETHTOOL_A_HEADER_DEV_NAME is 2.
const A_HEADER: u16 = 1;
const A_HEADER_DEV_NAME: u16 = 2;

#[derive(Debug, thiserror::Error)]
pub(crate) enum EthtoolError {
    #[error("netlink socket: {0}")]
    Socket(io::Error),
    #[error("the kernel has no `ethtool` generic-netlink family (CONFIG_ETHTOOL_NETLINK off?)")]
    NoFamily,
    #[error("{0}")]
    Kernel(io::Error),
    #[error("malformed netlink reply: {0}")]
    Malformed(&'static str),
}

/// One netlink socket with the ethtool family resolved.
pub(crate) struct EthtoolSocket {
    fd: OwnedFd,
    family: u16,
    seq: u32,
}

impl EthtoolSocket {
    pub fn open() -> Result<Self, EthtoolError> {
        // SAFETY: plain socket(2) call; the result is checked before use.
        let raw = unsafe { libc::socket(libc::AF_NETLINK, libc::SOCK_RAW, NETLINK_GENERIC) };
        if raw < 0 {
            return Err(EthtoolError::Socket(io::Error::last_os_error()));
        }
        // SAFETY: `raw` is a fresh descriptor nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let mut sock = EthtoolSocket {
            fd,
            family: GENL_ID_CTRL,
            seq: 0,
        };
        let name = attr(CTRL_ATTR_FAMILY_NAME, b"ethtool\0");
        let reply = sock.request(GENL_ID_CTRL, CTRL_CMD_GETFAMILY, &name)?;
        sock.family = attrs(&reply)
            .find(|(t, _)| *t == CTRL_ATTR_FAMILY_ID)
            .and_then(|(_, p)| Some(u16::from_ne_bytes(p.get(..2)?.try_into().ok()?)))
            .ok_or(EthtoolError::NoFamily)?;
        Ok(sock)
    }

    pub fn rings(&mut self, dev: &str) -> Result<Rings, EthtoolError> {
        let reply = self.get(MSG_RINGS_GET, dev)?;
        let u = |t| u32_attr(&reply, t).unwrap_or(0);
        // ETHTOOL_A_RINGS_RX_MAX 2, TX_MAX 5, RX 6, TX 9.
        Ok(Rings {
            rx: u(6),
            tx: u(9),
            rx_max: u(2),
            tx_max: u(5),
        })
    }

    pub fn channels(&mut self, dev: &str) -> Result<Channels, EthtoolError> {
        let reply = self.get(MSG_CHANNELS_GET, dev)?;
        let u = |t| u32_attr(&reply, t).unwrap_or(0);
        // ETHTOOL_A_CHANNELS_{RX,TX,OTHER,COMBINED}_MAX 2..5, then the counts 6..9.
        Ok(Channels {
            rx_max: u(2),
            tx_max: u(3),
            other_max: u(4),
            combined_max: u(5),
            rx: u(6),
            tx: u(7),
            other: u(8),
            combined: u(9),
        })
    }

    pub fn coalesce(&mut self, dev: &str) -> Result<Coalesce, EthtoolError> {
        let reply = self.get(MSG_COALESCE_GET, dev)?;
        let flag = |t| {
            attrs(&reply)
                .find(|(a, _)| *a == t)
                .map(|(_, p)| p.first() != Some(&0))
        };
        // ETHTOOL_A_COALESCE_RX_USECS 2, RX_MAX_FRAMES 3, TX_USECS 6, TX_MAX_FRAMES 7,
        // USE_ADAPTIVE_RX 11, USE_ADAPTIVE_TX 12 (u8).
        Ok(Coalesce {
            rx_usecs: u32_attr(&reply, 2),
            rx_max_frames: u32_attr(&reply, 3),
            tx_usecs: u32_attr(&reply, 6),
            tx_max_frames: u32_attr(&reply, 7),
            adaptive_rx: flag(11),
            adaptive_tx: flag(12),
        })
    }

    pub fn offloads(&mut self, dev: &str) -> Result<Offloads, EthtoolError> {
        let reply = self.get(MSG_FEATURES_GET, dev)?;
        // ETHTOOL_A_FEATURES_ACTIVE (4) is a verbose bitset listing the active features by name.
        let active = attrs(&reply)
            .find(|(t, _)| *t == 4)
            .map(|(_, p)| bitset_names(p))
            .ok_or(EthtoolError::Malformed("no active-features bitset"))?;
        Ok(offloads_from_names(&active))
    }

    pub fn timestamping(&mut self, dev: &str) -> Result<Timestamping, EthtoolError> {
        let reply = self.get(MSG_TSINFO_GET, dev)?;
        Ok(timestamping_from_reply(&reply))
    }

    /// Sends `cmd` for `dev` to the ethtool family; returns the reply's attributes.
    fn get(&mut self, cmd: u8, dev: &str) -> Result<Vec<u8>, EthtoolError> {
        let mut name = dev.as_bytes().to_vec();
        name.push(0);
        let header = attr(A_HEADER | NLA_F_NESTED, &attr(A_HEADER_DEV_NAME, &name));
        self.request(self.family, cmd, &header)
    }

    fn request(&mut self, family: u16, cmd: u8, payload: &[u8]) -> Result<Vec<u8>, EthtoolError> {
        self.seq += 1;
        let message = encode_request(family, cmd, self.seq, payload);
        // SAFETY: the buffer is valid for its length; send(2) copies it.
        let sent = unsafe {
            libc::send(
                self.fd.as_raw_fd(),
                message.as_ptr().cast(),
                message.len(),
                0,
            )
        };
        if sent < 0 {
            return Err(EthtoolError::Socket(io::Error::last_os_error()));
        }
        let mut buf = vec![0u8; 64 * 1024];
        // SAFETY: the buffer is valid and writable for its length.
        let got = unsafe { libc::recv(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if got < 0 {
            return Err(EthtoolError::Socket(io::Error::last_os_error()));
        }
        buf.truncate(got as usize);
        decode_reply(&buf)
    }
}

/// Netlink + genetlink headers around `payload`.
fn encode_request(family: u16, cmd: u8, seq: u32, payload: &[u8]) -> Vec<u8> {
    let len = 16 + 4 + payload.len();
    let mut m = Vec::with_capacity(len);
    m.extend_from_slice(&(len as u32).to_ne_bytes());
    m.extend_from_slice(&family.to_ne_bytes());
    m.extend_from_slice(&NLM_F_REQUEST.to_ne_bytes());
    m.extend_from_slice(&seq.to_ne_bytes());
    m.extend_from_slice(&0u32.to_ne_bytes());
    m.extend_from_slice(&[cmd, 1, 0, 0]);
    m.extend_from_slice(payload);
    m
}

/// The attributes of a reply, or the kernel's error.
fn decode_reply(buf: &[u8]) -> Result<Vec<u8>, EthtoolError> {
    let len = buf
        .get(..4)
        .map(|b| u32::from_ne_bytes(b.try_into().expect("4 bytes")) as usize)
        .ok_or(EthtoolError::Malformed("short netlink header"))?;
    let kind = u16::from_ne_bytes([buf[4], buf[5]]);
    let body = buf
        .get(16..len.min(buf.len()))
        .ok_or(EthtoolError::Malformed("length beyond the datagram"))?;
    if kind == NLMSG_ERROR {
        let code = body
            .get(..4)
            .map(|b| i32::from_ne_bytes(b.try_into().expect("4 bytes")))
            .ok_or(EthtoolError::Malformed("short error message"))?;
        return Err(EthtoolError::Kernel(io::Error::from_raw_os_error(-code)));
    }
    Ok(body
        .get(4..)
        .ok_or(EthtoolError::Malformed("short genetlink header"))?
        .to_vec())
}

/// One attribute, padded to 4 bytes.
fn attr(kind: u16, payload: &[u8]) -> Vec<u8> {
    let len = 4 + payload.len();
    let mut a = Vec::with_capacity(len.next_multiple_of(4));
    a.extend_from_slice(&(len as u16).to_ne_bytes());
    a.extend_from_slice(&kind.to_ne_bytes());
    a.extend_from_slice(payload);
    a.resize(len.next_multiple_of(4), 0);
    a
}

/// (type without flag bits, payload) of each attribute in `buf`; stops at a malformed one.
fn attrs(buf: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    let mut rest = buf;
    std::iter::from_fn(move || {
        let len = usize::from(u16::from_ne_bytes(rest.get(..2)?.try_into().ok()?));
        let kind = u16::from_ne_bytes(rest.get(2..4)?.try_into().ok()?) & NLA_TYPE_MASK;
        let payload = rest.get(4..len)?;
        rest = rest.get(len.next_multiple_of(4)..).unwrap_or_default();
        Some((kind, payload))
    })
}

fn u32_attr(buf: &[u8], kind: u16) -> Option<u32> {
    let (_, p) = attrs(buf).find(|(t, _)| *t == kind)?;
    Some(u32::from_ne_bytes(p.get(..4)?.try_into().ok()?))
}

/// Names of the set bits of a verbose bitset (ETHTOOL_A_BITSET_BITS (3) holding BIT (1) nests
/// of INDEX (1), NAME (2), VALUE (3, a flag)). Without NOMASK (1) a bit is set only with VALUE.
fn bitset_names(bitset: &[u8]) -> Vec<String> {
    let list_only = attrs(bitset).any(|(t, _)| t == 1);
    attrs(bitset)
        .filter(|(t, _)| *t == 3)
        .flat_map(|(_, bits)| attrs(bits).filter(|(t, _)| *t == 1))
        .filter_map(|(_, bit)| {
            let set = list_only || attrs(bit).any(|(t, _)| t == 3);
            let (_, name) = attrs(bit).find(|(t, _)| *t == 2)?;
            set.then(|| String::from_utf8_lossy(name.strip_suffix(b"\0").unwrap_or(name)).into())
        })
        .collect()
}

fn offloads_from_names(active: &[String]) -> Offloads {
    let on = |name: &str| active.iter().any(|a| a == name);
    Offloads {
        tso: on("tx-tcp-segmentation"),
        gso: on("tx-generic-segmentation"),
        gro: on("rx-gro"),
        gro_hw: on("rx-gro-hw"),
        lro: on("rx-lro"),
        rx_hash: on("rx-hashing"),
    }
}

/// ETHTOOL_A_TSINFO_TIMESTAMPING (2), TX_TYPES (3) and RX_FILTERS (4) are bitsets (sent as
/// lists: only the set bits), PHC_INDEX (5) a u32 present only when the device has a clock.
fn timestamping_from_reply(reply: &[u8]) -> Timestamping {
    let names = |kind| {
        attrs(reply)
            .find(|(t, _)| *t == kind)
            .map(|(_, p)| bitset_names(p))
            .unwrap_or_default()
    };
    let caps = names(2);
    let has = |name: &str| caps.iter().any(|c| c == name);
    Timestamping {
        software_tx: has("software-transmit"),
        software_rx: has("software-receive"),
        hardware_tx: has("hardware-transmit"),
        hardware_rx: has("hardware-receive"),
        hardware_raw_clock: has("hardware-raw-clock"),
        phc_index: u32_attr(reply, 5),
        tx_types: names(3),
        rx_filters: names(4),
    }
}

/// Driver, driver version, firmware and bus address (ETHTOOL_GDRVINFO through SIOCETHTOOL):
/// the ethtool netlink family has no request for them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct DriverInfo {
    pub driver: String,
    pub version: String,
    pub firmware: String,
    pub bus_info: String,
}

pub(crate) fn driver_info(dev: &str) -> Result<DriverInfo, EthtoolError> {
    const ETHTOOL_GDRVINFO: u32 = 3;
    const SIOCETHTOOL: libc::c_ulong = 0x8946;
    // struct ethtool_drvinfo: cmd, then 32-byte driver, version, fw_version, bus_info, ...
    let mut info = [0u8; 196];
    info[..4].copy_from_slice(&ETHTOOL_GDRVINFO.to_ne_bytes());
    // SAFETY: an all-zero ifreq is valid; the name is copied in bounds (IFNAMSIZ - 1 at most).
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in ifr
        .ifr_name
        .iter_mut()
        .zip(dev.bytes().take(libc::IFNAMSIZ - 1))
    {
        *dst = src as libc::c_char;
    }
    ifr.ifr_ifru.ifru_data = info.as_mut_ptr().cast();
    // SAFETY: plain socket(2) call; checked before use.
    let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM, 0) };
    if raw < 0 {
        return Err(EthtoolError::Socket(io::Error::last_os_error()));
    }
    // SAFETY: `raw` is a fresh descriptor nobody else owns.
    let sock = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: ifr points at `info`, which is large enough for struct ethtool_drvinfo and lives
    // across the call.
    if unsafe { libc::ioctl(sock.as_raw_fd(), SIOCETHTOOL as _, &mut ifr) } < 0 {
        return Err(EthtoolError::Kernel(io::Error::last_os_error()));
    }
    let field = |at: usize| {
        let raw = &info[at..at + 32];
        let end = raw.iter().position(|&b| b == 0).unwrap_or(32);
        String::from_utf8_lossy(&raw[..end]).into_owned()
    };
    Ok(DriverInfo {
        driver: field(4),
        version: field(36),
        firmware: field(68),
        bus_info: field(100),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bit(index: u32, name: &str, value: bool) -> Vec<u8> {
        let mut n = name.as_bytes().to_vec();
        n.push(0);
        let mut inner = attr(1, &index.to_ne_bytes());
        inner.extend(attr(2, &n));
        if value {
            inner.extend(attr(3, &[]));
        }
        attr(1 | NLA_F_NESTED, &inner)
    }

    #[test]
    fn verbose_bitset_with_and_without_mask() {
        let mut bits = bit(0, "tx-tcp-segmentation", true);
        bits.extend(bit(1, "rx-lro", false));
        bits.extend(bit(2, "rx-gro", true));
        let masked = attr(3 | NLA_F_NESTED, &bits);
        assert_eq!(bitset_names(&masked), vec!["tx-tcp-segmentation", "rx-gro"]);
        let mut list = attr(1, &[]);
        list.extend(attr(3 | NLA_F_NESTED, &bit(5, "rx-lro", false)));
        assert_eq!(bitset_names(&list), vec!["rx-lro"]);
        let offloads = offloads_from_names(&bitset_names(&masked));
        assert!(offloads.tso && offloads.gro && !offloads.lro && !offloads.gso);
    }

    fn list(bits: &[&str]) -> Vec<u8> {
        let mut nested = Vec::new();
        for (i, name) in bits.iter().enumerate() {
            nested.extend(bit(i as u32, name, false));
        }
        let mut set = attr(1, &[]);
        set.extend(attr(3 | NLA_F_NESTED, &nested));
        set
    }

    #[test]
    fn timestamping_capabilities_clock_and_modes() {
        // As a NIC that stamps in hardware answers (mlx5-like), and as virtio_net does.
        let mut reply = attr(
            2 | NLA_F_NESTED,
            &list(&[
                "hardware-transmit",
                "software-transmit",
                "hardware-receive",
                "software-receive",
                "hardware-raw-clock",
            ]),
        );
        reply.extend(attr(3 | NLA_F_NESTED, &list(&["off", "on"])));
        reply.extend(attr(4 | NLA_F_NESTED, &list(&["none", "all"])));
        reply.extend(attr(5, &2u32.to_ne_bytes()));
        let ts = timestamping_from_reply(&reply);
        assert!(ts.hardware_tx && ts.hardware_rx && ts.software_tx && ts.hardware_raw_clock);
        assert_eq!(ts.phc_index, Some(2));
        assert_eq!(ts.tx_types, vec!["off", "on"]);
        assert_eq!(ts.rx_filters, vec!["none", "all"]);
        let software_only = attr(
            2 | NLA_F_NESTED,
            &list(&["software-transmit", "software-receive"]),
        );
        let ts = timestamping_from_reply(&software_only);
        assert!(ts.software_tx && ts.software_rx && !ts.hardware_tx && !ts.hardware_rx);
        assert_eq!(ts.phc_index, None);
        assert!(ts.tx_types.is_empty());
    }

    #[test]
    fn reply_error_and_attributes() {
        let mut error = encode_request(NLMSG_ERROR, 0, 1, &[]);
        error.truncate(16);
        error.extend_from_slice(&(-libc::EOPNOTSUPP).to_ne_bytes());
        error[..4].copy_from_slice(&20u32.to_ne_bytes());
        match decode_reply(&error) {
            Err(EthtoolError::Kernel(e)) => assert_eq!(e.raw_os_error(), Some(libc::EOPNOTSUPP)),
            other => panic!("expected a kernel error, got {other:?}"),
        }
        let mut payload = attr(6, &256u32.to_ne_bytes());
        payload.extend(attr(9, &512u32.to_ne_bytes()));
        let reply = decode_reply(&encode_request(20, 16, 1, &payload)).expect("reply");
        assert_eq!(u32_attr(&reply, 6), Some(256));
        assert_eq!(u32_attr(&reply, 9), Some(512));
        assert_eq!(u32_attr(&reply, 2), None);
    }
}
