//! `report` end to end on runs with planted answers (see `common`): every chart listed in
//! report.json exists, decodes, has its documented size and is not blank; index.html references
//! only files that exist; what cannot be drawn is said instead; and the page, opened in headless
//! Chromium, shows every image loaded (each <img>'s naturalWidth equals its file's width).
//!
//! The Chromium test needs Debian's `chromium` (`apt-get install -y chromium`; `.ci/run` installs
//! it) and fails, saying so, when it is missing.

mod common;

use common::*;
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The documented size of each chart kind (README.md, "report").
fn documented_size(kind: &str) -> (u32, u32) {
    match kind {
        "loss" => (1200, 800),
        "heatmap-cosine" | "heatmap-underflow" | "heatmap-saturated" | "heatmap-block-spread" | "heatmap-block-flushed" | "heatmap-whatif" => (1200, 900),
        "amax" => (1200, 900),
        "histogram" => (1200, 800),
        "sites" | "channels" => (1200, 600),
        other => panic!("undocumented chart kind {other}"),
    }
}

/// Decodes the PNG and returns (width, height, standard deviation of luminance, share of pixels
/// that are not white).
fn png_stats(path: &Path) -> (u32, u32, f64, f64) {
    let file = std::fs::File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut dec = png::Decoder::new(std::io::BufReader::new(file));
    dec.set_transformations(png::Transformations::EXPAND | png::Transformations::STRIP_16);
    let mut reader = dec.read_info().unwrap_or_else(|e| panic!("{} does not decode: {e}", path.display()));
    let mut buf = vec![0u8; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).unwrap_or_else(|e| panic!("{} does not decode: {e}", path.display()));
    let ch = info.color_type.samples();
    assert!(ch >= 3, "{}: expected RGB(A), got {:?}", path.display(), info.color_type);
    let px = &buf[..info.buffer_size()];
    let (mut sum, mut sq, mut inked, mut n) = (0f64, 0f64, 0usize, 0usize);
    for p in px.chunks_exact(ch) {
        let l = 0.2126 * p[0] as f64 + 0.7152 * p[1] as f64 + 0.0722 * p[2] as f64;
        sum += l;
        sq += l * l;
        n += 1;
        if p[0] < 245 || p[1] < 245 || p[2] < 245 {
            inked += 1;
        }
    }
    let mean = sum / n as f64;
    (info.width, info.height, (sq / n as f64 - mean * mean).max(0.0).sqrt(), inked as f64 / n as f64)
}

/// Every `src="…"` and `href="…"` of the page.
fn references(html: &str) -> Vec<String> {
    let mut out = Vec::new();
    for attr in ["src=\"", "href=\""] {
        let mut rest = html;
        while let Some(i) = rest.find(attr) {
            rest = &rest[i + attr.len()..];
            let end = rest.find('"').expect("closed attribute");
            out.push(rest[..end].to_string());
            rest = &rest[end..];
        }
    }
    out
}

