//! The cache of timed cuBLASLt algorithms. cuBLASLt's heuristic names several algorithms for a GEMM
//! shape, and its first choice is often not the fastest (on an H200, at llama-1b's and seed's
//! shapes, the fastest of its first 8 takes up to 18% less time). `blas.rs` times the candidates
//! the first time a shape runs and keeps the fastest; this file remembers the choice, per GPU model
//! and cuBLASLt version, in a JSON file, so that every later run on the machine takes the same
//! algorithm without timing it again: timings vary from process to process, and a different
//! algorithm sums in a different order, so without the cache two runs could differ in their last
//! bits.
//!
//! `FP8SCOPE_GEMM_TUNE=0` turns timing off (the heuristic's first choice, as before the cache);
//! `FP8SCOPE_GEMM_TUNE=N` times the heuristic's first N proposals instead of 8 (its choices are kept
//! apart from the default's, under "top N" in the cache);
//! `FP8SCOPE_GEMM_CACHE=FILE` moves the cache from `$XDG_CACHE_HOME/fp8scope/gemm-algorithms.json`
//! (or `~/.cache/…`). A cache that cannot be read is ignored and rewritten; one that cannot be
//! written is reported once on stderr, and the run goes on timing its shapes itself.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The file's layout version; a file of another version is ignored and replaced.
const FORMAT: u32 = 1;

/// How many of the heuristic's proposals are timed unless `FP8SCOPE_GEMM_TUNE` says otherwise.
pub const DEFAULT_CANDIDATES: usize = 8;
/// The most `FP8SCOPE_GEMM_TUNE` may ask for.
pub const MAX_CANDIDATES: usize = 64;

#[derive(serde::Serialize, serde::Deserialize, Default)]
struct File {
    format: u32,
    /// "<GPU> | cuBLASLt <version> | <shape and types>" → cuBLASLt's opaque algorithm words.
    algorithms: BTreeMap<String, [u64; 8]>,
}

/// Timed algorithms, loaded from and saved to one file.
pub struct TuneCache {
    path: Option<PathBuf>,
    /// "<GPU> | cuBLASLt <version>", the prefix of this process's entries.
    scope: String,
    known: BTreeMap<String, [u64; 8]>,
    warned: bool,
    /// How many of the heuristic's proposals to time for a shape not in the cache; a count other
    /// than [`DEFAULT_CANDIDATES`] keeps its choices apart, under "top N" ([`TuneCache::entry`]),
    /// so that they neither replace nor take the default's.
    pub candidates: usize,
}

impl TuneCache {
    /// The cache for this process's GPU and cuBLASLt, or None when `FP8SCOPE_GEMM_TUNE=0`; an
    /// `FP8SCOPE_GEMM_TUNE` that is not a count from 0 to [`MAX_CANDIDATES`] is an error.
    pub fn from_env(gpu: &str, cublaslt_version: usize) -> Result<Option<TuneCache>, String> {
        let Some(candidates) = candidates_from(std::env::var("FP8SCOPE_GEMM_TUNE").ok().as_deref())? else {
            return Ok(None);
        };
        let path = match std::env::var_os("FP8SCOPE_GEMM_CACHE") {
            Some(p) if !p.is_empty() => Some(PathBuf::from(p)),
            _ => super::kernel_cache::user_cache_dir().map(|d| d.join("gemm-algorithms.json")),
        };
        Ok(Some(TuneCache { candidates, ..TuneCache::at(path, gpu, cublaslt_version) }))
    }

    /// The cache in `path` (None: in memory only, said on stderr at the first entry).
    pub fn at(path: Option<PathBuf>, gpu: &str, cublaslt_version: usize) -> TuneCache {
        let scope = format!("{gpu} | cuBLASLt {cublaslt_version}");
        let known = path.as_deref().map(read).unwrap_or_default();
        TuneCache { path, scope, known, warned: false, candidates: DEFAULT_CANDIDATES }
    }

    fn entry(&self, shape: &str) -> String {
        match self.candidates {
            DEFAULT_CANDIDATES => format!("{} | {shape}", self.scope),
            n => format!("{} | top {n} | {shape}", self.scope),
        }
    }

    /// The algorithm timed for `shape` (any stable description of the GEMM), if any.
    pub fn get(&self, shape: &str) -> Option<[u64; 8]> {
        self.known.get(&self.entry(shape)).copied()
    }

    /// Remembers `algo` for `shape` and saves the file at once (merged with what other processes
    /// saved meanwhile), so that a run cut short keeps what it timed.
    pub fn put(&mut self, shape: &str, algo: [u64; 8]) {
        let key = self.entry(shape);
        self.known.insert(key.clone(), algo);
        let failed = match &self.path {
            Some(path) => save(path, &key, algo).err().map(|e| format!("cannot write the GEMM algorithm cache {} ({e})", path.display())),
            None => Some("has no place for the GEMM algorithm cache (neither HOME nor XDG_CACHE_HOME is set)".to_string()),
        };
        if let Some(why) = failed.filter(|_| !self.warned) {
            self.warned = true;
            eprintln!(
                "fp8scope: {why}; each run times its GEMM algorithms again, so reruns may differ in their last bits (FP8SCOPE_GEMM_CACHE=FILE sets the cache, FP8SCOPE_GEMM_TUNE=0 turns timing off)"
            );
        }
    }
}

/// How many proposals to time for an `FP8SCOPE_GEMM_TUNE` of `value` (unset: the default); None
/// for 0 (no timing); an error for anything but a count up to [`MAX_CANDIDATES`].
fn candidates_from(value: Option<&str>) -> Result<Option<usize>, String> {
    let Some(v) = value else { return Ok(Some(DEFAULT_CANDIDATES)) };
    match v.trim().parse::<usize>() {
        Ok(0) => Ok(None),
        Ok(n) if n <= MAX_CANDIDATES => Ok(Some(n)),
        _ => Err(format!("FP8SCOPE_GEMM_TUNE={v}: expected 0 (no timing) or how many of cuBLASLt's proposals to time, 1 to {MAX_CANDIDATES}")),
    }
}

