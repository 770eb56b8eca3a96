//! The two-guest scenario as two machines: both guests record, the host merges the two
//! recordings across the guests' real clock skew, and a netem delay on guest A's virtio NIC,
//! changed between interleaved rounds, must come back out of the merged requests.
//!
//! netem is a qdisc: the kernel holds each skb between `net_dev_queue` and
//! `net_dev_start_xmit`, so the delay belongs to A's `tx_qdisc` segment (docs/segments.md), not
//! to `network_round_trip`. Both conditions run netem (1000 and 1200 us): netem releases a
//! packet from a timer, and a TCG guest wakes from it late by far more than 5 us (with the
//! host's load). Running netem in both cancels most of that lateness, not all: after the
//! longer idle the wake-up is later still, so the realized difference exceeds the configured
//! one by 0-35 us on the hosts seen so far. That excess is real time in the qdisc, so the check
//! is on attribution: A's tx_qdisc moves by at least the configured difference and by no more
//! than the end-to-end, and `network_round_trip` does not take the delay. The distance to the
//! configured difference is printed against the issue's +-5 us goal.
//! Delay on the wire itself (the host relay, in `network_round_trip`) is vm_wire_rounds.rs.
//! The round boundaries are A's CLOCK_MONOTONIC (`now at` of /proc/timer_list), the clock the
//! merged `start_ns` is in.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, ensure};

use crate::{read_ndjson, run_cmd};

/// The lab server's port in guest B.
const PORT: u16 = 9000;
/// netem's delay on every packet guest A sends: the first and the second round of each pair.
const NETEM_DELAYS_US: [u64; 2] = [1000, 1200];
/// Pairs of rounds, interleaved.
pub const ROUND_PAIRS: usize = 8;
pub const ROUND_SECS: u64 = 1;
/// How far the recovered delay may be from the injected one (the bound).
pub const TOLERANCE_NS: i64 = 5_000;
/// Share of A's requests that must be joined to B's half.
const MIN_JOINED: f64 = 0.99;
/// Issue 11's goal for complete cross-machine requests.
const COMPLETE_TARGET: f64 = 0.99;
/// Below this the scenario fails: a regression, not TCG noise (this scenario's own printed
/// completeness; docs/coverage-audit.md has the runs).
const MIN_COMPLETE: f64 = 0.95;

/// Guest A's shell text for more rounds after the netem ones, given the scenario's directory
/// and the client command of one round (vm_wire_rounds.rs).
pub type WireRounds = fn(&Path, &str) -> String;

/// Guest shell text after `record --ready-file /run/rec.ready & REC=$!`: waits until the
/// recorder is ready, and fails at once if it exited instead (a missing binary, a refused
/// program) rather than waiting for the run's deadline.
/// B's first words: whatever ends its script (success or failure) leaves `b.done` in the
/// directory both guests share, so A's wait for B ([`B_READY`]) cannot outlive B.
pub const B_DONE_ON_EXIT: &str = "trap 'touch \"$MESHLAB_VM_SHARED/b.done\"' EXIT; ";
/// A's wait until B serves; fails once B's script ended without getting there.
pub const B_READY: &str = "until [ -f \"$MESHLAB_VM_SHARED/b.ready\" ]; do \
     [ -f \"$MESHLAB_VM_SHARED/b.done\" ] && exit 1; sleep 0.1; done; ";
pub const RECORDER_READY: &str = "while [ ! -f /run/rec.ready ]; do kill -0 $REC 2>/dev/null || \
     { echo 'the recorder exited before it was ready' >&2; exit 1; }; sleep 0.1; done; ";

/// The guests' NICs and A's first client run (the one every check reads).
pub struct Traffic {
    /// Queue pairs each guest's NIC uses (`ethtool -L`, before the recorders start, so the
    /// startup records show them); more than 1 needs the tap link (`vm run --queues`).
    pub queues: u8,
    /// The lab client's connections: one flow each, one thread each.
    pub connections: u32,
    /// The client's total request rate (0 = as fast as the answers come).
    pub qps: u32,
    pub seconds: u64,
    /// B's address on its second NIC (`vm run --nics 2`): B listens on every address, and a
    /// second client, the same as the first, runs at the same time to this one.
    pub second_addr: Option<&'static str>,
}