/// Runs `report` and checks every chart and the page's references; returns report.json.
fn report_ok(args: &[String], out: &Path) -> Value {
    let mut all: Vec<String> = vec!["report".into()];
    all.extend(args.iter().cloned());
    all.extend(["--out".into(), p(out), "--json".into()]);
    let o = analyze(&all);
    assert_eq!(o.code, 0, "report failed: {}", o.stderr);
    let j = o.json();
    let on_disk: Value = serde_json::from_str(&std::fs::read_to_string(out.join("report.json")).unwrap()).unwrap();
    assert_eq!(j["charts"], on_disk["charts"], "stdout --json and report.json list the same charts");
    let charts = j["charts"].as_array().unwrap();
    for c in charts {
        let file = out.join(c["file"].as_str().unwrap());
        let kind = c["kind"].as_str().unwrap();
        let want = documented_size(kind);
        assert_eq!((c["width"].as_u64(), c["height"].as_u64()), (Some(want.0 as u64), Some(want.1 as u64)), "{kind}");
        let (w, h, sd, inked) = png_stats(&file);
        assert_eq!((w, h), want, "{} has the documented size", file.display());
        // A blank or single-colour image has sd 0; a chart with axes, text and data has far more.
        assert!(sd > 20.0, "{} looks blank: luminance sd {sd:.1}", file.display());
        assert!(inked > 0.02, "{} looks empty: {:.1}% non-white pixels", file.display(), 100.0 * inked);
    }
    let html = std::fs::read_to_string(out.join("index.html")).unwrap();
    let refs = references(&html);
    for r in &refs {
        assert!(!r.contains("://") && !r.starts_with('/'), "index.html references only relative files, not {r}");
        assert!(out.join(r).is_file(), "index.html references {r}, which does not exist");
    }
    let listed: BTreeSet<String> = charts.iter().map(|c| c["file"].as_str().unwrap().to_string()).collect();
    let shown: BTreeSet<String> = refs.iter().filter(|r| r.ends_with(".png")).cloned().collect();
    assert_eq!(listed, shown, "the page shows every chart listed in report.json, and only those");
    let pngs: BTreeSet<String> =
        std::fs::read_dir(out).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).filter(|n| n.ends_with(".png")).collect();
    assert_eq!(pngs, listed, "no PNG is written without being listed");
    j
}

fn kinds(j: &Value) -> BTreeSet<String> {
    j["charts"].as_array().unwrap().iter().map(|c| c["kind"].as_str().unwrap().to_string()).collect()
}

#[test]
fn report_draws_every_chart_for_a_drifting_run_against_its_baseline() {
    let tmp = tempfile::tempdir().unwrap();
    let (run, base) = (fp8(tmp.path()), bf16(tmp.path()));
    let out = tmp.path().join("report");
    let j = report_ok(&[p(&run), "--baseline".into(), p(&base)], &out);
    let k = kinds(&j);
    for want in ["loss", "heatmap-cosine", "heatmap-underflow", "heatmap-saturated", "sites", "amax", "channels", "heatmap-whatif"] {
        assert!(k.contains(want), "a {want} chart: {k:?}");
    }
    // The findings are the other commands' answers, in words.
    let a = analyze(&["anomalies", &p(&run), "--baseline", &p(&base), "--json"]).json();
    let drift = a["drift"]["first_step"].as_i64().expect("the planted drift is found");
    let f = &j["runs"][0];
    assert_eq!(f["anomalies"]["drift"]["first_step"].as_i64(), Some(drift));
    let html = std::fs::read_to_string(out.join("index.html")).unwrap();
    assert!(html.contains(&format!("drifted above the baseline from step {drift}")), "the page says where the drift starts");
    let l = analyze(&["locate", &p(&run), "--baseline", &p(&base), "--json"]).json();
    let first = l["first"].as_str().expect("locate names a first GEMM");
    assert_eq!(f["locate"]["first"].as_str(), Some(first));
    assert!(html.contains(first), "the page names locate's verdict {first}");
    assert!(j["not_drawn"].as_array().unwrap().is_empty(), "{}", j["not_drawn"]);
}

