//! The request timelines of [`super::generate`], written as kernel and probe events.

use std::io;
use std::path::PathBuf;

use rand::rngs::StdRng;

use meshlab_user::schema::{
    ClockSample, ConnRef, Direction, Hook, KernelEvent, ProbeEvent, Record,
};

use super::{
    CLIENT_ADDR, CLIENT_TID, CLOCK_PERIOD_NS, GenConfig, MONO_BASE, PHC_MINUS_MONO, ProbeConn,
    SERVER_ADDR, SERVER_PORT, SERVER_TID, SortedFile, Stages, client_port, conn_ref, cookie,
    kernel, nic_clock, probe, rng_for, sample, stages_for, startup, summary,
};

/// Gap between successive skbs of one message when it is not sent/received as one.
const SKB_GAP_NS: u64 = 1_000;
/// Future requests never start earlier than this before the earliest connection's next start.
const FLUSH_MARGIN_NS: u64 = 10_000_000;

/// One side of a connection: node, socket cookie, thread.
#[derive(Clone, Copy)]
struct Flow {
    node: usize,
    ck: u64,
    tid: u32,
}

struct Conn {
    free_at: u64,
    batch_start: u64,
    tx_off: u64,
    rx_off: u64,
}

pub struct Writer<'c> {
    cfg: &'c GenConfig,
    kernel: [SortedFile; 2],
    probes: Option<[SortedFile; 2]>,
    conns: Vec<Conn>,
    rng: Option<StdRng>,
    next_clock: [u64; 2],
    request: usize,
    dropped: [u64; 2],
    end: [u64; 2],
}

/// Node 1's monotonic time for node 0's monotonic `t` (the same instant on the other machine).
fn to_server(t: u64) -> u64 {
    t - MONO_BASE[0] + MONO_BASE[1]
}
fn to_client(t: u64) -> u64 {
    t - MONO_BASE[1] + MONO_BASE[0]
}

impl<'c> Writer<'c> {
    pub fn new(
        cfg: &'c GenConfig,
        kernel: &[PathBuf; 2],
        probes: Option<&[PathBuf; 2]>,
    ) -> io::Result<Self> {
        let mut k = [
            SortedFile::create(&kernel[0], cfg.disorder)?,
            SortedFile::create(&kernel[1], cfg.disorder)?,
        ];
        for (n, f) in k.iter_mut().enumerate() {
            f.line(&Record::Startup(startup(n, cfg.nic_irq)))?;
        }
        let probes = match probes {
            Some(p) => Some([
                SortedFile::create(&p[0], cfg.disorder)?,
                SortedFile::create(&p[1], cfg.disorder)?,
            ]),
            None => None,
        };
        let conns = (0..cfg.connections)
            .map(|c| Conn {
                free_at: MONO_BASE[0] + 1_000_000 + c as u64 * 3_000,
                batch_start: 0,
                tx_off: 0,
                rx_off: 0,
            })
            .collect();
        Ok(Self {
            cfg,
            kernel: k,
            probes,
            conns,
            rng: rng_for(cfg),
            next_clock: [
                MONO_BASE[0] + CLOCK_PERIOD_NS,
                MONO_BASE[1] + CLOCK_PERIOD_NS,
            ],
            request: 0,
            dropped: [0; 2],
            end: MONO_BASE,
        })
    }

    fn k(&mut self, node: usize, ev: KernelEvent) {
        let hook_dropped = self
            .cfg
            .drop
            .is_some_and(|(n, h, i)| n == super::NODES[node] && h == ev.hook && i == self.request);
        if hook_dropped {
            self.dropped[node] += 1;
            return;
        }
        self.end[node] = self.end[node].max(ev.ts_ns);
        self.kernel[node].push(ev.ts_ns, &Record::Kernel(ev));
    }

    /// How a write_begin/read_end probe names its message, per `cfg.probe_conn`.
    fn name_message(
        &self,
        ev: &mut ProbeEvent,
        node: usize,
        c: usize,
        dir: Direction,
        (off, len): (u64, u64),
    ) {
        let (local, remote) = if node == 0 {
            ((CLIENT_ADDR, client_port(c)), (SERVER_ADDR, SERVER_PORT))
        } else {
            ((SERVER_ADDR, SERVER_PORT), (CLIENT_ADDR, client_port(c)))
        };
        let (conn, offset) = match self.cfg.probe_conn {
            ProbeConn::Cookie => (Some(conn_ref(cookie(node, c))), Some(off)),
            ProbeConn::FourTuple => (
                Some(ConnRef {
                    laddr: Some(local.0.into()),
                    lport: Some(local.1),
                    raddr: Some(remote.0.into()),
                    rport: Some(remote.1),
                    ..Default::default()
                }),
                Some(off),
            ),
            ProbeConn::Absent => (None, None),
        };
        (ev.conn, ev.dir, ev.offset, ev.len) = (conn, Some(dir), offset, Some(len));
    }

