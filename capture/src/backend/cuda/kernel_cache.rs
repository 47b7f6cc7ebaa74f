//! The CUBINs NVRTC compiled, kept on disk between runs: compiling `kernels/` takes tens of seconds
//! at every start-up (the computed-source casts alone 40 s on a 2-core machine, and every
//! `fp8-capture` run that `fp8-analyze bisect` or triage's noise runs drive starts afresh), while
//! reading a kept CUBIN takes milliseconds.
//!
//! An entry is keyed by a BLAKE3 hash of everything the CUBIN depends on: the family's whole
//! translation unit (its file with the headers pasted in), the GPU architecture, NVRTC's version
//! and the compiler's options (the include directories among them). A change to any kernel, header, compiler or target
//! makes another key, so an entry is never used for other sources. An entry holds a magic word, the
//! key in full and a BLAKE3 digest of the CUBIN; one whose key or digest does not match (a
//! truncated or damaged file) is compiled again and rewritten. Entries are written to a temporary
//! file and renamed into place, so that concurrent runs never read half of one; the newest
//! [`KEEP`] of each family and architecture are kept.
//!
//! `FP8SCOPE_KERNEL_CACHE=DIR` moves the cache from `$XDG_CACHE_HOME/fp8scope/kernels` (or
//! `~/.cache/…`); `FP8SCOPE_KERNEL_CACHE=0` turns it off. A cache that cannot be written is
//! reported once on stderr, and the run goes on with what it compiled.

use super::CudaError;
use super::kernels::Family;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

/// The first bytes of an entry (its layout's version in the last two).
const MAGIC: &[u8; 8] = b"FP8SKC01";
/// Entries kept per family and architecture (builds alternated side by side keep theirs).
pub const KEEP: usize = 4;

/// `~/.cache/fp8scope` (or `$XDG_CACHE_HOME/fp8scope`), where fp8scope keeps what it learns about
/// a machine; None when neither variable is set.
pub fn user_cache_dir() -> Option<PathBuf> {
    std::env::var_os("XDG_CACHE_HOME")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").filter(|h| !h.is_empty()).map(|h| PathBuf::from(h).join(".cache")))
        .map(|d| d.join("fp8scope"))
}

/// The kernel cache's folder, or None when it is off.
pub struct KernelCache {
    dir: Option<PathBuf>,
    warned: AtomicBool,
}

/// What an entry is keyed by.
pub struct KeyInputs<'a> {
    pub family: Family,
    pub arch: &'a str,
    pub nvrtc_version: (i32, i32),
    /// NVRTC's options ([`super::kernels::compile_options`]).
    pub options: &'a [String],
}

impl KeyInputs<'_> {
    /// The key: a BLAKE3 hash of the inputs and the family's translation unit, each part
    /// length-prefixed so that no two sets of inputs run together into one.
    pub fn key(&self) -> [u8; 32] {
        let mut h = blake3::Hasher::new();
        let mut part = |b: &[u8]| {
            h.update(&(b.len() as u64).to_le_bytes());
            h.update(b);
        };
        part(MAGIC);
        part(format!("{:?}", self.family).as_bytes());
        part(self.arch.as_bytes());
        part(format!("{}.{}", self.nvrtc_version.0, self.nvrtc_version.1).as_bytes());
        for s in self.options {
            part(s.as_bytes());
        }
        part(self.family.translation_unit().as_bytes());
        *h.finalize().as_bytes()
    }
}

impl KernelCache {
    /// The cache `FP8SCOPE_KERNEL_CACHE` names, or the default folder; off for `0` or an empty
    /// value, or where no folder can be found.
    pub fn from_env() -> KernelCache {
        let dir = match std::env::var_os("FP8SCOPE_KERNEL_CACHE") {
            Some(v) if v == "0" || v.is_empty() => None,
            Some(v) => Some(PathBuf::from(v)),
            None => user_cache_dir().map(|d| d.join("kernels")),
        };
        KernelCache::at(dir)
    }

    /// The cache in `dir` (None: off).
    pub fn at(dir: Option<PathBuf>) -> KernelCache {
        KernelCache { dir, warned: AtomicBool::new(false) }
    }

    fn entry_path(dir: &Path, inputs: &KeyInputs, key: &[u8; 32]) -> PathBuf {
        let hex: String = key[..16].iter().map(|b| format!("{b:02x}")).collect();
        dir.join(format!("{}-{hex}.cubin", Self::prefix(inputs)))
    }