#[test]
fn report_draws_the_outlier_channel_of_the_top_site_s_activation_or_says_there_is_no_dump() {
    let tmp = tempfile::tempdir().unwrap();
    // Both runs dump layers.1.fc1's activation with channel 33 forty times larger.
    let outlier = Some((1, fp8scope_schemas::names::Module::Fc1, 33, 40.0));
    let mut a = fp8_plan();
    a.outlier_channel = outlier;
    let mut b = Plan::new("bf16", fp8scope_schemas::config::RecipeKind::Bf16);
    b.outlier_channel = outlier;
    let (run, base) = (write_run(tmp.path(), &a), write_run(tmp.path(), &b));
    let out = tmp.path().join("report");
    let j = report_ok(&[p(&run), "--baseline".into(), p(&base)], &out);
    let charts = j["charts"].as_array().unwrap();
    let c = charts.iter().find(|c| c["kind"] == "channels").unwrap_or_else(|| panic!("a channels chart: {charts:?}"));
    assert_eq!(c["file"], "fp8-channels.png");
    let caption = c["caption"].as_str().unwrap();
    // The top GEMM is layers.1.fc1.fprop, crossed at step 120: its site's activation at that dump
    // step, 256 dumped values = 4 rows of the 512 × 64 tensor.
    assert!(caption.contains("layers.1.fc1.activation") && caption.contains("layers.1.fc1.fprop"), "{caption}");
    assert!(caption.contains("over 4 of its 512 rows (256 values)"), "{caption}");
    assert!(caption.contains("channel 33 holds the largest"), "{caption}");
    assert!(c["title"].as_str().unwrap().ends_with("layers.1.fc1.activation at step 120"), "{}", c["title"]);

    // A run without dumps (ranked from its shadow records): the page says there is no dump.
    let shadow = shadowed(tmp.path());
    let out2 = tmp.path().join("report2");
    let j2 = report_ok(&[p(&shadow)], &out2);
    assert!(!kinds(&j2).contains("channels"));
    let nd = j2["runs"][0]["not_drawn"].as_array().unwrap();
    assert!(nd.iter().any(|s| s.as_str().unwrap().starts_with("per-channel max|x| of layers.0.fc2.activation: the run has no dump of it")), "{nd:?}");
    let html = std::fs::read_to_string(out2.join("index.html")).unwrap();
    assert!(html.contains("the run has no dump of it"), "the page says it");
}

#[test]
fn report_says_what_it_could_not_draw_without_baseline_or_dumps() {
    let tmp = tempfile::tempdir().unwrap();
    let mut plan = Plan::new("nodump", fp8scope_schemas::config::RecipeKind::Delayed);
    plan.dump_steps = Vec::new();
    let run = write_run(tmp.path(), &plan);
    let out = tmp.path().join("report");
    let j = report_ok(&[p(&run)], &out);
    let k = kinds(&j);
    assert!(k.contains("loss") && k.contains("heatmap-underflow"), "{k:?}");
    assert!(!k.contains("heatmap-cosine") && !k.contains("histogram") && !k.contains("sites") && !k.contains("heatmap-whatif"), "nothing drawn empty: {k:?}");
    let html = std::fs::read_to_string(out.join("index.html")).unwrap();
    assert!(html.contains("Not drawn"), "the page has a 'Not drawn' section");
    assert!(html.contains("no --baseline given"), "it says the baseline is missing");
    assert!(html.contains("give --baseline B, or record the run with --shadow"), "it says why locate could not run");
    assert!(html.contains("what-if chart: the run has no whole 2-D operand dumps"), "it says why the what-if chart is missing");

    // With a baseline but no dumps: the cosine heatmap is missing for want of tensors.
    let base = bf16(tmp.path());
    let out2 = tmp.path().join("report2");
    let j2 = report_ok(&[p(&run), "--baseline".into(), p(&base)], &out2);
    assert!(!kinds(&j2).contains("heatmap-cosine"));
    let html2 = std::fs::read_to_string(out2.join("index.html")).unwrap();
    assert!(html2.contains("the run dumped no tensors (record with --dump-every N)"), "it says the dumps are missing");
}

#[test]
fn report_on_a_diverged_run_marks_the_first_nonfinite_step() {
    let tmp = tempfile::tempdir().unwrap();
    let (run, base) = (nan(tmp.path()), bf16(tmp.path()));
    let out = tmp.path().join("report");
    let j = report_ok(&[p(&run), "--baseline".into(), p(&base)], &out);
    let step = j["runs"][0]["anomalies"]["nonfinite"]["first_loss_step"].as_i64();
    assert_eq!(step, Some(NAN_STEP as i64 + 1));
    let html = std::fs::read_to_string(out.join("index.html")).unwrap();
    assert!(html.contains(&format!("The loss went non-finite at step {}", NAN_STEP + 1)));
}

