//! `meshlab ... --help` is part of the interface: any change to a flag, its default or its
//! help text shows up as a diff of meshlab-user/tests/golden/help/*.txt. After an intended
//! change, regenerate them with
//!
//!     MESHLAB_UPDATE_GOLDEN=1 cargo test -p meshlab-user --test help_golden
//!
//! and review the diff like code.

use std::path::PathBuf;
use std::process::Command;

/// Every command whose help is locked: (golden file stem, arguments before `--help`).
const COMMANDS: &[(&str, &[&str])] = &[
    ("meshlab", &[]),
    ("doctor", &["doctor"]),
    ("record", &["record"]),
    ("merge", &["merge"]),
    ("report", &["report"]),
    ("lab", &["lab"]),
    ("demo", &["demo"]),
];

#[test]
fn help_texts_match_their_golden_files() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden/help");
    let update = std::env::var_os("MESHLAB_UPDATE_GOLDEN").is_some();
    let mut stale = Vec::new();
    for (stem, args) in COMMANDS {
        let out = Command::new(env!("CARGO_BIN_EXE_meshlab"))
            .args(*args)
            .arg("--help")
            .output()
            .expect("meshlab runs");
        assert!(out.status.success(), "{stem} --help failed: {out:?}");
        let help = String::from_utf8(out.stdout).expect("UTF-8 help");
        let golden = dir.join(format!("{stem}.txt"));
        if update {
            std::fs::write(&golden, &help).expect("writing golden file");
            continue;
        }
        let expected = std::fs::read_to_string(&golden).unwrap_or_else(|e| {
            panic!(
                "{}: {e} (MESHLAB_UPDATE_GOLDEN=1 writes it)",
                golden.display()
            )
        });
        if help != expected {
            stale.push(format!("{stem}:\n--- golden\n{expected}\n--- now\n{help}"));
        }
    }
    assert!(
        stale.is_empty(),
        "help changed; if intended, run MESHLAB_UPDATE_GOLDEN=1 cargo test -p meshlab-user --test help_golden\n{}",
        stale.join("\n")
    );
}
