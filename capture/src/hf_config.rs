//! `--model-config`: the shape of a Hugging Face Llama-family model from its `config.json`.
//!
//! Reads hidden_size, intermediate_size, num_hidden_layers, num_attention_heads,
//! num_key_value_heads, vocab_size, rope_theta, rms_norm_eps, tie_word_embeddings and
//! max_position_embeddings. A config of another family, or one missing a field fp8scope cannot
//! guess, is refused with one line naming the file and the field. Fields that change the numerics
//! in ways fp8scope does not model (a `rope_scaling` law, biases) are reported, never ignored
//! silently.

use fp8scope_schemas::config::{Arch, AttnMask, ModelDims};
use serde_json::Value;
use std::path::Path;

/// The families whose config.json describes the model fp8scope's `llama` architecture trains.
const LLAMA_TYPES: [&str; 1] = ["llama"];

/// A Llama-family shape read from a config.json.
#[derive(Clone, Debug, PartialEq)]
pub struct HfShape {
    pub model: ModelDims,
    /// The longest sequence the model was built for.
    pub max_positions: u32,
    /// What the file asks for that fp8scope trains differently, in words.
    pub notes: Vec<String>,
}

fn field<'a>(v: &'a Value, path: &Path, name: &str) -> anyhow::Result<&'a Value> {
    v.get(name).filter(|x| !x.is_null()).ok_or_else(|| anyhow::anyhow!("{}: missing field \"{name}\"", path.display()))
}

fn positive(v: &Value, path: &Path, name: &str) -> anyhow::Result<u32> {
    let x = field(v, path, name)?;
    x.as_u64()
        .filter(|&n| n > 0 && n <= u32::MAX as u64)
        .map(|n| n as u32)
        .ok_or_else(|| anyhow::anyhow!("{}: \"{name}\" must be a positive whole number, is {x}", path.display()))
}

fn number(v: &Value, path: &Path, name: &str, default: f64) -> anyhow::Result<f64> {
    match v.get(name) {
        None | Some(Value::Null) => Ok(default),
        Some(x) => {
            x.as_f64().filter(|f| f.is_finite() && *f > 0.0).ok_or_else(|| anyhow::anyhow!("{}: \"{name}\" must be a positive number, is {x}", path.display()))
        }
    }
}

/// Reads `path` as a Llama-family config.json; `batch` and `seq` are the run's own.
pub fn read(path: &Path, batch: u32, seq: u32) -> anyhow::Result<HfShape> {
    let text = std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("--model-config {}: {e}", path.display()))?;
    let v: Value = serde_json::from_str(&text).map_err(|e| anyhow::anyhow!("--model-config {}: not JSON ({e})", path.display()))?;
    parse(&v, path, batch, seq)
}

