//! The memory timeline in a real browser: headless Chromium (Debian's `chromium`; `cargo
//! xtask test` and CI install it, `EMBER_CHROMIUM` names another binary) loads the page
//! `export_memory_timeline` writes, on cpu and emulated cuda:0; the rendered DOM must hold
//! one SVG per device with one band per category, and the screenshot must show the chart.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{Model, both, serial, temp_dir, train_step};
use ember_autograd::Result;
use ember_nn::optim::{Adam, AdamOptions};
use ember_profiler::{MemoryCategory, ProfileOptions, profile};
use ember_tensor::Device;
use ember_testing::test_device;

/// The browser: `EMBER_CHROMIUM`, else the first of Debian's and Google's names on `PATH`.
fn chromium() -> PathBuf {
    if let Some(p) = std::env::var_os("EMBER_CHROMIUM") {
        return PathBuf::from(p);
    }
    for name in ["chromium", "chromium-browser", "google-chrome"] {
        if let Some(dir) = std::env::var_os("PATH")
            .iter()
            .flat_map(std::env::split_paths)
            .find(|d| d.join(name).is_file())
        {
            return dir.join(name);
        }
    }
    panic!(
        "headless Chromium is needed to check the memory timeline and none was found \
         (tried $EMBER_CHROMIUM, chromium, chromium-browser, google-chrome on PATH): \
         install Debian's `chromium` (apt-get install chromium), as `cargo xtask test` does"
    );
}

/// Run the browser headless on `page` with `args`; its stdout. Fails after 120 s.
fn browse(page: &Path, args: &[&str], profile_dir: &Path) -> String {
    let mut child = Command::new(chromium())
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--no-first-run",
            "--window-size=1000,900",
        ])
        .arg(format!("--user-data-dir={}", profile_dir.display()))
        .args(args)
        .arg(format!("file://{}", page.display()))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start chromium");
    // Read stdout on a thread while waiting: a DOM larger than the pipe's buffer would
    // otherwise block the browser forever.
    let mut stdout = child.stdout.take().expect("piped stdout");
    let reader = std::thread::spawn(move || {
        let mut out = String::new();
        std::io::Read::read_to_string(&mut stdout, &mut out).map(|_| out)
    });
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > Duration::from_secs(120) {
            let _ = child.kill();
            panic!("chromium did not finish within 120 s on {}", page.display());
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "chromium failed: {status}");
    reader.join().unwrap().unwrap()
}

fn rgb(hex: &str) -> [u8; 3] {
    let v = u32::from_str_radix(hex.trim_start_matches('#'), 16).unwrap();
    [(v >> 16) as u8, (v >> 8) as u8, v as u8]
}

fn timeline_renders_in_a_browser(dev: &Device) -> Result<()> {
    let _serial = serial();
    let model = Model::new(dev)?;
    let mut opt = Adam::new(model.params(), AdamOptions::default())?;
    train_step(&model, &mut opt, dev)?;
    let mut prof = profile(
        ProfileOptions::new()
            .activities(both())
            .profile_memory(true),
    )
    .unwrap();
    train_step(&model, &mut opt, dev)?;
    train_step(&model, &mut opt, dev)?;
    prof.stop().unwrap();
    let p = prof.profile().unwrap();
    let timelines = p.memory_timeline();
    let names: Vec<&str> = timelines.iter().map(|t| t.device.as_str()).collect();
    // The CPU allocates (the batch is made there); a CUDA run allocates on its device too.
    assert!(names.contains(&"cpu"), "{names:?}");
    assert_eq!(names.contains(&"cuda:0"), dev.is_cuda(), "{names:?}");
    let mine = timelines
        .iter()
        .find(|t| t.device == dev.to_string())
        .unwrap();
    let cats: Vec<MemoryCategory> = mine.series.iter().map(|(c, _)| *c).collect();
    for c in [
        MemoryCategory::BeforeTrace,
        MemoryCategory::Gradients,
        MemoryCategory::Activations,
    ] {
        assert!(cats.contains(&c), "{c:?} missing on {dev}: {cats:?}");
    }
    // The stack is the allocator's count at every instant.
    for i in 0..mine.times_ns.len() {
        let stacked: i64 = mine.series.iter().map(|(_, v)| v[i]).sum();
        assert_eq!(stacked, mine.allocated[i], "instant {i} on {dev}");
    }
    assert_eq!(mine.peak.1, *mine.allocated.iter().max().unwrap());

    let dir = temp_dir(&format!("timeline-{}", dev.to_string().replace(':', "")));
    let page = dir.join("memory_timeline.html");
    prof.export_memory_timeline(&page).unwrap();
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(
        !html.contains("<script"),
        "the page must be self-contained, without scripts"
    );

    // What the browser built from it.
    let dom = browse(&page, &["--dump-dom"], &dir.join("chrome-profile"));
    assert_eq!(dom.matches("<svg").count(), timelines.len(), "{dom}");
    let series: usize = timelines.iter().map(|t| t.series.len()).sum();
    assert_eq!(dom.matches("class=\"series\"").count(), series);
    assert_eq!(dom.matches("class=\"reserved\"").count(), timelines.len());
    assert_eq!(dom.matches("class=\"peak\"").count(), timelines.len());

    // What it drew: not blank, and the bands' colours are on screen.
    let shot = dir.join("shot.png");
    browse(
        &page,
        &[&format!("--screenshot={}", shot.display())],
        &dir.join("chrome-profile"),
    );
    let decoder = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(&shot).unwrap()));
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size().unwrap()];
    let info = reader.next_frame(&mut buf).unwrap();
    let channels = info.color_type.samples();
    let pixels: Vec<&[u8]> = buf[..info.buffer_size()].chunks(channels).collect();
    let non_white = pixels.iter().filter(|p| p[..3] != [255, 255, 255]).count();
    assert!(
        non_white * 20 > pixels.len(),
        "the screenshot is nearly blank: {non_white} of {} pixels drawn",
        pixels.len()
    );
    let largest = mine
        .series
        .iter()
        .max_by_key(|(_, v)| v.iter().copied().max().unwrap_or(0))
        .unwrap()
        .0;
    let want = rgb(largest.color());
    let painted = pixels.iter().filter(|p| p[..3] == want).count();
    assert!(
        painted > 5000,
        "{largest:?} ({}) painted on {painted} pixels",
        largest.color()
    );
    Ok(())
}
test_device!(
    memory_timeline_renders_in_a_browser,
    timeline_renders_in_a_browser
);
