//! The CUBINs compiled at build time by `capture/build.rs` (when NVRTC was there), embedded in the
//! binary: a GPU run whose architecture is among them starts without compiling a kernel.
//!
//! Each CUBIN carries the fingerprint of the translation unit it was compiled from; one whose
//! fingerprint differs from the unit this binary would compile now is not used (a stale build
//! output), and NVRTC compiles that family at run time instead. `FP8SCOPE_PRECOMPILED=0` ignores
//! them all (`settings.rs`).

use super::kernel_units::{Family, unit_fingerprint};

include!(concat!(env!("OUT_DIR"), "/precompiled_table.rs"));

/// The embedded CUBIN of `family` for `arch`, if there is one compiled from the translation unit
/// this binary holds.
pub fn cubin(arch: &str, family: Family) -> Option<&'static [u8]> {
    CUBINS
        .iter()
        .find(|(a, f, _, _)| *a == arch && *f == family)
        .filter(|(_, f, fp, _)| *fp == unit_fingerprint(&f.translation_unit()))
        .map(|(_, _, _, bin)| *bin)
}

/// The architectures with embedded CUBINs, in build order.
pub fn archs() -> Vec<&'static str> {
    let mut out: Vec<&'static str> = Vec::new();
    for (a, _, _, _) in CUBINS {
        if !out.contains(a) {
            out.push(a);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_embedded_cubin_is_an_elf_image_of_the_unit_this_binary_holds() {
        for (arch, family, fingerprint, bin) in CUBINS {
            assert!(bin.starts_with(b"\x7fELF"), "{arch} {family:?}: not a CUBIN");
            assert_eq!(*fingerprint, unit_fingerprint(&family.translation_unit()), "{arch} {family:?}: compiled from another unit");
            assert_eq!(cubin(arch, *family), Some(*bin));
        }
        // Every architecture has every family, or none.
        for arch in archs() {
            assert_eq!(CUBINS.iter().filter(|(a, _, _, _)| *a == arch).count(), Family::ALL.len(), "{arch}");
        }
        assert_eq!(archs().is_empty(), NVRTC_VERSION.is_none());
    }
}