#[test]
fn report_rejects_bad_input_with_one_line() {
    let tmp = tempfile::tempdir().unwrap();
    let o = analyze(&["report", &p(&tmp.path().join("missing")), "--out", &p(&tmp.path().join("r"))]);
    assert_eq!(o.code, 2);
    assert_eq!(o.stderr.lines().count(), 1, "{}", o.stderr);
    let run = bf16(tmp.path());
    let o = analyze(&["report", &p(&run)]);
    assert_eq!(o.code, 2, "--out is required");
    let o = analyze(&["report", &p(&run), "--baseline", &p(&run), "--out", &p(&tmp.path().join("r"))]);
    assert_eq!(o.code, 2, "the baseline alone is not a report");
    assert!(o.stderr.contains("besides the baseline"), "{}", o.stderr);
}

// ---------------------------------------------------------------- the page in a browser

fn chromium() -> PathBuf {
    for name in ["chromium", "chromium-browser"] {
        if let Ok(o) = Command::new("which").arg(name).output() {
            let path = String::from_utf8_lossy(&o.stdout).trim().to_string();
            if o.status.success() && !path.is_empty() {
                return PathBuf::from(path);
            }
        }
    }
    panic!("headless Chromium is needed to check the report page: install it with `apt-get update && apt-get install -y chromium` (.ci/run does)");
}

/// Runs Chromium headless on `url` with a fresh profile and `extra` flags; returns stdout.
fn headless(url: &str, extra: &[String]) -> String {
    let profile = tempfile::tempdir().unwrap();
    let out = Command::new(chromium())
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(extra)
        .arg(url)
        .output()
        .expect("start chromium");
    assert!(out.status.success(), "chromium failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn report_page_shows_every_image_in_headless_chromium() {
    let tmp = tempfile::tempdir().unwrap();
    let (run, base) = (fp8(tmp.path()), bf16(tmp.path()));
    let out = tmp.path().join("report");
    let j = report_ok(&[p(&run), "--baseline".into(), p(&base)], &out);
    let charts = j["charts"].as_array().unwrap();

    // A copy of the page with a script that, once everything loaded, writes each image's file
    // and natural size into the DOM, which --dump-dom prints.
    let html = std::fs::read_to_string(out.join("index.html")).unwrap();
    let probe = r#"<script>window.addEventListener('load', () => {
  const r = [...document.images].map(i => i.getAttribute('src') + ' ' + (i.complete ? i.naturalWidth : -1) + 'x' + i.naturalHeight);
  const pre = document.createElement('pre'); pre.id = 'probe'; pre.textContent = 'IMAGES\n' + r.join('\n') + '\nEND';
  document.body.appendChild(pre);
});</script></body>"#;
    std::fs::write(out.join("probe.html"), html.replace("</body>", probe)).unwrap();
    let url = format!("file://{}", out.join("probe.html").display());
    let dom = headless(&url, &["--virtual-time-budget=10000".into(), "--dump-dom".into()]);
    let block = dom.split("IMAGES\n").nth(1).and_then(|s| s.split("\nEND").next()).unwrap_or_else(|| panic!("the probe did not run: {dom:.2000}"));
    let seen: Vec<(String, String)> = block.lines().map(|l| l.rsplit_once(' ').map(|(a, b)| (a.to_string(), b.to_string())).expect("src size")).collect();
    assert_eq!(seen.len(), charts.len(), "one <img> per chart: {seen:?}");
    for c in charts {
        let file = c["file"].as_str().unwrap();
        let want = format!("{}x{}", c["width"], c["height"]);
        let got = seen.iter().find(|(s, _)| s == file).map(|(_, n)| n.clone());
        assert_eq!(got.as_deref(), Some(want.as_str()), "{file} loaded in the browser at its natural size");
    }

    // And a screenshot of the real page: it decodes and is not blank.
    let shot = tmp.path().join("page.png");
    headless(
        &format!("file://{}", out.join("index.html").display()),
        &[format!("--screenshot={}", shot.display()), "--window-size=1280,2400".into(), "--virtual-time-budget=10000".into()],
    );
    let (w, h, sd, inked) = png_stats(&shot);
    assert_eq!((w, h), (1280, 2400));
    assert!(sd > 20.0 && inked > 0.05, "the screenshot shows the page (sd {sd:.1}, {:.1}% inked)", 100.0 * inked);
}