impl Traffic {
    /// One queue, one connection, one second: the netem and wire rounds follow it.
    pub const SINGLE: Traffic = Traffic {
        queues: 1,
        connections: 1,
        qps: 0,
        seconds: ROUND_SECS,
        second_addr: None,
    };

    /// A's first run, its report in `DIR/a.json`: one client to `server`; with a second NIC,
    /// a second one at the same time to B's address there (report in `DIR/a2.json`), and the
    /// run fails if either client does.
    fn first_run(&self, meshlab: &Path, dir: &Path, server: &str) -> String {
        let (m, d) = (meshlab.display(), dir.display());
        let client = |server: &str| {
            format!(
                "{m} lab client --connect {server} --warmup 0s --duration {}s --concurrency {} --qps {}",
                self.seconds, self.connections, self.qps
            )
        };
        match self.second_addr {
            Some(second) => format!(
                "{{ {} > {d}/a.json & C1=$!; {} > {d}/a2.json; C2=$?; wait $C1 && [ $C2 = 0 ]; }}",
                client(server),
                client(&format!("{second}:{PORT}")),
            ),
            None => format!("{} > {d}/a.json", client(server)),
        }
    }

    /// Guest shell text run before recording: the queue count, when it is not the default.
    fn set_queues(&self) -> String {
        match self.queues {
            1 => String::new(),
            n => format!("ethtool -L eth0 combined {n} || exit 1; "),
        }
    }
}

/// Shell text of guest A (recorder + client rounds) and guest B (recorder + server).
pub struct GuestScripts {
    pub a: String,
    pub b: String,
}

/// Both guests record; `/proc/interrupts` and `/proc/softirqs` are saved before and after the
/// traffic (`NODE.interrupts.0`, `.1`, ...). B serves until A says it is done (a file in the
/// directory both guests share), A always says so, also on failure. A connects only once B
/// listens, so no packet crosses the link while B takes its snapshots. `with_rounds`: A also runs
/// the netem rounds after its first client run.
pub fn guest_scripts(
    meshlab: &Path,
    dir: &Path,
    (server_addr, traffic): (&str, &Traffic),
    with_rounds: bool,
    wire_rounds: Option<WireRounds>,
) -> GuestScripts {
    let (m, d) = (meshlab.display(), dir.display());
    let server = format!("{server_addr}:{PORT}");
    // Snapshots of the kernel's IRQ and softirq counters, bracketed by CLOCK_MONOTONIC reads
    // (vm_irq_counts.rs compares them with the recorded events in between).
    let snapshot = |node: &str, i: u8| {
        format!(
            "t0=$(now); cat /proc/interrupts > {d}/{node}.interrupts.{i}; \
             cat /proc/softirqs > {d}/{node}.softirqs.{i}; echo \"$t0 $(now)\" >> {d}/{node}.snapshots; "
        )
    };
    // B also records the raw IRQ/NAPI stream: its IRQ and softirq entries are counted.
    let record = |node: &str, extra: &str| {
        format!(
            "now() {{ awk '/^now at/ {{print $3; exit}}' /proc/timer_list; }}; \
             {m} record -o {d}/{node}.capture --node {node_upper} --port {PORT} --duration 180s \
             {extra} --ready-file /run/rec.ready & REC=$!; {ready}{snap}",
            node_upper = node.to_uppercase(),
            ready = RECORDER_READY,
            snap = snapshot(node, 0),
        )
    };
    let stop = |node: &str| format!("{}kill -INT $REC; wait $REC", snapshot(node, 1));
    let set_queues = traffic.set_queues();
    let listen = match traffic.second_addr {
        Some(_) => format!("0.0.0.0:{PORT}"),
        None => server.clone(),
    };
    let b = format!(
        "{B_DONE_ON_EXIT}{set_queues}{record}{m} lab server --listen {listen} & SRV=$!; \
         until grep -q ':{port:04X} 00000000:0000 0A' /proc/net/tcp; do sleep 0.1; done; \
         touch \"$MESHLAB_VM_SHARED/b.ready\"; \
         for i in $(seq 900); do [ -f \"$MESHLAB_VM_SHARED/a.done\" ] && break; sleep 0.2; done; \
         kill -INT $SRV; wait $SRV; {stop} && {m} export {d}/b.capture -o {d}/b.ndjson",
        record = record("b", "--raw-irq"),
        port = PORT,
        stop = stop("b"),
    );
    let client = format!("{m} lab client --connect {server} --warmup 0s --duration {ROUND_SECS}s");
    let first_client = traffic.first_run(meshlab, dir, &server);
    let netem_rounds = if with_rounds {
        format!(
            "modprobe sch_netem || exit 1; \
             for round in $(seq {ROUND_PAIRS}); do for delay in {low} {high}; do \
               tc qdisc replace dev eth0 root netem delay ${{delay}}us || exit 1; \
               start=$(now); {client} > /dev/null || exit 1; echo \"$delay $start $(now)\" >> {d}/rounds; \
             done; done; tc qdisc del dev eth0 root || exit 1; ",
            low = NETEM_DELAYS_US[0],
            high = NETEM_DELAYS_US[1],
        )
    } else {
        String::new()
    };
    let wire_rounds = wire_rounds.map_or(String::new(), |script| script(dir, &client));
    let a = format!(
        "trap 'touch \"$MESHLAB_VM_SHARED/a.done\"' EXIT; {set_queues}{record}{B_READY}\
         ok=; for i in $(seq 120); do {first_client} && ok=1 && break; sleep 0.5; done; \
         [ -n \"$ok\" ] || exit 1; {netem_rounds}{wire_rounds}{stop}",
        record = record("a", ""),
        stop = stop("a"),
    );
    GuestScripts { a, b }
}

