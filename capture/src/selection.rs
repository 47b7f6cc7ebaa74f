//! Which sites `--dump-layers` selects: a regex searched in each site's name (`layers.3.fc2`), as
//! `grep` would, so `layers\.3\.` takes every site of layer 3 and `^layers\.3\.fc2$` one site. A
//! regex that selects no site is an error that shows what site names look like, never a run that
//! silently records no tensor.

use fp8scope_schemas::names::{Module, Site};
use regex::Regex;
use std::collections::BTreeSet;

/// The sites of a model of `n_layers` layers whose name `pattern` matches somewhere.
pub fn dumped_sites(pattern: &str, n_layers: u32) -> Result<BTreeSet<Site>, String> {
    let re = Regex::new(pattern).map_err(|e| format!("the regex does not compile: {}", e.to_string().lines().last().unwrap_or("")))?;
    let all = || (0..n_layers).flat_map(|l| Module::ALL.map(|m| Site::new(l, m)));
    let picked: BTreeSet<Site> = all().filter(|s| re.is_match(&s.to_string())).collect();
    if picked.is_empty() {
        let examples: Vec<String> = all().take(4).map(|s| s.to_string()).collect();
        return Err(format!(
            "'{pattern}' selects no site of this model; site names look like {} … layers.{}.fc2",
            examples.join(", "),
            n_layers.saturating_sub(1)
        ));
    }
    Ok(picked)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pattern_matches_anywhere_in_the_name() {
        let layer3 = dumped_sites(r"layers\.3\.", 4).unwrap();
        assert_eq!(layer3.len(), 4);
        assert!(layer3.iter().all(|s| s.layer == 3));
        assert_eq!(dumped_sites(r"^layers\.1\.fc2$", 4).unwrap().len(), 1);
        assert_eq!(dumped_sites("fc", 2).unwrap().len(), 4);
        assert_eq!(dumped_sites(".*", 2).unwrap().len(), 8);
    }

    #[test]
    fn a_pattern_that_selects_nothing_says_what_names_look_like() {
        let e = dumped_sites(r"blocks\.3", 4).unwrap_err();
        assert!(e.contains("selects no site") && e.contains("layers.0.qkv"), "{e}");
        let e = dumped_sites(r"layers\.7\.", 4).unwrap_err();
        assert!(e.contains("layers.3.fc2"), "{e}");
        assert!(dumped_sites("(", 4).unwrap_err().contains("does not compile"));
    }
}
