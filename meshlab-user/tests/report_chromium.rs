//! The HTML report opens in a real browser: Debian's headless Chromium renders it to a PNG,
//! which must show the charts (pixels of the chart colours, a varied picture, not a blank page).
//!
//! Skips loudly when `chromium` is not installed, unless MESHLAB_REQUIRE_PRIVILEGED=1.

mod report_support;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use report_support::*;

fn find_chromium() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .flat_map(|d| ["chromium", "chromium-browser"].map(|n| d.join(n)))
        .find(|p| p.is_file())
}

/// Kills the browser if the test fails or times out before it exits.
struct Browser(Child);

impl Drop for Browser {
    fn drop(&mut self) {
        if self.0.try_wait().ok().flatten().is_none() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

fn screenshot(chromium: &Path, html: &Path, png: &Path, profile: &Path) {
    let child = Command::new(chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            &format!("--user-data-dir={}", profile.display()),
            &format!("--screenshot={}", png.display()),
            "--window-size=1400,2000",
            &format!("file://{}", html.display()),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start chromium");
    let mut browser = Browser(child);
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        if let Some(status) = browser.0.try_wait().unwrap() {
            assert!(status.success(), "chromium failed: {status}");
            return;
        }
        assert!(Instant::now() < deadline, "chromium did not finish in 90 s");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn html_report_renders_in_headless_chromium() {
    let Some(chromium) = find_chromium() else {
        meshlab_testkit::privileged::skip(
            "html_report_renders_in_headless_chromium",
            "chromium is not installed (apt-get install -y chromium)",
        );
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let html = dir.path().join("report.html");
    let png = dir.path().join("report.png");
    run_ok(&[
        "report",
        fixture("direct.ndjson").to_str().unwrap(),
        "--html",
        html.to_str().unwrap(),
    ]);
    screenshot(&chromium, &html, &png, &dir.path().join("profile"));
    assert!(png.is_file(), "no screenshot written");

    let decoder = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(&png).unwrap()));
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size().unwrap()];
    let info = reader.next_frame(&mut buf).unwrap();
    assert_eq!((info.width, info.height), (1400, 2000));
    let channels = info.color_type.samples();
    assert!(channels >= 3, "{:?}", info.color_type);
    let pixels: Vec<[u8; 3]> = buf[..info.buffer_size()]
        .chunks(channels)
        .map(|p| [p[0], p[1], p[2]])
        .collect();
    let distinct: HashSet<[u8; 3]> = pixels.iter().copied().collect();
    let white = pixels.iter().filter(|p| **p == [255, 255, 255]).count();
    let count = |rgb: [u8; 3]| pixels.iter().filter(|p| **p == rgb).count();
    // Kind colours (html/svg.rs): compute, queue, and the network bar of the stacked chart.
    let (compute, queue, network) = (
        count([0x4c, 0x78, 0xa8]),
        count([0xe4, 0x57, 0x56]),
        count([0x54, 0xa2, 0x4b]),
    );
    eprintln!(
        "rendered {}x{}: {} distinct colours, {:.1} % white, compute {compute} px, queue {queue} px, network {network} px",
        info.width,
        info.height,
        distinct.len(),
        100.0 * white as f64 / pixels.len() as f64
    );
    assert!(
        distinct.len() > 200,
        "too few colours: a blank or broken page"
    );
    assert!(
        (white as f64) < 0.97 * pixels.len() as f64,
        "page is nearly all white"
    );
    // The SVG charts drew: solid bars in the kind colours cover thousands of pixels.
    assert!(
        compute > 2_000 && queue > 2_000 && network > 2_000,
        "chart colours missing"
    );
    if let Some(keep) = std::env::var_os("MESHLAB_REPORT_PNG") {
        std::fs::copy(&png, keep).unwrap();
    }
}