    fn prefix(inputs: &KeyInputs) -> String {
        format!("{:?}-{}", inputs.family, inputs.arch)
    }

    /// The CUBIN kept for `inputs`, or `compile`'s, then kept; and whether it came from the disk.
    /// A failed compilation is returned as it is, and nothing is kept.
    pub fn get_or_compile(&self, inputs: &KeyInputs, compile: impl FnOnce() -> Result<Vec<u8>, CudaError>) -> Result<(Vec<u8>, bool), CudaError> {
        let Some(dir) = &self.dir else { return compile().map(|c| (c, false)) };
        let key = inputs.key();
        let path = Self::entry_path(dir, inputs, &key);
        if let Some(cubin) = std::fs::read(&path).ok().and_then(|bytes| decode(&bytes, &key)) {
            return Ok((cubin, true));
        }
        let cubin = compile()?;
        if let Err(e) = write_entry(&path, &key, &cubin) {
            if !self.warned.swap(true, Ordering::Relaxed) {
                eprintln!(
                    "fp8scope: cannot write the kernel cache {} ({e}); each run compiles its kernels again (FP8SCOPE_KERNEL_CACHE=DIR sets the cache, 0 turns it off)",
                    dir.display()
                );
            }
        } else {
            prune(dir, &Self::prefix(inputs), &path);
        }
        Ok((cubin, false))
    }
}

/// The CUBIN of an entry's bytes, if they are a whole entry for `key`.
fn decode(bytes: &[u8], key: &[u8; 32]) -> Option<Vec<u8>> {
    let head = MAGIC.len() + 64;
    if bytes.len() <= head || &bytes[..MAGIC.len()] != MAGIC || &bytes[MAGIC.len()..MAGIC.len() + 32] != key {
        return None;
    }
    let cubin = &bytes[head..];
    (blake3::hash(cubin).as_bytes() == &bytes[MAGIC.len() + 32..head] && cubin.starts_with(b"\x7fELF")).then(|| cubin.to_vec())
}

/// Writes an entry beside `path` and renames it into place.
fn write_entry(path: &Path, key: &[u8; 32], cubin: &[u8]) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut bytes = Vec::with_capacity(MAGIC.len() + 64 + cubin.len());
    bytes.extend_from_slice(MAGIC);
    bytes.extend_from_slice(key);
    bytes.extend_from_slice(blake3::hash(cubin).as_bytes());
    bytes.extend_from_slice(cubin);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
    let tmp = path.with_extension(format!("cubin.{}.{nanos}.tmp", std::process::id()));
    std::fs::write(&tmp, &bytes).and_then(|_| std::fs::rename(&tmp, path)).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

