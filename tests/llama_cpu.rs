//! End to end on the CPU: the Llama family trains on real English text through a real Hugging Face
//! tokenizer, takes the shape of public models' config.json files, and `--dump-layers` selects
//! sites the way a user expects.
//!
//! The text is Debian's `fortunes` package (apt-get install fortunes, as `.ci/run` does); the
//! tokenizers are `capture/tests/fixtures/tokenizer/*.json`, trained on it by Hugging Face's
//! `tokenizers` library (`make_tokenizer.py` beside them).

mod common;

use common::*;
use std::path::Path;

const CORPUS: &str = "/usr/share/games/fortunes";

fn corpus(file: &str) -> String {
    let p = Path::new(CORPUS).join(file);
    assert!(p.is_file(), "{} is missing: apt-get install fortunes (the README's test command does)", p.display());
    p.display().to_string()
}

fn fixture(rel: &str) -> String {
    repo_root().join("capture/tests/fixtures").join(rel).display().to_string()
}

fn manifest(run: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(run.join("run.json")).unwrap()).unwrap()
}

fn train(out: &Path, args: &[&str]) -> std::process::Output {
    let out_s = out.display().to_string();
    let mut all = vec!["train", "--device", "cpu", "--quiet", "--out", out_s.as_str()];
    all.extend_from_slice(args);
    capture(&all)
}