    fn p(&mut self, node: usize, ev: ProbeEvent, mono: u64) {
        if node == 1 && !self.cfg.server_probes {
            return;
        }
        if let Some(files) = &mut self.probes {
            files[node].push(mono, &Record::Probe(ev));
        }
    }

    pub fn run(&mut self) -> io::Result<()> {
        for c in 0..self.cfg.connections {
            let mut a = kernel(
                0,
                Hook::SockEstablished,
                MONO_BASE[0] + 100 + c as u64,
                CLIENT_TID,
            );
            a.cookie = Some(cookie(0, c));
            (a.saddr, a.sport, a.daddr, a.dport) = (
                Some(CLIENT_ADDR.into()),
                Some(client_port(c)),
                Some(SERVER_ADDR.into()),
                Some(SERVER_PORT),
            );
            (a.seq, a.aux, a.active) = (Some(1_000), Some(9_000), Some(true));
            self.k(0, a);
            let mut b = kernel(
                1,
                Hook::SockEstablished,
                MONO_BASE[1] + 200 + c as u64,
                SERVER_TID,
            );
            b.cookie = Some(cookie(1, c));
            (b.saddr, b.sport, b.daddr, b.dport) = (
                Some(SERVER_ADDR.into()),
                Some(SERVER_PORT),
                Some(CLIENT_ADDR.into()),
                Some(client_port(c)),
            );
            (b.seq, b.aux, b.active) = (Some(9_000), Some(1_000), Some(false));
            self.k(1, b);
        }
        let pipeline = self.cfg.pipeline.max(1);
        for i in 0..self.cfg.requests {
            self.request = i;
            let c = (i / pipeline) % self.cfg.connections;
            let slot = i % pipeline;
            let start = if slot == 0 {
                self.conns[c].batch_start = self.conns[c].free_at;
                self.conns[c].free_at
            } else {
                self.conns[c].batch_start + slot as u64 * 5_000
            };
            let s = stages_for(self.cfg, &mut self.rng);
            let end = self.one_request(i, c, start, &s);
            let conn = &mut self.conns[c];
            conn.free_at = conn.free_at.max(end + self.cfg.think_ns);
            let earliest = self.conns.iter().map(|c| c.free_at).min().unwrap_or(0);
            let cut = earliest.saturating_sub(FLUSH_MARGIN_NS);
            if cut > MONO_BASE[0] {
                self.flush(cut)?;
            }
        }
        Ok(())
    }

    /// `node`'s clock record at `t`, with its NIC clock when the NIC stamps on it.
    fn clock(&self, node: usize, t: u64) -> ClockSample {
        let mut clock = sample(node, t);
        if self.cfg.tx_hw_wire_after_doorbell_ns.is_some()
            || self.cfg.rx_hw_stamp_before_irq_ns.is_some()
        {
            clock.nic_clocks.push(nic_clock(node, t));
        }
        clock
    }

    fn flush(&mut self, client_cut: u64) -> io::Result<()> {
        for (node, cut) in [(0, client_cut), (1, to_server(client_cut))] {
            while self.next_clock[node] < cut {
                let t = self.next_clock[node];
                let clock = self.clock(node, t);
                self.kernel[node].push(t, &Record::Clock(clock));
                self.next_clock[node] += CLOCK_PERIOD_NS;
            }
            self.kernel[node].flush_before(cut)?;
            if let Some(p) = &mut self.probes {
                p[node].flush_before(cut)?;
            }
        }
        Ok(())
    }