/// Merges A's and B's recordings on the host and checks the cross-machine requests; returns
/// the merged requests for more checks.
pub fn check(meshlab: &Path, dir: &Path) -> Result<Vec<serde_json::Value>> {
    let requests = merge_and_check_joined(meshlab, dir)?;
    let rounds = read_rounds(&dir.join("rounds"))?;
    check_delay_recovered(&requests, &rounds)?;
    Ok(requests)
}

/// [`check`] without the netem rounds: the merge, its joins across the clocks and its sums.
pub fn merge_and_check_joined(meshlab: &Path, dir: &Path) -> Result<Vec<serde_json::Value>> {
    let merged = dir.join("merged.ndjson");
    run_cmd(
        Command::new(meshlab)
            .arg("merge")
            .args([dir.join("a.capture"), dir.join("b.capture")])
            .arg("-o")
            .arg(&merged),
    )?;
    check_merged(&merged)
}

/// The joins across the clocks and the sums of `merged`, a `meshlab merge` of both guests'
/// captures (the NIC scenarios check the one their `report --nic` read).
pub fn check_merged(merged: &Path) -> Result<Vec<serde_json::Value>> {
    let requests = read_requests(merged)?;
    check_joined(&requests)?;
    check_sums(&requests)?;
    report_clock_offset(&requests);
    Ok(requests)
}

fn read_requests(path: &Path) -> Result<Vec<serde_json::Value>> {
    let mut records = read_ndjson(path)?;
    records.retain(|record| record["type"] == "request");
    Ok(records)
}

