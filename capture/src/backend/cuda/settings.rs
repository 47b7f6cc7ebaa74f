//! The CUDA backend's settings from the environment, read and checked once, when a backend opens
//! ([`CudaSettings::from_env`]), instead of by each part that uses one. A value that does not parse
//! is an error naming the variable, so a run never goes on without the setting it was asked for.
//!
//! | variable | setting | default |
//! | --- | --- | --- |
//! | `FP8SCOPE_VERBOSE` | summary lines on stderr (kernels, graphs, the host's gap, cuBLASLt's choices); `0` is off | off |
//! | `FP8SCOPE_ATTENTION` | `unfused`: attention in separate kernels | fused |
//! | `FP8SCOPE_WEIGHT_CASTS` | `batched` (one launch a step) or `each` | batched |
//! | `FP8SCOPE_PROFILE` | time every primitive with events; `0` is off (graphs are off with it) | off |
//! | `FP8SCOPE_GRAPH` | the step in CUDA graphs: `0`/`off` or `1`/`on` | on (off when profiled) |
//! | `FP8SCOPE_PAIR_RUNS` | `1`: SwiGLU's backward cast adds its channel partials over runs of tiles (`cast.rs`) | off |
//! | `FP8SCOPE_LEAD_US` | a hold before each step's first launch, in whole µs (`probe.rs`) | 0 |
//! | `FP8SCOPE_PRECOMPILED` | `0`: compile the kernels with NVRTC even where the binary embeds them | on |
//!
//! The kernels' and GEMM algorithms' disk caches (`FP8SCOPE_KERNEL_CACHE`, `FP8SCOPE_GEMM_TUNE`,
//! `FP8SCOPE_GEMM_CACHE`) are read where those caches open (`kernel_cache.rs`, `gemm_tuning.rs`),
//! since tools without a backend (`fp8-capture kernels`) use them too.

use super::CudaError;

/// Every environment setting of the CUDA backend, parsed.
#[derive(Clone, Debug, PartialEq)]
pub struct CudaSettings {
    pub verbose: bool,
    pub attention_fused: bool,
    pub weight_casts_batched: bool,
    pub profile: bool,
    pub graphs: bool,
    pub pair_runs: bool,
    pub lead_ns: u64,
    pub precompiled: bool,
}

impl CudaSettings {
    /// The settings of this process's environment.
    pub fn from_env() -> Result<CudaSettings, CudaError> {
        Self::from_lookup(|name| std::env::var_os(name).map(|v| v.to_string_lossy().into_owned()))
    }

    /// The settings `var` gives (None: the variable is unset).
    pub fn from_lookup(var: impl Fn(&str) -> Option<String>) -> Result<CudaSettings, CudaError> {
        let on = |name: &str| var(name).is_some_and(|v| v != "0");
        let profile = on("FP8SCOPE_PROFILE");
        Ok(CudaSettings {
            verbose: on("FP8SCOPE_VERBOSE"),
            attention_fused: var("FP8SCOPE_ATTENTION").is_none_or(|v| v != "unfused"),
            weight_casts_batched: super::weight_casts::batched(var("FP8SCOPE_WEIGHT_CASTS").as_deref())?,
            profile,
            graphs: super::step_graph::graphs_from(var("FP8SCOPE_GRAPH").as_deref(), profile)?,
            pair_runs: super::cast::pair_runs_from(var("FP8SCOPE_PAIR_RUNS").as_deref())?,
            lead_ns: super::probe::lead_ns(var("FP8SCOPE_LEAD_US").as_deref())?,
            precompiled: var("FP8SCOPE_PRECOMPILED").is_none_or(|v| v != "0"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(pairs: &[(&str, &str)]) -> Result<CudaSettings, CudaError> {
        let vars: Vec<(String, String)> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        CudaSettings::from_lookup(|name| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone()))
    }

    #[test]
    fn the_defaults_and_each_setting() {
        let d = with(&[]).unwrap();
        assert_eq!(
            d,
            CudaSettings {
                verbose: false,
                attention_fused: true,
                weight_casts_batched: true,
                profile: false,
                graphs: true,
                pair_runs: false,
                lead_ns: 0,
                precompiled: true
            }
        );
        assert!(with(&[("FP8SCOPE_VERBOSE", "1")]).unwrap().verbose);
        assert!(!with(&[("FP8SCOPE_VERBOSE", "0")]).unwrap().verbose, "0 is off");
        assert!(!with(&[("FP8SCOPE_ATTENTION", "unfused")]).unwrap().attention_fused);
        assert!(!with(&[("FP8SCOPE_WEIGHT_CASTS", "each")]).unwrap().weight_casts_batched);
        let p = with(&[("FP8SCOPE_PROFILE", "1")]).unwrap();
        assert!(p.profile && !p.graphs, "profiling turns the graphs off");
        assert!(!with(&[("FP8SCOPE_GRAPH", "0")]).unwrap().graphs);
        assert_eq!(with(&[("FP8SCOPE_LEAD_US", "20")]).unwrap().lead_ns, 20_000);
        assert!(!with(&[("FP8SCOPE_PRECOMPILED", "0")]).unwrap().precompiled);
    }

    #[test]
    fn a_value_that_does_not_parse_names_its_variable() {
        for (name, bad) in [("FP8SCOPE_WEIGHT_CASTS", "sometimes"), ("FP8SCOPE_LEAD_US", "1.5"), ("FP8SCOPE_GRAPH", "maybe"), ("FP8SCOPE_PAIR_RUNS", "x")] {
            let e = with(&[(name, bad)]).expect_err(name).to_string();
            assert!(e.contains(name), "{name}={bad}: {e}");
        }
        assert!(with(&[("FP8SCOPE_PROFILE", "1"), ("FP8SCOPE_GRAPH", "1")]).is_err(), "the profiler refuses graphs asked for");
    }
}
