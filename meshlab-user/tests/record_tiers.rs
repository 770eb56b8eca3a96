//! Privileged: run-time tier selection. `doctor` really tries every tier of every hook;
//! `record` must attach each hook at the fastest tier doctor found usable, on whatever kernel
//! this runs on. `cargo xtask test` also runs this inside stock Debian kernels under qemu,
//! where fentry and kprobe work, and tells it which tier tcp_sendmsg must get there
//! (MESHLAB_EXPECT_TCP_SENDMSG_TIER).

mod support;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;

use meshlab_user::kernel::plan::HOOKS;
use meshlab_user::schema::{AttachStatus, Hook, Tier};
use support::{LoopbackRecording, loopback_recording, privileged_or_skip, socket_cookie};

fn doctor_plan() -> (BTreeMap<String, String>, serde_json::Value) {
    let out = Command::new(env!("CARGO_BIN_EXE_meshlab"))
        .args(["doctor", "--json"])
        .output()
        .unwrap();
    let report: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("doctor --json output");
    assert!(out.status.success(), "doctor says nothing usable: {report}");
    let plan = report["plan"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned()))
        .collect();
    (plan, report)
}

#[test]
fn record_attaches_every_hook_at_the_fastest_tier_doctor_found_usable() {
    if !privileged_or_skip("record_attaches_every_hook_at_the_fastest_tier_doctor_found_usable") {
        return;
    }
    let (plan, report) = doctor_plan();
    // Facts the kernel states, cross-checked against doctor's verdict for kprobe.
    let has_kprobe_pmu = Path::new("/sys/bus/event_source/devices/kprobe/type").exists();
    let kprobe_ok =
        report["tiers"].as_array().unwrap().iter().any(|t| {
            t["hook"] == "tcp_sendmsg" && t["tier"] == "kprobe" && t["status"] == "attached"
        });
    assert_eq!(
        kprobe_ok, has_kprobe_pmu,
        "kprobe usable iff the kernel has the kprobe PMU"
    );

    let LoopbackRecording {
        dir: _dir,
        listener,
        port,
        recorder: rec,
    } = loopback_recording("tiers", &[]);
    let mut client = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let (mut server, _) = listener.accept().unwrap();
    client.write_all(b"tier check").unwrap();
    let mut buf = [0u8; 10];
    server.read_exact(&mut buf).unwrap();
    let cookie = socket_cookie(&client);
    drop((client, server));
    let rec = rec.stop();

    for hook in HOOKS
        .iter()
        .filter(|h| !h.raw_stream_only && rec.attached(h.name))
    {
        let used = rec
            .startup
            .attach_plan
            .iter()
            .find(|e| e.hook == hook.name && e.status == AttachStatus::Attached);
        let used = used.unwrap();
        assert_eq!(
            Some(used.tier.as_str()),
            plan.get(hook.name).map(String::as_str),
            "{}: record and doctor disagree",
            hook.name
        );
        // Every faster tier was tried and failed; every slower one was skipped.
        let position = hook.tiers.iter().position(|t| t.tier == used.tier).unwrap();
        for (i, tier) in hook.tiers.iter().enumerate() {
            let entry = rec
                .startup
                .attach_plan
                .iter()
                .find(|e| e.hook == hook.name && e.tier == tier.tier)
                .unwrap();
            let expected = match i.cmp(&position) {
                std::cmp::Ordering::Less => AttachStatus::Failed,
                std::cmp::Ordering::Equal => AttachStatus::Attached,
                std::cmp::Ordering::Greater => AttachStatus::Skipped,
            };
            assert_eq!(entry.status, expected, "{} {}", hook.name, tier.tier);
        }
    }
    // A hook with a tracepoint is attached whenever this kernel has the tracepoint; one
    // without (e.g. sock:sk_data_ready before 6.6) is missing unless a function tier
    // (fentry/fexit/kprobe) attached instead: never missing for another reason.
    for hook in HOOKS
        .iter()
        .filter(|h| !h.raw_stream_only && h.name != "sock_ops")
    {
        let target = hook.tiers.last().unwrap().target;
        let exists = std::fs::read_dir("/sys/kernel/tracing/events")
            .unwrap()
            .flatten()
            .any(|group| group.path().join(target).is_dir());
        let by_function = rec.startup.attach_plan.iter().any(|e| {
            e.hook == hook.name
                && matches!(e.tier, Tier::Fentry | Tier::Fexit | Tier::Kprobe)
                && e.status == AttachStatus::Attached
        });
        assert_eq!(
            rec.attached(hook.name),
            exists || by_function,
            "{}: tracepoint {target} exists = {exists}",
            hook.name
        );
    }
    // Whatever tier tcp_sendmsg got, it recorded this send with the socket's cookie.
    let send = rec.of(Hook::TcpSendmsg, cookie);
    assert_eq!(
        send.first().and_then(|e| e.len),
        Some(10),
        "tcp_sendmsg at tier {:?}",
        plan.get("tcp_sendmsg")
    );
    if let Ok(expected) = std::env::var("MESHLAB_EXPECT_TCP_SENDMSG_TIER") {
        assert_eq!(
            plan.get("tcp_sendmsg"),
            Some(&expected),
            "kernel {}",
            rec.startup.kernel
        );
    }
}