    pub fn finish(mut self) -> io::Result<u64> {
        for node in 0..2 {
            // One clock sample after the last event, as the recorder writes at exit.
            let t = self.end[node] + 1_000;
            let clock = self.clock(node, t);
            self.kernel[node].push(t, &Record::Clock(clock));
        }
        let [a, b] = self.kernel;
        let mut n = a.finish(Some(&Record::Summary(summary(
            0,
            self.end[0] + 2_000,
            self.dropped[0],
        ))))?;
        n += b.finish(Some(&Record::Summary(summary(
            1,
            self.end[1] + 2_000,
            self.dropped[1],
        ))))?;
        if let Some([a, b]) = self.probes {
            n += a.finish(None)? + b.finish(None)?;
        }
        Ok(n)
    }

    /// TX of `[off, off+len)` on `node` from its tcp_sendmsg at `sendmsg`; returns the time the
    /// surviving transmission of the last byte left (its doorbell).
    fn transmit(
        &mut self,
        f: Flow,
        (off, len): (u64, u64),
        sendmsg: u64,
        s: &Stages,
        lost: bool,
    ) -> u64 {
        let Flow { node, ck, tid } = f;
        let mut ev = kernel(node, Hook::TcpSendmsg, sendmsg, tid);
        (ev.cookie, ev.dir, ev.offset, ev.len) =
            (Some(ck), Some(Direction::Tx), Some(off), Some(len as u32));
        self.k(node, ev);
        let skbs: Vec<(u64, u64)> = if self.cfg.tso || len <= self.cfg.mss {
            vec![(off, len)]
        } else {
            (0..len.div_ceil(self.cfg.mss))
                .map(|j| {
                    (
                        off + j * self.cfg.mss,
                        self.cfg.mss.min(len - j * self.cfg.mss),
                    )
                })
                .collect()
        };
        let mut xmit = 0;
        for (j, (o, l)) in skbs.iter().enumerate() {
            let queue = sendmsg + s.tx_tcp_ip + j as u64 * SKB_GAP_NS;
            xmit = self.device(f, (*o, *l), queue, s, false);
        }
        if lost {
            let (o, l) = *skbs.last().expect("one skb at least");
            xmit = self.device(f, (o, l), xmit + self.cfg.rto_ns, s, true);
        }
        xmit
    }

    fn device(
        &mut self,
        f: Flow,
        (o, l): (u64, u64),
        queue: u64,
        s: &Stages,
        retrans: bool,
    ) -> u64 {
        let Flow { node, ck, tid } = f;
        let start = queue + s.tx_qdisc;
        let doorbell = start + s.tx_driver;
        let xmit = doorbell + self.cfg.driver_returns_after_ns;
        for (hook, ts) in [
            (Hook::NetDevQueue, queue),
            (Hook::NetDevStartXmit, start),
            (Hook::NetDevXmit, xmit),
        ] {
            let mut ev = kernel(node, hook, ts, tid);
            (ev.cookie, ev.dir, ev.offset, ev.len, ev.retrans) = (
                Some(ck),
                Some(Direction::Tx),
                Some(o),
                Some(l as u32),
                retrans,
            );
            ev.dev = Some(if self.cfg.nic_irq { "eth0" } else { "veth0" }.into());
            if hook == Hook::NetDevXmit {
                ev.value = Some(0);
            }
            self.k(node, ev);
        }
        if let Some(after) = self.cfg.tx_hw_tstamp_after_ns.filter(|_| self.cfg.nic_irq) {
            // Keyed like the kernel's tskey: the last byte, length 1.
            let mut ev = kernel(node, Hook::TxTstampHw, xmit + after, tid);
            (ev.cookie, ev.dir, ev.offset, ev.len) =
                (Some(ck), Some(Direction::Tx), Some(o + l - 1), Some(1));
            ev.aux = (self.cfg.tx_hw_wire_after_doorbell_ns)
                .map(|wire| doorbell + wire + PHC_MINUS_MONO[node]);
            self.k(node, ev);
        }
        if let Some(after) = self.cfg.tx_complete_after_ns.filter(|_| self.cfg.nic_irq) {
            let mut ev = kernel(node, Hook::TxComplete, xmit + after, tid);
            (ev.cookie, ev.dir, ev.offset, ev.len) =
                (Some(ck), Some(Direction::Tx), Some(o), Some(l as u32));
            self.k(node, ev);
        }
        doorbell
    }