/// The direct request A -> B: every request A sent is joined to B's half across the two
/// clocks; each network round trip the merge derived lies inside its request (0 included). Requests the
/// merge refused to split (a negative difference: under TCG the virtio kick can return after
/// the packet was already answered) are counted in its errors and printed, never hidden.
fn check_joined(requests: &[serde_json::Value]) -> Result<()> {
    let from_a: Vec<_> = requests
        .iter()
        .filter(|r| r["client_node"] == "A")
        .collect();
    let joined = from_a.iter().filter(|r| r["server_node"] == "B").count();
    ensure!(
        from_a.len() >= 1000 && joined as f64 >= MIN_JOINED * from_a.len() as f64,
        "{joined} of {} requests from A joined to B's half",
        from_a.len()
    );
    let mut split = 0;
    for request in &from_a {
        let Some(network) = segment_ns(request, "network_round_trip", None) else {
            continue;
        };
        let e2e = request["e2e_ns"].as_i64().context("e2e_ns")?;
        // 0 is admitted: the same TCG artifact as the refused negatives (the kick returned
        // after the answer) can leave exactly nothing, seen once in 5380 requests, with 17 ns
        // the smallest non-zero one in that run; a real wire never does that.
        ensure!(
            network >= 0 && network < e2e,
            "network {network} of {e2e}: {request}"
        );
        split += 1;
    }
    let complete = from_a.iter().filter(|r| r["complete"] == true).count();
    let share = complete as f64 / from_a.len() as f64;
    eprintln!(
        "vm two machines: {joined} of {} requests A -> B joined across the clocks, {split} with \
         network_round_trip, {complete} complete ({:.1} %; target {:.0} %: {})",
        from_a.len(),
        share * 100.0,
        COMPLETE_TARGET * 100.0,
        if share >= COMPLETE_TARGET {
            "met"
        } else {
            "NOT met"
        }
    );
    ensure!(
        share >= MIN_COMPLETE,
        "only {complete} of {} cross-machine requests complete (floor {:.0} %)",
        from_a.len(),
        MIN_COMPLETE * 100.0
    );
    Ok(())
}

/// What subtracting the two guests' clocks would have given: B's first point of a request
/// minus A's last one before the wait, less half the network round trip. Printed to show the
/// skew the merge never subtracts; no figure depends on it.
fn report_clock_offset(requests: &[serde_json::Value]) {
    let mut offsets: Vec<i64> = requests
        .iter()
        .filter(|r| r["complete"] == true)
        .filter_map(|r| {
            let segments = r["segments"].as_array()?;
            let network = segments
                .iter()
                .position(|s| s["name"] == "network_round_trip")?;
            let before = &segments[network.checked_sub(1)?];
            let after = segments.get(network + 1)?;
            let a_end = before["start_ns"].as_i64()? + before["dur_ns"].as_i64()?;
            let half_rtt = segments[network]["dur_ns"].as_i64()? / 2;
            Some(after["start_ns"].as_i64()? - a_end - half_rtt)
        })
        .collect();
    if let Some(offset) = median(&mut offsets) {
        eprintln!(
            "vm two machines: guest B's CLOCK_MONOTONIC is {:.6} s ahead of A's (median, never used)",
            offset as f64 / 1e9
        );
    }
}

/// One client run of guest A: the netem delay in force and its span on A's monotonic clock.
#[derive(Debug, Clone, Copy)]
pub struct Round {
    pub delay_us: u64,
    pub start_ns: i64,
    pub end_ns: i64,
}