fn parse(v: &Value, path: &Path, batch: u32, seq: u32) -> anyhow::Result<HfShape> {
    let model_type = v.get("model_type").and_then(Value::as_str).unwrap_or("");
    if !LLAMA_TYPES.contains(&model_type) {
        let archs = v.get("architectures").map(|a| a.to_string()).unwrap_or_else(|| "none given".into());
        anyhow::bail!(
            "{}: model_type \"{model_type}\" (architectures {archs}) is not a Llama-family model; fp8scope trains model_type {}",
            path.display(),
            LLAMA_TYPES.join(", ")
        );
    }
    let channels = positive(v, path, "hidden_size")?;
    let heads = positive(v, path, "num_attention_heads")?;
    let kv_heads = match v.get("num_key_value_heads") {
        None | Some(Value::Null) => heads,
        Some(_) => positive(v, path, "num_key_value_heads")?,
    };
    if channels % heads != 0 {
        anyhow::bail!("{}: num_attention_heads {heads} does not divide hidden_size {channels}", path.display());
    }
    if heads % kv_heads != 0 {
        anyhow::bail!("{}: num_key_value_heads {kv_heads} does not divide num_attention_heads {heads}", path.display());
    }
    if let Some(hd) = v.get("head_dim").and_then(Value::as_u64)
        && hd != (channels / heads) as u64
    {
        anyhow::bail!("{}: head_dim {hd} differs from hidden_size / num_attention_heads = {}; fp8scope needs them equal", path.display(), channels / heads);
    }
    for bias in ["attention_bias", "mlp_bias"] {
        if v.get(bias).and_then(Value::as_bool) == Some(true) {
            anyhow::bail!("{}: \"{bias}\": true; fp8scope's Llama has no biases", path.display());
        }
    }
    if let Some(act) = v.get("hidden_act").and_then(Value::as_str)
        && act != "silu"
    {
        anyhow::bail!("{}: hidden_act \"{act}\"; fp8scope's Llama MLP is SwiGLU (silu)", path.display());
    }
    let max_positions = positive(v, path, "max_position_embeddings")?;
    if seq > max_positions {
        anyhow::bail!("{}: --seq {seq} is longer than max_position_embeddings {max_positions}", path.display());
    }
    let mut notes = Vec::new();
    if let Some(rs) = v.get("rope_scaling").filter(|x| !x.is_null()) {
        notes.push(format!("rope_scaling {rs} is not applied: the rotary frequencies are the plain θ^(−2i/d) ones"));
    }
    let model = ModelDims {
        arch: Arch::Llama,
        vocab: positive(v, path, "vocab_size")?,
        channels,
        ffn: positive(v, path, "intermediate_size")?,
        heads,
        layers: positive(v, path, "num_hidden_layers")?,
        batch,
        seq,
        attn_mask: AttnMask::Causal,
        kv_heads: Some(kv_heads),
        rope_theta: Some(number(v, path, "rope_theta", 10000.0)?),
        norm_eps: Some(number(v, path, "rms_norm_eps", 1e-6)?),
        tie_embeddings: v.get("tie_word_embeddings").and_then(Value::as_bool).unwrap_or(false),
    };
    Ok(HfShape { model, max_positions, notes })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf").join(name)
    }

    #[test]
    fn tinyllama_reads_as_its_published_shape() {
        let s = read(&fixture("TinyLlama-1.1B-Chat-v1.0.config.json"), 4, 512).unwrap();
        let m = &s.model;
        assert_eq!((m.vocab, m.channels, m.ffn, m.heads, m.kv_heads(), m.layers), (32000, 2048, 5632, 32, 4, 22));
        assert_eq!((m.rope_theta, m.norm_eps, m.tie_embeddings), (Some(10000.0), Some(1e-5), false));
        assert_eq!((s.max_positions, m.batch, m.seq), (2048, 4, 512));
        assert!(s.notes.is_empty());
    }

    #[test]
    fn smollm2_has_tied_embeddings_and_three_to_one_grouped_heads() {
        let s = read(&fixture("SmolLM2-135M.config.json"), 1, 64).unwrap();
        let m = &s.model;
        assert_eq!((m.vocab, m.channels, m.ffn, m.heads, m.kv_heads(), m.layers), (49152, 576, 1536, 9, 3, 30));
        assert_eq!((m.rope_theta, m.tie_embeddings, m.head_dim()), (Some(100000.0), true, 64));
    }

    #[test]
    fn other_families_and_missing_fields_get_one_line() {
        let e = read(&fixture("Qwen2-0.5B.config.json"), 1, 64).unwrap_err().to_string();
        assert!(e.contains("qwen2") && e.contains("not a Llama-family"), "{e}");
        assert!(!e.contains('\n'));
        let p = Path::new("x.json");
        let mut v: Value = serde_json::from_str(&std::fs::read_to_string(fixture("SmolLM2-135M.config.json")).unwrap()).unwrap();
        v.as_object_mut().unwrap().remove("intermediate_size");
        let e = parse(&v, p, 1, 64).unwrap_err().to_string();
        assert_eq!(e, "x.json: missing field \"intermediate_size\"");
        let e = read(&fixture("SmolLM2-135M.config.json"), 1, 9000).unwrap_err().to_string();
        assert!(e.contains("max_position_embeddings 8192"), "{e}");
        let e = read(Path::new("/nonexistent/config.json"), 1, 8).unwrap_err().to_string();
        assert!(e.starts_with("--model-config /nonexistent/config.json"), "{e}");
    }
}