    /// RX of `[off, off+len)` on `node` arriving at `arrival`; returns
    /// (switch-in, recv_return) times; the copy is at switch-in + poll_return + recv_entry.
    fn receive(&mut self, f: Flow, (off, len): (u64, u64), arrival: u64, s: &Stages) -> (u64, u64) {
        let Flow { node, ck, tid } = f;
        let (irq, raise, softirq) = if self.cfg.nic_irq {
            let raise = arrival + s.rx_irq_handler;
            (Some(arrival), Some(raise), raise + s.rx_softirq_delay)
        } else {
            (None, None, arrival)
        };
        let netif = softirq + s.rx_napi_poll;
        let tcp = netif + s.rx_ip_tcp;
        let skbs: Vec<(u64, u64)> = if self.cfg.gro || len <= self.cfg.mss {
            vec![(off, len)]
        } else {
            (0..len.div_ceil(self.cfg.mss))
                .map(|j| {
                    (
                        off + j * self.cfg.mss,
                        self.cfg.mss.min(len - j * self.cfg.mss),
                    )
                })
                .collect()
        };
        let n = skbs.len() as u64;
        for (j, (o, l)) in skbs.into_iter().enumerate() {
            let back = (n - 1 - j as u64) * SKB_GAP_NS;
            let mut ev = kernel(node, Hook::NetifReceiveSkb, netif - back, 0);
            (ev.cookie, ev.dir, ev.offset, ev.len) =
                (Some(ck), Some(Direction::Rx), Some(o), Some(l as u32));
            ev.dev = Some(if self.cfg.nic_irq { "eth0" } else { "veth0" }.into());
            (
                ev.irq,
                ev.irq_entry_ns,
                ev.softirq_raise_ns,
                ev.softirq_entry_ns,
            ) = (irq.map(|_| 40), irq, raise, Some(softirq));
            ev.aux = irq
                .zip(self.cfg.rx_hw_stamp_before_irq_ns)
                .map(|(irq, before)| irq - before + PHC_MINUS_MONO[node]);
            self.k(node, ev);
            let mut ev = kernel(node, Hook::TcpProbe, tcp - back, 0);
            (ev.cookie, ev.dir, ev.offset, ev.len) =
                (Some(ck), Some(Direction::Rx), Some(o), Some(l as u32));
            self.k(node, ev);
        }
        let ready = tcp + s.rx_tcp_deliver;
        let wakeup = ready + s.rx_wakeup;
        let switch = wakeup + s.rx_sched_delay;
        let copy = switch + s.poll_return + s.rx_recv_entry;
        let ret = copy + s.rx_copy;
        let mut ev = kernel(node, Hook::SkDataReady, ready, 0);
        (ev.cookie, ev.dir, ev.offset) = (Some(ck), Some(Direction::Rx), Some(off + len));
        self.k(node, ev);
        let mut ev = kernel(node, Hook::SchedWakeup, wakeup, tid);
        (ev.cookie, ev.aux) = (Some(ck), Some(7));
        self.k(node, ev);
        let mut ev = kernel(node, Hook::SchedSwitch, switch, tid);
        ev.value = Some(1);
        self.k(node, ev);
        let mut ev = kernel(node, Hook::SkbCopyDatagram, copy, tid);
        (ev.cookie, ev.dir, ev.offset, ev.len) =
            (Some(ck), Some(Direction::Rx), Some(off), Some(len as u32));
        self.k(node, ev);
        let mut ev = kernel(node, Hook::RecvReturn, ret, tid);
        (ev.cookie, ev.dir, ev.offset, ev.value) = (
            Some(ck),
            Some(Direction::Rx),
            Some(off + len),
            Some(len as i64),
        );
        self.k(node, ev);
        (switch, ret)
    }

    fn send_return(&mut self, node: usize, c: usize, tid: u32, end_off: u64, len: u64, at: u64) {
        let mut ev = kernel(node, Hook::SendReturn, at, tid);
        (ev.cookie, ev.dir, ev.offset, ev.value) = (
            Some(cookie(node, c)),
            Some(Direction::Tx),
            Some(end_off),
            Some(len as i64),
        );
        self.k(node, ev);
    }