pub fn read_rounds(path: &Path) -> Result<Vec<Round>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let rounds = (text.lines().enumerate())
        .map(|(index, line)| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let parse = |i: usize| -> Result<i64> {
                let field = fields.get(i).copied().unwrap_or_default();
                field.parse().with_context(|| {
                    format!(
                        "{}:{}: field {} is {field:?}, expected an integer (DELAY_US START_NS END_NS)",
                        path.display(),
                        index + 1,
                        i + 1
                    )
                })
            };
            Ok(Round {
                delay_us: parse(0)? as u64,
                start_ns: parse(1)?,
                end_ns: parse(2)?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    ensure!(
        rounds.len() == 2 * ROUND_PAIRS,
        "{}: {} rounds, expected {}",
        path.display(),
        rounds.len(),
        2 * ROUND_PAIRS
    );
    Ok(rounds)
}

/// Fewest requests a round needs for its medians to mean anything.
const MIN_ROUND_REQUESTS: usize = 20;

/// Fewest usable pairs a shift is computed from. A TCG guest on a loaded host can stall for
/// most of a 1 s round (a CI run had 4 requests in one round, against 100-360 in the others,
/// with a 477 ms p90): that pair is left out, loudly, instead of failing the scenario; more
/// than two such pairs fail it.
const MIN_USABLE_PAIRS: usize = ROUND_PAIRS - 2;

/// Per segment (`NODE:name`, the derived one by name, `e2e`): the second round of each pair
/// minus the first, one value per usable pair (both rounds with at least
/// `MIN_ROUND_REQUESTS` requests); every pair must be `delays`.
pub fn pair_shifts(
    requests: &[serde_json::Value],
    rounds: &[Round],
    delays: [u64; 2],
) -> Result<BTreeMap<String, Vec<i64>>> {
    let mut shifts: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    let mut usable = 0;
    for (pair, two) in rounds.chunks(2).enumerate() {
        let got = [two[0].delay_us, two[1].delay_us];
        ensure!(
            got == delays,
            "round pair {pair} is not {delays:?} us: {rounds:?}"
        );
        let (Some(off), Some(on)) = (
            round_medians(requests, &two[0]),
            round_medians(requests, &two[1]),
        ) else {
            eprintln!(
                "vm two machines: round pair {pair} left out: a round with fewer than {MIN_ROUND_REQUESTS} requests (the guest stalled)"
            );
            continue;
        };
        usable += 1;
        for (name, on) in &on {
            if let Some(off) = off.get(name) {
                shifts.entry(name.clone()).or_default().push(on - off);
            }
        }
    }
    ensure!(
        usable >= MIN_USABLE_PAIRS,
        "only {usable} of {} round pairs had {MIN_ROUND_REQUESTS} requests in both rounds (at least {MIN_USABLE_PAIRS} needed)",
        rounds.len() / 2
    );
    Ok(shifts)
}

pub fn median_shift(shifts: &mut BTreeMap<String, Vec<i64>>, name: &str) -> Result<i64> {
    (shifts.get_mut(name))
        .and_then(|values| median(values))
        .with_context(|| format!("no {name} in every round"))
}

/// What each round's median moved by, the median over the pairs; A's `tx_qdisc` must move by
/// the difference of the two netem delays.
fn check_delay_recovered(requests: &[serde_json::Value], rounds: &[Round]) -> Result<()> {
    let mut shifts = pair_shifts(requests, rounds, NETEM_DELAYS_US)?;
    // Before the medians below sort each list and lose which pair a value came from.
    let rest = rest_shift(&shifts);
    let network = median_shift(&mut shifts, "network_round_trip")?;
    let (e2e, e2e_spread) = (shifts.get_mut("e2e"))
        .and_then(|v| median_and_spread(v))
        .context("no e2e in every round")?;
    let qdisc_shifts = shifts
        .get_mut("A:tx_qdisc")
        .context("no A:tx_qdisc in every round")?;
    let pairs = qdisc_shifts.len();
    let (qdisc, spread) = median_and_spread(qdisc_shifts).context("no pairs")?;
    let injected = ((NETEM_DELAYS_US[1] - NETEM_DELAYS_US[0]) * 1000) as i64;
    let error = qdisc - injected;
    eprintln!(
        "vm two machines: netem {NETEM_DELAYS_US:?} us on A's eth0, median shift over {pairs} of \
         {ROUND_PAIRS} interleaved pairs: A tx_qdisc {:+.1} us (injected {:+.1} us, error {:+.1} us, pairs' \
         spread +-{:.1} us: {}), network_round_trip {:+.1} us, end-to-end {:+.1} us (+-{:.1})",
        qdisc as f64 / 1e3,
        injected as f64 / 1e3,
        error as f64 / 1e3,
        spread as f64 / 1e3,
        within(error),
        network as f64 / 1e3,
        e2e as f64 / 1e3,
        e2e_spread as f64 / 1e3
    );
    // netem holds a packet at least its configured delay; under TCG its timer fires late, and
    // later after a longer idle, so the realized difference exceeds the configured one by
    // tens of us on some hosts (+18.7, +34.2 us measured): that lateness IS time in the qdisc.
    // What must hold is where the time lands: A's tx_qdisc moves by at least the injected
    // difference and the derived network segment does not take it. That the qdisc is part of
    // what the client saw holds per request (`check_sums`); how far every other stage moved
    // (per pair, the end-to-end shift minus the qdisc's; their median) is printed, not
    // checked: the other stages of a TCG guest can move between the conditions (-65.6 us in
    // one CI run, +75 us in another), which says nothing about the attribution.
    match rest {
        Some((rest, spread)) => eprintln!(
            "vm two machines: end-to-end minus A tx_qdisc moved by {:+.1} us (+-{:.1}) over the pairs",
            rest as f64 / 1e3,
            spread as f64 / 1e3
        ),
        None => eprintln!(
            "vm two machines: A tx_qdisc not in every usable pair: the other stages' shift is not given"
        ),
    }
    check_shift_attribution(Shifts {
        qdisc,
        network,
        injected,
        bound: TOLERANCE_NS.max(2 * spread),
    })
}

/// Per pair, the end-to-end shift minus A's tx_qdisc shift (what every other stage moved by):
/// its median and spread; `None` unless both are known in every usable pair.
fn rest_shift(shifts: &BTreeMap<String, Vec<i64>>) -> Option<(i64, i64)> {
    let (e2e, qdisc) = (shifts.get("e2e")?, shifts.get("A:tx_qdisc")?);
    if e2e.len() != qdisc.len() {
        return None;
    }
    let mut rest: Vec<i64> = e2e.iter().zip(qdisc).map(|(e, q)| e - q).collect();
    median_and_spread(&mut rest)
}

pub fn within(error: i64) -> &'static str {
    if error.abs() <= TOLERANCE_NS {
        "within +-5 us"
    } else {
        "NOT within +-5 us"
    }
}

/// Median shifts of one run (ns), the injected difference and the check's tolerance.
struct Shifts {
    qdisc: i64,
    network: i64,
    injected: i64,
    bound: i64,
}

fn check_shift_attribution(s: Shifts) -> Result<()> {
    ensure!(
        s.qdisc >= s.injected - s.bound,
        "A's tx_qdisc moved by {} ns, less than the injected {} ns (-{})",
        s.qdisc,
        s.injected,
        s.bound
    );
    ensure!(
        s.network.abs() <= s.injected / 2,
        "network_round_trip moved by {} ns: the injected {} ns belongs to A's tx_qdisc",
        s.network,
        s.injected
    );
    Ok(())
}

/// Every request from A: its segments add up to its end-to-end exactly (durations are
/// unsigned in the schema), so each stage, A's tx_qdisc included, is a part of what the
/// client saw.
fn check_sums(requests: &[serde_json::Value]) -> Result<()> {
    for request in requests.iter().filter(|r| r["client_node"] == "A") {
        let e2e = request["e2e_ns"].as_u64().context("e2e_ns")?;
        let mut sum = 0;
        for segment in request["segments"].as_array().into_iter().flatten() {
            sum += segment["dur_ns"].as_u64().context("dur_ns")?;
        }
        ensure!(
            sum == e2e,
            "segments add up to {sum}, not e2e {e2e}: {request}"
        );
    }
    Ok(())
}

/// Median and the standard error of the median estimated from the median absolute deviation
/// (1.4826 MAD is the standard deviation for normal data; x1.25/sqrt(n) for the median).
pub fn median_and_spread(values: &mut [i64]) -> Option<(i64, i64)> {
    let center = median(values)?;
    let mut deviations: Vec<i64> = values.iter().map(|v| (v - center).abs()).collect();
    let mad = median(&mut deviations)? as f64;
    let spread = 1.4826 * mad * 1.2533 / (values.len() as f64).sqrt();
    Some((center, spread as i64))
}

/// Median of each segment (`NODE:name`, the derived one by name) and of `e2e` over the
/// requests that started inside the round, each segment where it was observed; `None` when the
/// round has fewer than `MIN_ROUND_REQUESTS` requests.
fn round_medians(requests: &[serde_json::Value], round: &Round) -> Option<BTreeMap<String, i64>> {
    let mut values: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    let inside = requests.iter().filter(|r| {
        r["start_ns"]
            .as_i64()
            .is_some_and(|t| t >= round.start_ns && t <= round.end_ns)
    });
    for request in inside {
        for segment in request["segments"].as_array().into_iter().flatten() {
            let name = match segment["node"].as_str() {
                Some(node) => format!("{node}:{}", segment["name"].as_str().unwrap_or("?")),
                None => segment["name"].as_str().unwrap_or("?").to_owned(),
            };
            if let Some(dur) = segment["dur_ns"].as_i64() {
                values.entry(name).or_default().push(dur);
            }
        }
        if let Some(e2e) = request["e2e_ns"].as_i64() {
            values.entry("e2e".to_owned()).or_default().push(e2e);
        }
    }
    let count = values.get("e2e").map_or(0, Vec::len);
    if count < MIN_ROUND_REQUESTS {
        eprintln!("vm two machines: only {count} requests in round {round:?}");
        return None;
    }
    Some(
        values
            .into_iter()
            .filter_map(|(name, mut v)| median(&mut v).map(|m| (name, m)))
            .collect(),
    )
}

fn segment_ns(request: &serde_json::Value, name: &str, node: Option<&str>) -> Option<i64> {
    request["segments"]
        .as_array()?
        .iter()
        .find(|s| s["name"] == name && s["node"].as_str() == node)?["dur_ns"]
        .as_i64()
}

fn median(values: &mut [i64]) -> Option<i64> {
    if values.is_empty() {
        return None;
    }
    values.sort_unstable();
    Some(values[values.len() / 2])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs guest shell text with busybox-compatible `sh` on the host, killed after 10 s (a
    /// wait the text fails to end makes a test fail with exit 124, not hang); (exit code,
    /// stderr).
    fn sh(text: &str, shared: &std::path::Path) -> (Option<i32>, String) {
        let out = std::process::Command::new("timeout")
            .args(["10", "sh", "-c", text])
            .env("MESHLAB_VM_SHARED", shared)
            .output()
            .expect("sh runs");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into(),
        )
    }

    /// A recorder that exits before it is ready (here `false`) ends the guest's script at once
    /// instead of leaving it waiting for /run/rec.ready until the run's deadline.
    #[test]
    fn a_recorder_that_exits_unready_fails_the_script() {
        let shared = std::env::temp_dir();
        let (code, stderr) = sh(&format!("false & REC=$!; {RECORDER_READY}exit 0"), &shared);
        assert_eq!(code, Some(1), "{stderr}");
        assert!(
            stderr.contains("the recorder exited before it was ready"),
            "{stderr}"
        );
    }

    /// A's wait for B ends with a failure once B's script ended without serving.
    #[test]
    fn a_stops_waiting_for_a_b_that_ended() {
        let shared = std::env::temp_dir().join(format!("ml-b-done-{}", std::process::id()));
        std::fs::create_dir_all(&shared).unwrap();
        let (code, _) = sh(
            &format!("({B_DONE_ON_EXIT}exit 3); {B_READY}exit 0"),
            &shared,
        );
        let b_done = shared.join("b.done").exists();
        std::fs::remove_dir_all(&shared).unwrap();
        assert!(b_done, "B's exit left b.done");
        assert_eq!(code, Some(1));
    }

    /// `count` requests starting inside `round`, each with end-to-end `e2e_ns`.
    fn requests_in(round: &Round, count: usize, e2e_ns: i64) -> Vec<serde_json::Value> {
        (0..count)
            .map(|i| serde_json::json!({"start_ns": round.start_ns + i as i64, "e2e_ns": e2e_ns}))
            .collect()
    }

    /// Eight pairs of 1 s rounds at 100/300 us; `starved` pairs have 4 requests in their
    /// second round, the others 25 in each (e2e 1 ms off, 1.2 ms on).
    fn pairs_with_starved(starved: usize) -> (Vec<Round>, Vec<serde_json::Value>) {
        let mut rounds = Vec::new();
        let mut requests = Vec::new();
        for pair in 0..ROUND_PAIRS {
            for (k, delay_us) in [100, 300].into_iter().enumerate() {
                let start_ns = ((2 * pair + k) as i64) * 1_000_000_000;
                let round = Round {
                    delay_us,
                    start_ns,
                    end_ns: start_ns + 999_999_999,
                };
                let count = if k == 1 && pair < starved { 4 } else { 25 };
                requests.extend(requests_in(&round, count, 1_000_000 + 200_000 * k as i64));
                rounds.push(round);
            }
        }
        (rounds, requests)
    }

    #[test]
    fn a_stalled_round_leaves_its_pair_out_and_too_many_fail() {
        let (rounds, requests) = pairs_with_starved(1);
        let shifts = pair_shifts(&requests, &rounds, [100, 300]).expect("7 of 8 pairs usable");
        assert_eq!(shifts["e2e"], vec![200_000; ROUND_PAIRS - 1]);
        let (rounds, requests) = pairs_with_starved(3);
        let err = pair_shifts(&requests, &rounds, [100, 300]).expect_err("5 of 8 pairs");
        assert!(err.to_string().contains("only 5 of 8 round pairs"), "{err}");
    }

    #[test]
    fn the_spread_of_the_median_comes_from_the_median_absolute_deviation() {
        let mut shifts = vec![190_000, 200_000, 210_000, 205_000, 195_000, 5_000_000];
        let (center, spread) = median_and_spread(&mut shifts).expect("values");
        assert_eq!(center, 205_000);
        // MAD 10 us (the outlier does not move it): 1.4826 * 10 * 1.2533 / sqrt(6) = 7.59 us.
        assert_eq!(spread / 100, 75);
    }

    #[test]
    fn the_delay_must_land_in_the_qdisc_and_not_in_the_network() {
        let run = |qdisc, network| Shifts {
            qdisc,
            network,
            injected: 200_000,
            bound: 10_000,
        };
        check_shift_attribution(run(203_800, 2_300)).expect("within the bound");
        check_shift_attribution(run(234_000, 7_000)).expect("late timer is qdisc time");
        let short = check_shift_attribution(run(180_000, 7_000)).expect_err("short");
        assert!(
            format!("{short}").contains("less than the injected"),
            "{short}"
        );
        let wrong = check_shift_attribution(run(201_000, 150_000)).expect_err("network");
        assert!(
            format!("{wrong}").contains("belongs to A's tx_qdisc"),
            "{wrong}"
        );
    }

    #[test]
    fn every_stage_is_a_part_of_what_the_client_saw() {
        let request = |durs: &[u64], e2e: u64| {
            let segments: Vec<_> = durs
                .iter()
                .map(|d| serde_json::json!({"dur_ns": d}))
                .collect();
            serde_json::json!({"client_node": "A", "e2e_ns": e2e, "segments": segments})
        };
        check_sums(&[request(&[200_000, 50_000], 250_000)]).expect("exact sum");
        let short = check_sums(&[request(&[200_000, 50_000], 260_000)]).expect_err("sum");
        assert!(format!("{short}").contains("not e2e 260000"), "{short}");
        let from_b = serde_json::json!({"client_node": "B", "e2e_ns": 1, "segments": []});
        check_sums(&[from_b]).expect("only A's requests are checked");
    }

    #[test]
    fn the_rest_is_each_pairs_end_to_end_minus_its_qdisc_shift() {
        let mut shifts = BTreeMap::new();
        shifts.insert("e2e".to_owned(), vec![130_000, 400_000, 210_000]);
        shifts.insert("A:tx_qdisc".to_owned(), vec![195_000, 205_000, 140_000]);
        let (rest, _) = rest_shift(&shifts).expect("pairs");
        // Per pair -65, +195, +70 us: the median +70 us, where the medians' difference would
        // be +15 (210 - 195).
        assert_eq!(rest, 70_000);
        shifts.insert("A:tx_qdisc".to_owned(), vec![195_000]);
        assert_eq!(rest_shift(&shifts), None, "unequal pairs: not given");
    }

    #[test]
    fn rounds_name_the_line_and_field_of_bad_input() {
        let dir = std::env::temp_dir().join(format!("i11b-rounds-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("rounds");
        std::fs::write(&path, "100 1 2\n300 x 4\n").expect("write");
        let error = read_rounds(&path).expect_err("bad field");
        let _ = std::fs::remove_dir_all(&dir);
        assert!(
            format!("{error:#}").contains("rounds:2: field 2 is \"x\""),
            "{error:#}"
        );
    }
}