#[test]
fn llama_tiny_learns_real_english_through_a_bpe_tokenizer() {
    let _g = HEAVY.lock();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("text");
    let (lit, wis) = (corpus("literature"), corpus("wisdom"));
    let tok = fixture("tokenizer/fortunes-bpe-512.json");
    let text = format!("{lit},{wis}");
    let o = train(&out, &["--preset", "llama-tiny", "--recipe", "delayed", "--data", "text", "--text", &text, "--tokenizer", &tok, "--steps", "150"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let m = manifest(&out);
    assert_eq!(m["config"]["model"]["arch"], "llama");
    assert_eq!(m["config"]["model"]["kv_heads"], 2);
    assert_eq!(m["config"]["data"]["paths"].as_array().unwrap().len(), 2);
    assert_eq!(m["config"]["data"]["tokenizer"].as_str().unwrap(), tok);
    let l = losses(&out);
    let (first, last) = (l[0], l[l.len() - 10..].iter().sum::<f64>() / 10.0);
    assert!((first - (512f64).ln()).abs() < 0.3, "starts near ln V: {first}");
    assert!(last < first - 1.5, "learns the text: {first} → {last}");
}

#[test]
fn a_vocabulary_smaller_than_the_tokenizer_is_refused_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let tok = fixture("tokenizer/fortunes-bpe-4096.json");
    let o = train(&dir.path().join("x"), &["--preset", "llama-tiny", "--data", "text", "--text", &corpus("wisdom"), "--tokenizer", &tok, "--steps", "2"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("4096") && err.trim().lines().count() == 1, "{err}");
}

#[test]
fn model_config_trains_the_shape_of_a_public_llama_and_refuses_other_families() {
    let _g = HEAVY.lock();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("smol");
    let cfg = fixture("hf/SmolLM2-135M.config.json");
    // SmolLM2-135M's width, heads and tied 49152-token embedding, two of its 30 layers, a short batch.
    let o = train(&out, &["--model-config", &cfg, "--layers", "2", "--batch", "1", "--seq", "16", "--steps", "2", "--recipe", "delayed"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let m = manifest(&out)["config"].clone();
    let md = &m["model"];
    assert_eq!((md["channels"].as_u64(), md["heads"].as_u64(), md["kv_heads"].as_u64()), (Some(576), Some(9), Some(3)));
    assert_eq!((md["vocab"].as_u64(), md["ffn"].as_u64(), md["tie_embeddings"].as_bool()), (Some(49152), Some(1536), Some(true)));
    assert_eq!(md["rope_theta"].as_f64(), Some(100000.0));
    assert!(m["model_config"].as_str().unwrap().ends_with("SmolLM2-135M.config.json"));
    assert!(losses(&out).iter().all(|l| l.is_finite()));

    let o = train(&dir.path().join("qwen"), &["--model-config", &fixture("hf/Qwen2-0.5B.config.json"), "--steps", "1"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("not a Llama-family model") && err.trim().lines().count() == 1, "{err}");
    assert!(!dir.path().join("qwen").exists(), "a refused run writes nothing");
}

#[test]
fn dump_layers_searches_site_names_and_refuses_a_selection_of_nothing() {
    let _g = HEAVY.lock();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("dump");
    let o = train(&out, &["--preset", "llama-tiny", "--steps", "2", "--dump-every", "1", "--dump-layers", r"layers\.1\."]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let q = analyze(&["query", &out.display().to_string(), "--sql", "SELECT DISTINCT layer, module FROM tensors ORDER BY module", "--json"]);
    let text = String::from_utf8_lossy(&q.stdout);
    assert!(q.status.success(), "{}", String::from_utf8_lossy(&q.stderr));
    for m in ["qkv", "proj", "fc1", "fc2"] {
        assert!(text.contains(m), "site layers.1.{m} dumped: {text}");
    }
    assert!(!text.contains("\"layer\":0"), "only layer 1: {text}");

    let o = train(&dir.path().join("none"), &["--preset", "llama-tiny", "--steps", "2", "--dump-every", "1", "--dump-layers", r"blocks\.1\."]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("selects no site") && err.contains("layers.0.qkv"), "{err}");
}

/// One value of the stats table of `run`: fc2's fprop activation cast of `layer` at `step`.
fn fc2_input(run: &Path, layer: u32, step: u32, column: &str) -> f64 {
    let sql = format!("SELECT {column} AS v FROM stats WHERE module = 'fc2' AND role = 'activation' AND gemm = 'fprop' AND layer = {layer} AND step = {step}");
    let q = analyze(&["query", &run.display().to_string(), "--sql", &sql, "--json"]);
    assert!(q.status.success(), "{}", String::from_utf8_lossy(&q.stderr));
    let v: serde_json::Value = serde_json::from_slice(&q.stdout).unwrap();
    let rows = v.get("rows").and_then(|r| r.as_array()).cloned().or_else(|| v.as_array().cloned()).expect("rows");
    rows[0]["v"].as_f64().unwrap_or_else(|| panic!("{column} at step {step}: {v}"))
}

#[test]
fn the_llama_scenarios_reproduce_their_fp8_mechanism_in_the_statistics() {
    let _g = HEAVY.lock();
    let dir = tempfile::tempdir().unwrap();
    // swiglu-outliers: at step 200 the trigger drives the aligned channel of fc2's input far past
    // the delayed amax (saturation); for the 16 steps of history after it the scale sized for the
    // outlier flushes much of the ordinary input to zero.
    let sw = dir.path().join("swiglu");
    let o = train(&sw, &["--preset", "llama-tiny", "--scenario", "swiglu-outliers", "--steps", "203"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (amax, used) = (fc2_input(&sw, 0, 200, "amax"), fc2_input(&sw, 0, 200, "amax_used"));
    assert!(amax > 100.0 * used, "the outlier at step 200 ({amax}) is far past the delayed amax ({used})");
    assert!(fc2_input(&sw, 0, 200, "saturated_frac") > 0.0);
    assert_eq!(fc2_input(&sw, 0, 200, "amax_channel"), 0.0, "the aligned channel holds the amax");
    assert!(fc2_input(&sw, 0, 199, "underflow_frac") < 0.05);
    assert!(fc2_input(&sw, 0, 201, "underflow_frac") > 0.3, "after it, the ordinary input underflows");

    // massive-activations: from the first step, the topic markers' value in channel 0 holds
    // nearly all of Σx² of fc2's input, and most of the rest flushes to zero.
    let ma = dir.path().join("massive");
    let o = train(&ma, &["--preset", "llama-tiny", "--scenario", "massive-activations", "--steps", "5"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // Massive: over 10⁴ times the amax of layer 1's fc2 input at the first step.
    let (massive, other) = (fc2_input(&ma, 0, 1, "amax"), fc2_input(&ma, 1, 1, "amax"));
    assert!(massive > 1e4 * other, "a massive value: {massive} against {other}");
    assert_eq!(fc2_input(&ma, 0, 5, "amax_channel"), 0.0);
    assert!(fc2_input(&ma, 0, 5, "top_channel_sq_frac") > 0.99);
    assert!(fc2_input(&ma, 0, 5, "underflow_frac") > 0.8);

    // Both need the Llama architecture, and say so.
    let o = train(&dir.path().join("gpt"), &["--preset", "tiny", "--scenario", "massive-activations", "--steps", "5"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("llama-tiny"), "{err}");
}

/// `massive-activations` end to end: triage finds the drift, bisects it to the GEMM whose input
/// holds the massive value (layers.0.fc2.fprop), confirms it on seed 1, and finds that current
/// scaling (another per-tensor scale) does not cure it while block scaling does.
#[test]
fn triage_names_the_massive_activation_gemm_and_block_scaling_as_the_cure() {
    let _g = HEAVY.lock();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("triage");
    let o = analyze(&[
        "triage",
        "--preset",
        "llama-tiny",
        "--scenario",
        "massive-activations",
        "--device",
        "cpu",
        "--quiet",
        "--json",
        "--out",
        out.to_str().unwrap(),
    ]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(1), "an anomaly: {}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_str(&text).expect("verdict JSON");
    assert_eq!(v["anomaly"], "drift", "{v}");
    let culprits: Vec<String> = v["culprits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| format!("layers.{}.{}.{}", c["layer"], c["module"].as_str().unwrap(), c["gemm"].as_str().unwrap()))
        .collect();
    assert_eq!(culprits, ["layers.0.fc2.fprop"], "{v}");
    assert_eq!(v["confirmation"]["held"], true, "{v}");
    assert_eq!(v["current_scaling_cures"], false);
    assert_eq!(v["block_scaling_cures"], true);
}