    /// One request on connection `c` starting at client time `t0`; returns its client end time.
    fn one_request(&mut self, i: usize, c: usize, t0: u64, s: &Stages) -> u64 {
        let trace = format!("t{i:06}");
        let (req_len, resp_len) = (self.cfg.request_len, self.cfg.response_len);
        let (req_off, resp_off) = (self.conns[c].tx_off, self.conns[c].rx_off);
        self.conns[c].tx_off += req_len;
        self.conns[c].rx_off += resp_len;
        let lost = self.cfg.retransmit_every.is_some_and(|n| i % n == n - 1);
        let (ca, cb) = (cookie(0, c), cookie(1, c));
        // One thread per connection on each side, as a thread-per-connection server would.
        let (client_tid, server_tid) = (CLIENT_TID + c as u32, SERVER_TID + c as u32);
        let client = Flow {
            node: 0,
            ck: ca,
            tid: client_tid,
        };
        let server = Flow {
            node: 1,
            ck: cb,
            tid: server_tid,
        };
        // Client, request out.
        let enc_end = t0 + s.client_encode;
        let write_begin = enc_end + s.client_pre_write;
        let sendmsg = write_begin + s.tx_syscall_entry;
        let departure = self.transmit(client, (req_off, req_len), sendmsg, s, lost);
        let first_xmit =
            sendmsg + s.tx_tcp_ip + s.tx_qdisc + s.tx_driver + self.cfg.driver_returns_after_ns;
        self.send_return(
            0,
            c,
            client_tid,
            req_off + req_len,
            req_len,
            first_xmit + 200,
        );
        for (point, at) in [
            ("encode_begin", t0),
            ("encode_end", enc_end),
            ("write_end", first_xmit + 300),
        ] {
            let ev = probe(0, "client", point, at, &trace, client_tid);
            self.p(0, ev, at);
        }
        let mut ev = probe(0, "client", "write_begin", write_begin, &trace, client_tid);
        self.name_message(&mut ev, 0, c, Direction::Tx, (req_off, req_len));
        self.p(0, ev, write_begin);
        // Server: request in, handler, response out.
        let arrival = to_server(departure + s.one_way);
        let (switch, ret) = self.receive(server, (req_off, req_len), arrival, s);
        let read_end = ret + s.read_return;
        let decode_end = read_end + s.server_decode;
        let handler_begin = decode_end + s.server_dispatch;
        let handler_end = handler_begin + s.server_handler;
        let encode_end = handler_end + s.server_encode;
        let write_begin_s = encode_end + s.server_pre_write;
        let sendmsg_s = write_begin_s + s.tx_syscall_entry;
        let departure_s = self.transmit(server, (resp_off, resp_len), sendmsg_s, s, false);
        let returned_s = departure_s + self.cfg.driver_returns_after_ns;
        self.send_return(
            1,
            c,
            server_tid,
            resp_off + resp_len,
            resp_len,
            returned_s + 200,
        );
        // A blocking reader (no poll) takes read_ready before its recv waits for the data.
        let ready = if self.cfg.server_blocking_read {
            arrival - 5_000
        } else {
            switch + s.poll_return
        };
        for (point, at) in [
            ("read_ready", ready),
            ("decode_end", decode_end),
            ("handler_begin", handler_begin),
            ("handler_end", handler_end),
            ("encode_end", encode_end),
            ("write_end", returned_s + 300),
        ] {
            let ev = probe(1, "server", point, at, &trace, server_tid);
            self.p(1, ev, at);
        }
        let mut ev = probe(1, "server", "read_end", read_end, &trace, server_tid);
        self.name_message(&mut ev, 1, c, Direction::Rx, (req_off, req_len));
        self.p(1, ev, read_end);
        let mut ev = probe(
            1,
            "server",
            "write_begin",
            write_begin_s,
            &trace,
            server_tid,
        );
        self.name_message(&mut ev, 1, c, Direction::Tx, (resp_off, resp_len));
        self.p(1, ev, write_begin_s);
        // Client, response in.
        let arrival_c = to_client(departure_s) + s.one_way;
        let (switch_c, ret_c) = self.receive(client, (resp_off, resp_len), arrival_c, s);
        let read_end_c = ret_c + s.read_return;
        let decode_end_c = read_end_c + s.client_decode;
        let ev = probe(
            0,
            "client",
            "read_ready",
            switch_c + s.poll_return,
            &trace,
            client_tid,
        );
        self.p(0, ev, switch_c + s.poll_return);
        let mut ev = probe(0, "client", "read_end", read_end_c, &trace, client_tid);
        self.name_message(&mut ev, 0, c, Direction::Rx, (resp_off, resp_len));
        self.p(0, ev, read_end_c);
        let ev = probe(0, "client", "decode_end", decode_end_c, &trace, client_tid);
        self.p(0, ev, decode_end_c);
        decode_end_c
    }
}