/// The entries of the file at `path`; nothing when it is absent, unreadable or of another format.
fn read(path: &Path) -> BTreeMap<String, [u64; 8]> {
    std::fs::read(path).ok().and_then(|b| serde_json::from_slice::<File>(&b).ok()).filter(|f| f.format == FORMAT).map(|f| f.algorithms).unwrap_or_default()
}

/// Adds one entry to the file at `path`: reads what is there, inserts, writes a temporary file
/// beside it and renames it over the old one (a reader never sees half a file).
fn save(path: &Path, key: &str, algo: [u64; 8]) -> std::io::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    let mut file = File { format: FORMAT, algorithms: read(path) };
    file.algorithms.insert(key.to_string(), algo);
    let tmp = path.with_extension(format!("json.{}.tmp", std::process::id()));
    std::fs::write(&tmp, serde_json::to_vec_pretty(&file).map_err(std::io::Error::other)?)?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_timed_algorithm_is_found_again_by_a_later_process_of_the_same_gpu_and_library() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub").join("algos.json");
        let mut a = TuneCache::at(Some(path.clone()), "NVIDIA H200", 130000);
        assert_eq!(a.get("8192x2048x2048 E4M3"), None);
        a.put("8192x2048x2048 E4M3", [1, 2, 3, 4, 5, 6, 7, 8]);
        // Another process meanwhile saves a shape of its own: both survive.
        let mut b = TuneCache::at(Some(path.clone()), "NVIDIA H200", 130000);
        b.put("2048x2048x8192 E5M2", [9; 8]);
        let later = TuneCache::at(Some(path.clone()), "NVIDIA H200", 130000);
        assert_eq!(later.get("8192x2048x2048 E4M3"), Some([1, 2, 3, 4, 5, 6, 7, 8]));
        assert_eq!(later.get("2048x2048x8192 E5M2"), Some([9; 8]));
        // Another GPU model or cuBLASLt version does not take them.
        assert_eq!(TuneCache::at(Some(path.clone()), "NVIDIA H100", 130000).get("8192x2048x2048 E4M3"), None);
        assert_eq!(TuneCache::at(Some(path.clone()), "NVIDIA H200", 130100).get("8192x2048x2048 E4M3"), None);
        assert!(std::fs::read_dir(path.parent().unwrap()).unwrap().all(|e| !e.unwrap().file_name().to_string_lossy().ends_with(".tmp")));
        // Choices among another number of proposals are kept apart, both ways.
        let mut top32 = TuneCache::at(Some(path.clone()), "NVIDIA H200", 130000);
        top32.candidates = 32;
        assert_eq!(top32.get("8192x2048x2048 E4M3"), None);
        top32.put("8192x2048x2048 E4M3", [7; 8]);
        let mut again = TuneCache::at(Some(path.clone()), "NVIDIA H200", 130000);
        assert_eq!(again.get("8192x2048x2048 E4M3"), Some([1, 2, 3, 4, 5, 6, 7, 8]));
        again.candidates = 32;
        assert_eq!(again.get("8192x2048x2048 E4M3"), Some([7; 8]));
        again.candidates = DEFAULT_CANDIDATES;
        assert_eq!(again.get("8192x2048x2048 E4M3"), Some([1, 2, 3, 4, 5, 6, 7, 8]));
    }

    #[test]
    fn the_tuning_setting_is_a_count_of_proposals_or_a_clear_error() {
        assert_eq!(candidates_from(None), Ok(Some(DEFAULT_CANDIDATES)));
        assert_eq!(candidates_from(Some("0")), Ok(None));
        assert_eq!(candidates_from(Some(" 32 ")), Ok(Some(32)));
        assert_eq!(candidates_from(Some("64")), Ok(Some(MAX_CANDIDATES)));
        for bad in ["65", "-1", "many", ""] {
            let e = candidates_from(Some(bad)).unwrap_err();
            assert!(e.starts_with(&format!("FP8SCOPE_GEMM_TUNE={bad}: expected 0")), "{e}");
        }
    }

    #[test]
    fn a_broken_or_foreign_cache_file_is_ignored_and_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("algos.json");
        for junk in ["{ half a fi", r#"{"format": 99, "algorithms": {"NVIDIA H200 | cuBLASLt 1 | s": [1,1,1,1,1,1,1,1]}}"#] {
            std::fs::write(&path, junk).unwrap();
            let mut c = TuneCache::at(Some(path.clone()), "NVIDIA H200", 1);
            assert_eq!(c.get("s"), None, "{junk}");
            c.put("s", [2; 8]);
            assert_eq!(TuneCache::at(Some(path.clone()), "NVIDIA H200", 1).get("s"), Some([2; 8]));
        }
    }

    #[test]
    fn an_unwritable_cache_keeps_its_entries_in_memory() {
        let dir = tempfile::tempdir().unwrap();
        // A path under a regular file cannot be created.
        let blocker = dir.path().join("file");
        std::fs::write(&blocker, "x").unwrap();
        let mut c = TuneCache::at(Some(blocker.join("algos.json")), "G", 1);
        c.put("s", [3; 8]);
        assert_eq!(c.get("s"), Some([3; 8]));
        assert!(c.warned);
        // Nowhere to keep it at all: the same.
        let mut nowhere = TuneCache::at(None, "G", 1);
        nowhere.put("s", [4; 8]);
        assert_eq!((nowhere.get("s"), nowhere.warned), (Some([4; 8]), true));
    }
}