/// Removes the oldest entries of `prefix` (one family and architecture) past [`KEEP`], never
/// `keep` (the one just written). Best effort: an entry that cannot be removed stays.
fn prune(dir: &Path, prefix: &str, keep: &Path) {
    let Ok(rd) = std::fs::read_dir(dir) else { return };
    let mut entries: Vec<(std::time::SystemTime, PathBuf)> = rd
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(&format!("{prefix}-")) && n.ends_with(".cubin")))
        .filter_map(|p| Some((std::fs::metadata(&p).and_then(|m| m.modified()).ok()?, p)))
        .collect();
    entries.sort_by_key(|e| std::cmp::Reverse(e.0));
    let mut kept = 1;
    for (_, p) in entries.into_iter().filter(|(_, p)| p != keep) {
        if kept < KEEP {
            kept += 1;
        } else {
            let _ = std::fs::remove_file(&p);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    fn inputs(arch: &str) -> KeyInputs<'_> {
        KeyInputs { family: Family::Probe, arch, nvrtc_version: (13, 0), options: &[] }
    }

    /// A stand-in CUBIN (an ELF header and a body that names `tag`), and a counter of compilations.
    fn fake(tag: &str, calls: &Cell<usize>) -> Result<Vec<u8>, CudaError> {
        calls.set(calls.get() + 1);
        Ok([b"\x7fELF".as_slice(), tag.as_bytes(), &[7u8; 2000]].concat())
    }

    #[test]
    fn a_kept_cubin_is_read_back_instead_of_compiled_and_another_target_is_compiled() {
        let dir = tempfile::tempdir().unwrap();
        let cache = KernelCache::at(Some(dir.path().to_path_buf()));
        let calls = Cell::new(0);
        let (a, hit) = cache.get_or_compile(&inputs("sm_90"), || fake("a", &calls)).unwrap();
        assert!(!hit);
        let (b, hit) = cache.get_or_compile(&inputs("sm_90"), || fake("other", &calls)).unwrap();
        assert!(hit, "the second run must read the kept CUBIN");
        assert_eq!((a.clone(), calls.get()), (b, 1));
        let (c, hit) = cache.get_or_compile(&inputs("sm_89"), || fake("c", &calls)).unwrap();
        assert!(!hit && calls.get() == 2 && c != a, "another architecture is another key");
        let other_version = KeyInputs { nvrtc_version: (13, 1), ..inputs("sm_90") };
        assert_ne!(other_version.key(), inputs("sm_90").key(), "NVRTC's version is part of the key");
        let other_options = ["-DX".to_string()];
        assert_ne!(KeyInputs { options: &other_options, ..inputs("sm_90") }.key(), inputs("sm_90").key());
        assert_ne!(KeyInputs { family: Family::AdamW, ..inputs("sm_90") }.key(), inputs("sm_90").key());
    }

    #[test]
    fn a_damaged_or_truncated_entry_is_compiled_again_and_rewritten() {
        let dir = tempfile::tempdir().unwrap();
        let cache = KernelCache::at(Some(dir.path().to_path_buf()));
        let calls = Cell::new(0);
        let (good, _) = cache.get_or_compile(&inputs("sm_90"), || fake("good", &calls)).unwrap();
        let path = KernelCache::entry_path(dir.path(), &inputs("sm_90"), &inputs("sm_90").key());
        let bytes = std::fs::read(&path).unwrap();
        for damaged in [bytes[..bytes.len() - 10].to_vec(), {
            let mut b = bytes.clone();
            let n = b.len();
            b[n - 1] ^= 1;
            b
        }] {
            std::fs::write(&path, damaged).unwrap();
            let before = calls.get();
            let (again, hit) = cache.get_or_compile(&inputs("sm_90"), || fake("good", &calls)).unwrap();
            assert!(!hit && calls.get() == before + 1 && again == good);
            assert_eq!(std::fs::read(&path).unwrap(), bytes, "the entry is rewritten whole");
        }
    }

    #[test]
    fn off_or_unwritable_caches_compile_every_time_and_failures_are_not_kept() {
        let calls = Cell::new(0);
        let off = KernelCache::at(None);
        for _ in 0..2 {
            assert!(!off.get_or_compile(&inputs("sm_90"), || fake("x", &calls)).unwrap().1);
        }
        assert_eq!(calls.get(), 2);
        let file = tempfile::NamedTempFile::new().unwrap();
        let blocked = KernelCache::at(Some(file.path().join("kernels")));
        let (c, hit) = blocked.get_or_compile(&inputs("sm_90"), || fake("y", &calls)).unwrap();
        assert!(!hit && c.starts_with(b"\x7fELF"), "a cache that cannot be written still gives the CUBIN");
        let dir = tempfile::tempdir().unwrap();
        let cache = KernelCache::at(Some(dir.path().to_path_buf()));
        let err = cache.get_or_compile(&inputs("sm_90"), || Err(CudaError::Compile { file: "probe.cu", log: "x".into() }));
        assert!(err.is_err());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "nothing is kept of a failed compilation");
    }

    #[test]
    fn only_the_newest_entries_of_a_family_and_architecture_are_kept() {
        let dir = tempfile::tempdir().unwrap();
        let cache = KernelCache::at(Some(dir.path().to_path_buf()));
        let calls = Cell::new(0);
        let versions: Vec<KeyInputs> = (0..KEEP as i32 + 3).map(|v| KeyInputs { nvrtc_version: (13, v), ..inputs("sm_90") }).collect();
        for v in &versions {
            cache.get_or_compile(v, || fake("v", &calls)).unwrap();
            // Distinct modification times, oldest first.
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        cache.get_or_compile(&inputs("sm_89"), || fake("w", &calls)).unwrap();
        let names: Vec<String> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        assert_eq!(names.iter().filter(|n| n.starts_with("Probe-sm_90-")).count(), KEEP);
        assert_eq!(names.iter().filter(|n| n.starts_with("Probe-sm_89-")).count(), 1);
        let newest = KernelCache::entry_path(dir.path(), versions.last().unwrap(), &versions.last().unwrap().key());
        assert!(newest.is_file());
        let oldest = KernelCache::entry_path(dir.path(), &versions[0], &versions[0].key());
        assert!(!oldest.is_file());
    }
}
