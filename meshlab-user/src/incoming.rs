//! What a reader hands on ([`Incoming`]): a capture's kernel event as the borrowed twin of
//! its NDJSON line ([`KernelLine`], which crate::decode also serializes), any other record
//! owned. The merge reduces both kinds of kernel event from a `KernelLine`.

use std::net::{IpAddr, Ipv6Addr};

use serde::Serialize;

use crate::schema::{Direction, Hook, KernelEvent, Record};

/// A record as a reader hands it on: a capture's kernel event as its decoder's borrowed line
/// (no owned event per record), any other record owned.
// `Owned` holds the Record by value, as the readers always handed it on: boxing it would add an
// allocation per NDJSON line, and the value is consumed where it is made.
#[allow(clippy::large_enum_variant)]
pub enum Incoming<'a> {
    Kernel(&'a KernelLine<'a>),
    Owned(Record),
}

impl Incoming<'_> {
    /// The record's `"type"` tag.
    pub fn type_name(&self) -> &'static str {
        match self {
            Incoming::Kernel(_) => "kernel",
            Incoming::Owned(r) => r.type_name(),
        }
    }

    pub fn into_owned(self) -> Record {
        match self {
            Incoming::Kernel(k) => Record::Kernel(k.to_event()),
            Incoming::Owned(r) => r,
        }
    }
}

/// A 16-byte address printed as IPv4 when IPv4-mapped, else IPv6; serialized without an
/// intermediate String.
#[derive(Clone, Copy, Debug)]
pub struct Addr(pub [u8; 16]);

impl Addr {
    fn to_ip(self) -> IpAddr {
        let v6 = Ipv6Addr::from(self.0);
        v6.to_ipv4_mapped()
            .map(IpAddr::V4)
            .unwrap_or(IpAddr::V6(v6))
    }
}

/// An address of a [`KernelLine`]: a decoded event's raw bytes, printed only when needed (the
/// merge reads the addresses of `sock_established` alone), or a parsed line's text.
#[derive(Clone, Copy, Debug)]
pub enum LineAddr<'a> {
    Raw(Addr),
    Text(&'a str),
}

impl LineAddr<'_> {
    /// The address as its NDJSON line writes it.
    pub fn text(self) -> String {
        match self {
            LineAddr::Raw(a) => a.to_ip().to_string(),
            LineAddr::Text(t) => t.to_owned(),
        }
    }
}

impl Serialize for LineAddr<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            LineAddr::Raw(a) => s.collect_str(&a.to_ip()),
            LineAddr::Text(t) => s.serialize_str(t),
        }
    }
}

/// Borrowed twin of [`crate::schema::KernelEvent`]: same fields, same order, same omissions
/// (a test checks that every line parses back as a `KernelEvent` with unknown fields denied).
/// The merge reduces both a capture's decoded events and parsed NDJSON ones
/// ([`KernelLine::of`]) from it.
#[derive(Clone, Copy, Debug, Serialize)]
#[serde(tag = "type", rename = "kernel")]
pub struct KernelLine<'a> {
    pub node: &'a str,
    pub hook: Hook,
    pub ts_ns: u64,
    pub cpu: u32,
    pub pid: u32,
    pub tid: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cookie: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub skb: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seq: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub len: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub offset: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dir: Option<Direction>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ifindex: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dev: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub aux: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub saddr: Option<LineAddr<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sport: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub daddr: Option<LineAddr<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dport: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub irq: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub irq_entry_ns: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub softirq_raise_ns: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub softirq_entry_ns: Option<u64>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub retrans: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub active: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unix_sock: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unix_peer: Option<u64>,
}

impl<'a> KernelLine<'a> {
    /// The owned event its NDJSON line parses to.
    pub fn to_event(&self) -> KernelEvent {
        KernelEvent {
            node: self.node.to_owned(),
            hook: self.hook,
            ts_ns: self.ts_ns,
            cpu: self.cpu,
            pid: self.pid,
            tid: self.tid,
            cookie: self.cookie,
            skb: self.skb,
            seq: self.seq,
            len: self.len,
            offset: self.offset,
            dir: self.dir,
            ifindex: self.ifindex,
            dev: self.dev.map(str::to_owned),
            queue: self.queue,
            value: self.value,
            aux: self.aux,
            saddr: self.saddr.map(LineAddr::text),
            sport: self.sport,
            daddr: self.daddr.map(LineAddr::text),
            dport: self.dport,
            irq: self.irq,
            irq_entry_ns: self.irq_entry_ns,
            softirq_raise_ns: self.softirq_raise_ns,
            softirq_entry_ns: self.softirq_entry_ns,
            retrans: self.retrans,
            active: self.active,
            unix_sock: self.unix_sock,
            unix_peer: self.unix_peer,
        }
    }

    /// The line of a parsed event, borrowing its Strings.
    pub fn of(k: &'a KernelEvent) -> KernelLine<'a> {
        KernelLine {
            node: &k.node,
            hook: k.hook,
            ts_ns: k.ts_ns,
            cpu: k.cpu,
            pid: k.pid,
            tid: k.tid,
            cookie: k.cookie,
            skb: k.skb,
            seq: k.seq,
            len: k.len,
            offset: k.offset,
            dir: k.dir,
            ifindex: k.ifindex,
            dev: k.dev.as_deref(),
            queue: k.queue,
            value: k.value,
            aux: k.aux,
            saddr: k.saddr.as_deref().map(LineAddr::Text),
            sport: k.sport,
            daddr: k.daddr.as_deref().map(LineAddr::Text),
            dport: k.dport,
            irq: k.irq,
            irq_entry_ns: k.irq_entry_ns,
            softirq_raise_ns: k.softirq_raise_ns,
            softirq_entry_ns: k.softirq_entry_ns,
            retrans: k.retrans,
            active: k.active,
            unix_sock: k.unix_sock,
            unix_peer: k.unix_peer,
        }
    }
}
