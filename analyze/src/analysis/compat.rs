//! Whether two runs can be compared, and if not, which difference stops it: the model's shape
//! (every dimension), the dump selection (sites, roles, element count, sampling), and the steps the
//! two have in common. Differences that only blur a comparison (seed, data) are warnings.

use crate::error::AnalyzeError;
use crate::load::Run;
use fp8scope_schemas::config::{ModelDims, RecordConfig};
use fp8scope_schemas::names::Role;
use std::collections::BTreeSet;

/// Fails when the two runs' models differ in any dimension, naming each one that differs.
pub fn check_model(run: &Run, base: &Run) -> Result<(), AnalyzeError> {
    let diffs = model_differences(&run.manifest.config.model, &base.manifest.config.model);
    if diffs.is_empty() {
        return Ok(());
    }
    Err(AnalyzeError::incompatible(format!("different model shapes ({}; run '{}' vs baseline '{}')", diffs.join(", "), run.name, base.name)))
}

/// Fails when the two runs dumped different tensors (sites, roles, size or sampling), naming each
/// setting that differs. The dump interval may differ: the common steps are compared.
pub fn check_dump_selection(run: &Run, base: &Run) -> Result<(), AnalyzeError> {
    let diffs = dump_differences(&run.manifest.config.record, &base.manifest.config.record);
    if diffs.is_empty() {
        return Ok(());
    }
    Err(AnalyzeError::incompatible(format!("different dump selections ({}; run '{}' vs baseline '{}')", diffs.join(", "), run.name, base.name)))
}

/// The steps present in both; fails when there are none, saying what was looked at.
pub fn common_steps(what: &str, run: &Run, a: &BTreeSet<i64>, base: &Run, b: &BTreeSet<i64>) -> Result<BTreeSet<i64>, AnalyzeError> {
    let common: BTreeSet<i64> = a.intersection(b).copied().collect();
    if common.is_empty() {
        return Err(AnalyzeError::incompatible(format!(
            "no common {what} steps (run '{}' has {}, baseline '{}' has {})",
            run.name,
            describe_steps(a),
            base.name,
            describe_steps(b)
        )));
    }
    Ok(common)
}

/// Differences that do not stop a comparison but change its meaning.
pub fn warnings(run: &Run, base: &Run) -> Vec<String> {
    let (r, b) = (&run.manifest.config, &base.manifest.config);
    let mut out = Vec::new();
    if r.train.seed != b.train.seed {
        out.push(format!("the runs use different seeds ({} vs {}): differences include the data's", r.train.seed, b.train.seed));
    }
    if r.data != b.data {
        out.push("the runs train on different data settings: differences include the data's".to_string());
    }
    out
}

fn model_differences(a: &ModelDims, b: &ModelDims) -> Vec<String> {
    let mut d = Vec::new();
    let mut cmp = |name: &str, x: u32, y: u32| {
        if x != y {
            d.push(format!("{name} {x} vs {y}"));
        }
    };
    cmp("vocab", a.vocab, b.vocab);
    cmp("channels", a.channels, b.channels);
    cmp("ffn", a.ffn, b.ffn);
    cmp("heads", a.heads, b.heads);
    cmp("layers", a.layers, b.layers);
    cmp("batch", a.batch, b.batch);
    cmp("seq", a.seq, b.seq);
    cmp("kv_heads", a.kv_heads(), b.kv_heads());
    if a.attn_mask != b.attn_mask {
        d.push(format!("attn_mask {:?} vs {:?}", a.attn_mask, b.attn_mask).to_lowercase());
    }
    if a.arch != b.arch {
        d.push(format!("arch {} vs {}", a.arch.as_str(), b.arch.as_str()));
    }
    if a.rope_theta != b.rope_theta || a.norm_eps != b.norm_eps || a.tie_embeddings != b.tie_embeddings {
        d.push(format!(
            "rope_theta/norm_eps/tied {:?}/{:?}/{} vs {:?}/{:?}/{}",
            a.rope_theta, a.norm_eps, a.tie_embeddings, b.rope_theta, b.norm_eps, b.tie_embeddings
        ));
    }
    d
}

fn dump_differences(a: &RecordConfig, b: &RecordConfig) -> Vec<String> {
    let mut d = Vec::new();
    if a.dump_layers != b.dump_layers {
        d.push(format!("dump_layers '{}' vs '{}'", a.dump_layers, b.dump_layers));
    }
    let roles = |r: &[Role]| r.iter().copied().collect::<BTreeSet<_>>();
    let names = |r: &[Role]| r.iter().map(|x| x.as_str()).collect::<Vec<_>>().join(",");
    if roles(&a.dump_roles) != roles(&b.dump_roles) {
        d.push(format!("dump_roles {} vs {}", names(&a.dump_roles), names(&b.dump_roles)));
    }
    if a.dump_max_elems != b.dump_max_elems {
        d.push(format!("dump_max_elems {} vs {}", a.dump_max_elems, b.dump_max_elems));
    }
    if a.dump_sample != b.dump_sample {
        d.push(format!("dump_sample {:?} vs {:?}", a.dump_sample, b.dump_sample).to_lowercase());
    }
    d
}

/// `none`, `step 5`, or `12 steps from 1 to 200`.
fn describe_steps(s: &BTreeSet<i64>) -> String {
    match (s.first(), s.last()) {
        (None, _) | (_, None) => "none".to_string(),
        (Some(a), Some(b)) if a == b => format!("step {a}"),
        (Some(a), Some(b)) => format!("{} steps from {a} to {b}", s.len()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fp8scope_schemas::config::AttnMask;

    fn dims(layers: u32) -> ModelDims {
        ModelDims {
            arch: Default::default(),
            vocab: 512,
            channels: 64,
            ffn: 256,
            heads: 4,
            layers,
            batch: 8,
            seq: 64,
            attn_mask: AttnMask::Causal,
            kv_heads: None,
            rope_theta: None,
            norm_eps: None,
            tie_embeddings: false,
        }
    }

    #[test]
    fn model_differences_name_each_dimension() {
        assert!(model_differences(&dims(2), &dims(2)).is_empty());
        let mut other = dims(4);
        other.attn_mask = AttnMask::Full;
        assert_eq!(model_differences(&dims(2), &other), vec!["layers 2 vs 4", "attn_mask causal vs full"]);
    }

    #[test]
    fn steps_are_described_briefly() {
        assert_eq!(describe_steps(&BTreeSet::new()), "none");
        assert_eq!(describe_steps(&[5].into()), "step 5");
        assert_eq!(describe_steps(&[1, 50, 200].into()), "3 steps from 1 to 200");
    }
}
