//! What README.md promises a newcomer, checked cheaply on every test run (bench/fresh_clone.sh
//! checks the rest, the times and the demo's output, on a clean clone):
//! - every path it names exists (and every file of bench/ its benchmark pages cite);
//! - every `fp8-capture` / `fp8-analyze` command in it names a real subcommand, and each of its
//!   flags is in that subcommand's `--help`; every command of fp8-analyze has `--json`, and every
//!   command that takes flags shows an example;
//! - its test command is `bash .ci/run`, which builds and tests the whole workspace and installs
//!   the Python packages it names;
//! - `cargo run --release` and `bash .ci/run` build in one target directory (`.ci/target-dir.sh`),
//!   except under CI or with CARGO_TARGET_DIR set.

mod common;

use common::{bin, repo_root};
use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

fn read(rel: &str) -> String {
    std::fs::read_to_string(repo_root().join(rel)).unwrap_or_else(|e| panic!("reading {rel}: {e}"))
}

/// Fenced code blocks: (info string, body).
fn code_blocks(md: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut cur: Option<(String, String)> = None;
    for line in md.lines() {
        if let Some(info) = line.trim_start().strip_prefix("```") {
            match cur.take() {
                Some(b) => out.push(b),
                None => cur = Some((info.trim().to_string(), String::new())),
            }
        } else if let Some((_, body)) = cur.as_mut() {
            body.push_str(line);
            body.push('\n');
        }
    }
    out
}

/// The prose: everything outside fenced code blocks.
fn prose(md: &str) -> String {
    let mut out = String::new();
    let mut in_block = false;
    for line in md.lines() {
        if line.trim_start().starts_with("```") {
            in_block = !in_block;
        } else if !in_block {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// Inline code spans of the prose (a span may cross a line break).
fn inline_code(md: &str) -> Vec<String> {
    prose(md).split('`').skip(1).step_by(2).map(|s| s.split_whitespace().collect::<Vec<_>>().join(" ")).filter(|s| !s.is_empty()).collect()
}

/// Targets of Markdown links, without anchors; web links left out.
fn links(md: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = md;
    while let Some(i) = rest.find("](") {
        rest = &rest[i + 2..];
        let end = rest.find(')').unwrap_or(rest.len());
        let target = rest[..end].split('#').next().unwrap_or("").trim().to_string();
        if !target.is_empty() && !target.contains("://") && !target.starts_with("mailto:") {
            out.push(target);
        }
    }
    out
}

/// Words that look like paths inside the repository: file names with an extension or paths with
/// a `/`, not absolute, not under the home directory, not a variable.
fn path_words(text: &str) -> Vec<String> {
    const EXT: [&str; 8] = [".md", ".sh", ".rs", ".py", ".toml", ".txt", ".jsonl", ".log"];
    text.split(|c: char| c.is_whitespace() || "`();:\"'".contains(c))
        .map(|w| w.trim_end_matches(['.', ',']))
        .filter(|w| !w.is_empty() && w.chars().all(|c| c.is_ascii_alphanumeric() || "_.-/*{},".contains(c)))
        .filter(|w| {
            (w.contains('/') || EXT.iter().any(|e| w.ends_with(e))) && !w.starts_with('/') && !w.starts_with('-') && !w.starts_with('.')
                || w.starts_with(".ci/")
        })
        .map(String::from)
        .collect()
}

/// `a{1,2}b` → `a1b`, `a2b` (one brace group, as the benchmark pages write them).
fn expand_braces(w: &str) -> Vec<String> {
    match (w.find('{'), w.find('}')) {
        (Some(i), Some(j)) if i < j => w[i + 1..j].split(',').map(|alt| format!("{}{alt}{}", &w[..i], &w[j + 1..])).collect(),
        _ => vec![w.to_string()],
    }
}

/// Whether `rel` exists under the repository root; a `*` matches any run of characters within
/// the last path component.
fn exists(root: &Path, rel: &str) -> bool {
    let rel = rel.trim_end_matches('/');
    match rel.rsplit_once('/').map_or(("", rel), |(d, f)| (d, f)) {
        (dir, file) if file.contains('*') => {
            let (pre, post) = file.split_once('*').unwrap_or((file, ""));
            std::fs::read_dir(root.join(dir))
                .map(|rd| rd.flatten().any(|e| e.file_name().to_str().is_some_and(|n| n.starts_with(pre) && n.ends_with(post.trim_end_matches('*')))))
                .unwrap_or(false)
        }
        _ => root.join(rel).exists(),
    }
}

#[test]
fn every_path_the_readme_names_exists() {
    let root = repo_root();
    let readme = read("README.md");
    let mut named: BTreeSet<(String, String)> = BTreeSet::new();
    for l in links(&readme) {
        named.insert(("README.md link".into(), l));
    }
    for span in inline_code(&readme) {
        for w in path_words(&span) {
            named.insert(("README.md".into(), w));
        }
    }
    // The layout block: the first word of each entry.
    let layout = readme.split("## Layout").nth(1).expect("README.md has a Layout section");
    let block = &code_blocks(layout).first().expect("a code block in Layout").1.clone();
    for line in block.lines().filter(|l| !l.starts_with(' ') && !l.trim().is_empty()) {
        named.insert(("README.md layout".into(), line.split_whitespace().next().unwrap_or("").to_string()));
    }
    // Scripts the README's commands run.
    for (_, body) in code_blocks(&readme) {
        for w in shell_commands(&body).into_iter().flatten().filter(|w| w.starts_with("bench/") || w.starts_with(".ci/")) {
            named.insert(("README.md command".into(), w));
        }
    }
    // The benchmark pages: every file of the repository they cite from its root.
    for page in ["bench/README.md", "bench/BENCHMARKS.md"] {
        for w in path_words(&read(page)) {
            if ["bench/", "capture/", "analyze/", "schemas/", "tests/", "kernels/", "src/", ".ci/"].iter().any(|d| w.starts_with(d)) {
                named.insert((page.into(), w));
            }
        }
        for l in links(&read(page)) {
            named.insert((format!("{page} link"), format!("bench/{l}")));
        }
    }
    let produced = ["target/", "runs/", "report/", "gpu-bundle/"];
    let mut missing = Vec::new();
    let mut checked = 0;
    for (from, w) in &named {
        if produced.iter().any(|p| w.starts_with(p)) {
            continue;
        }
        for p in expand_braces(w) {
            checked += 1;
            if !exists(&root, &p) {
                missing.push(format!("{from}: {p}"));
            }
        }
    }
    println!("{checked} paths checked");
    assert!(checked > 20, "too few paths found ({checked}): is the parsing broken?");
    assert!(missing.is_empty(), "paths named but missing:\n  {}", missing.join("\n  "));
}

/// Splits a shell command line into words (double and single quotes kept together, unquoted).
fn shell_words(line: &str) -> Vec<String> {
    let (mut out, mut cur, mut quote, mut any) = (Vec::new(), String::new(), None::<char>, false);
    for c in line.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => cur.push(c),
            (None, '"' | '\'') => {
                quote = Some(c);
                any = true;
            }
            (None, c) if c.is_whitespace() => {
                if any || !cur.is_empty() {
                    out.push(std::mem::take(&mut cur));
                }
                any = false;
            }
            (None, c) => cur.push(c),
        }
    }
    if any || !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// The command lines of a shell block: continuations joined, comments dropped.
fn shell_commands(body: &str) -> Vec<Vec<String>> {
    let joined = body.replace("\\\n", " ");
    joined
        .lines()
        .map(|l| {
            // A comment starts at a `#` that follows a blank and is outside quotes.
            let mut q = None;
            let mut cut = l.len();
            let mut prev = ' ';
            for (i, c) in l.char_indices() {
                match (q, c) {
                    (Some(x), c) if c == x => q = None,
                    (None, '"' | '\'') => q = Some(c),
                    (None, '#') if prev.is_whitespace() => {
                        cut = i;
                        break;
                    }
                    _ => {}
                }
                prev = c;
            }
            shell_words(&l[..cut])
        })
        .filter(|w| !w.is_empty())
        .collect()
}

fn help(tool: &str, sub: &str) -> String {
    let mut cmd = Command::new(bin(tool));
    cmd.args(sub.split_whitespace());
    let o = cmd.arg("--help").output().unwrap_or_else(|e| panic!("spawn {tool}: {e}"));
    assert!(o.status.success(), "`{tool} {sub} --help` failed: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Whether `help` lists `flag` as a whole word (`--dump-every` does not match `--dump-every-x`).
fn has_flag(help: &str, flag: &str) -> bool {
    help.match_indices(flag).any(|(i, _)| !help[i + flag.len()..].starts_with(|c: char| c.is_ascii_alphanumeric() || c == '-'))
}

/// The subcommands `tool --help` lists under "Commands:" (without `help`).
fn subcommands(tool: &str) -> Vec<String> {
    commands_in(&help(tool, ""), tool)
}

/// The commands a `--help` text lists under "Commands:".
fn commands_in(h: &str, tool: &str) -> Vec<String> {
    let section = h.split("Commands:").nth(1).unwrap_or_else(|| panic!("`{tool} --help` lists no commands"));
    section
        .lines()
        .skip(1)
        .take_while(|l| l.starts_with("  ") || l.trim().is_empty())
        .filter(|l| l.starts_with("  ") && !l.starts_with("   "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| *n != "help")
        .map(String::from)
        .collect()
}

#[test]
fn every_command_and_flag_in_the_readme_is_accepted() {
    let readme = read("README.md");
    // (tool, subcommand, flags, where)
    let mut uses: Vec<(String, String, Vec<String>, String)> = Vec::new();
    let flags_of = |words: &[String]| -> Vec<String> {
        words.iter().filter(|w| w.starts_with("--") && w.len() > 2).map(|w| w.split('=').next().unwrap_or(w).to_string()).collect()
    };
    let mut demo_flags = Vec::new();
    let mut commands: Vec<(Vec<String>, String)> = Vec::new();
    let mut spans = inline_code(&readme);
    for (info, body) in code_blocks(&readme) {
        if info == "bash" {
            commands.extend(shell_commands(&body).into_iter().map(|w| (w, "code block".to_string())));
            // Commands quoted in the block's comments.
            spans.extend(body.split('`').skip(1).step_by(2).map(|s| s.split_whitespace().collect::<Vec<_>>().join(" ")));
        }
    }
    for span in &spans {
        commands.push((shell_words(span), format!("`{span}`")));
    }
    for (words, at) in &commands {
        let prog = words[0].rsplit('/').next().unwrap_or("");
        if (prog == "fp8-capture" || prog == "fp8-analyze") && words.len() > 1 {
            uses.push((prog.to_string(), words[1].clone(), flags_of(&words[2..]), format!("{} ({at})", words.join(" "))));
        } else if words.len() > 3 && words[..3] == ["cargo", "run", "--release"] {
            // Flags given to the demo go to triage (--inject, --scenario) or to every capture.
            if let Some(i) = words.iter().position(|w| w == "--") {
                demo_flags.extend(flags_of(&words[i + 1..]).into_iter().map(|f| (f, words.join(" "))));
            }
        }
    }
    assert!(uses.len() >= 10, "too few fp8-capture / fp8-analyze commands found ({}): is the parsing broken?", uses.len());
    let mut bad = Vec::new();
    for tool in ["fp8-capture", "fp8-analyze"] {
        let subs = subcommands(tool);
        for (_, sub, flags, at) in uses.iter().filter(|u| u.0 == tool) {
            if !subs.contains(sub) {
                bad.push(format!("{at}: `{tool}` has no command `{sub}` (it has {subs:?})"));
                continue;
            }
            let mut h = help(tool, sub);
            // A command with commands of its own (`import te-debug`): the flags are the inner one's.
            let words: Vec<&str> = at.split_whitespace().collect();
            if h.contains("Commands:")
                && let Some(inner) = words.iter().position(|w| w == sub).and_then(|i| words.get(i + 1))
                && commands_in(&h, tool).iter().any(|c| c == inner)
            {
                h = help(tool, &format!("{sub} {inner}"));
            }
            bad.extend(flags.iter().filter(|f| !has_flag(&h, f)).map(|f| format!("{at}: `{tool} {sub} --help` has no {f}")));
        }
    }
    let demo_help = help("fp8-analyze", "triage") + &help("fp8-capture", "train");
    bad.extend(demo_flags.iter().filter(|(f, _)| !has_flag(&demo_help, f)).map(|(f, at)| format!("`{at}`: neither triage nor train takes {f}")));
    // Flags the prose names on their own (`--shadow`, `--scenario drift|nan|spike`): some command
    // takes each, with each value named.
    let all_help: String = ["fp8-capture", "fp8-analyze"].iter().flat_map(|t| subcommands(t).into_iter().map(move |s| help(t, &s))).collect();
    for span in inline_code(&readme).iter().filter(|s| s.starts_with("--") && s.len() > 2) {
        let mut words = span.split_whitespace();
        let flag = words.next().unwrap_or("");
        if !has_flag(&all_help, flag) {
            bad.push(format!("`{span}`: no command takes {flag}"));
        }
        for value in words.next().map(|v| v.split('|').collect::<Vec<_>>()).unwrap_or_default() {
            if !all_help.contains(value) {
                bad.push(format!("`{span}`: no --help names the value {value}"));
            }
        }
    }
    // "Every command of `fp8-analyze` has `--json`."
    if readme.split_whitespace().collect::<Vec<_>>().join(" ").contains("Every command of `fp8-analyze` has `--json`") {
        for sub in subcommands("fp8-analyze") {
            if !has_flag(&help("fp8-analyze", &sub), "--json") {
                bad.push(format!("the README says every command of fp8-analyze has --json; `{sub}` has not"));
            }
        }
    }
    // "Every flag is documented in `--help`, with examples": each command that takes a flag shows one.
    for tool in ["fp8-capture", "fp8-analyze"] {
        for sub in subcommands(tool) {
            let h = help(tool, &sub);
            let takes_flags = h.match_indices("--").any(|(i, _)| !h[i..].starts_with("--help") && h[i + 2..].starts_with(|c: char| c.is_ascii_lowercase()));
            if takes_flags && !h.contains("Example") {
                bad.push(format!("`{tool} {sub} --help` shows no example"));
            }
        }
    }
    println!("{} commands checked, {} demo flags", uses.len(), demo_flags.len());
    assert!(bad.is_empty(), "the README uses what the tools do not accept:\n  {}", bad.join("\n  "));
}

#[test]
fn the_readme_test_command_is_what_ci_runs() {
    let readme = read("README.md");
    let ci = read(".ci/run");
    let two = readme.split("## Two commands").nth(1).expect("README.md has a Two commands section");
    let block = code_blocks(two).into_iter().next().expect("a code block in Two commands").1;
    let cmds: Vec<String> = shell_commands(&block).iter().map(|w| w.join(" ")).collect();
    assert_eq!(cmds, ["cargo run --release", "bash .ci/run"], "the README's two commands");
    for line in ["cargo build --release --workspace --locked", "cargo test --release --workspace --locked"] {
        assert!(ci.lines().any(|l| l.trim_start().starts_with(line)), ".ci/run does not run `{line}`");
    }
    // The packages the README says the test command installs are the ones it installs.
    assert!(ci.contains("pip install -q -r tests/requirements.txt"), ".ci/run does not install tests/requirements.txt");
    assert!(ci.contains("apt-get") && ci.contains("chromium"), ".ci/run does not install Chromium");
    let req = read("tests/requirements.txt");
    for (said, pkg) in [
        ("pyarrow", "pyarrow"),
        ("numpy", "numpy"),
        ("ml_dtypes", "ml_dtypes"),
        ("NVRTC", "nvidia-cuda-nvrtc"),
        ("nvdisasm", "nvidia-cuda-nvdisasm"),
        ("Chromium", ""),
    ] {
        assert!(block.contains(said), "the README no longer says the tests install {said}; update this test");
        assert!(pkg.is_empty() || req.lines().any(|l| l.starts_with(pkg)), "tests/requirements.txt lacks {pkg}");
    }
    // "Rust (1.85+)": the workspace's rust-version.
    let cargo = read("Cargo.toml");
    let v = cargo.lines().find_map(|l| l.strip_prefix("rust-version = ")).expect("rust-version in Cargo.toml").trim_matches('"');
    assert!(readme.contains(&format!("Rust ({v}+)")), "the README does not say Rust ({v}+), the workspace's rust-version");
}

/// `source .ci/target-dir.sh` with `env` set and CI / CARGO_TARGET_DIR otherwise unset:
/// (CARGO_TARGET_DIR as exported, or "unset"; TARGET_DIR).
fn target_dir_rule(env: &[(&str, &str)]) -> (String, String) {
    let mut cmd = Command::new("bash");
    cmd.current_dir(repo_root())
        .args(["-c", "source .ci/target-dir.sh && printf '%s\\n%s\\n' \"${CARGO_TARGET_DIR-unset}\" \"$TARGET_DIR\""])
        .env_remove("CI")
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("CARGO_BUILD_TARGET_DIR");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let o = cmd.output().expect("bash");
    assert!(o.status.success(), "sourcing .ci/target-dir.sh failed: {}", String::from_utf8_lossy(&o.stderr));
    let s = String::from_utf8_lossy(&o.stdout).into_owned();
    let mut l = s.lines().map(String::from);
    (l.next().unwrap_or_default(), l.next().unwrap_or_default())
}

#[test]
fn cargo_run_and_ci_run_share_one_target_dir() {
    // What `cargo run --release` uses in this checkout, as cargo says.
    let o = Command::new(option_env!("CARGO").unwrap_or("cargo"))
        .current_dir(repo_root())
        .args(["metadata", "--no-deps", "--format-version", "1"])
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("CARGO_BUILD_TARGET_DIR")
        .output()
        .expect("cargo metadata");
    let meta: serde_json::Value = serde_json::from_slice(&o.stdout).expect("cargo metadata JSON");
    let cargo_default = meta["target_directory"].as_str().expect("target_directory").to_string();

    // A newcomer: nothing exported, so .ci/run's cargo builds where `cargo run` does.
    assert_eq!(target_dir_rule(&[]), ("unset".to_string(), cargo_default.clone()));
    assert_eq!(target_dir_rule(&[("CI", "false")]), ("unset".to_string(), cargo_default));
    // CI keeps its build between fresh clones.
    let home = std::env::var("HOME").expect("HOME");
    let ci_dir = format!("{home}/.cache/fp8scope-target");
    assert_eq!(target_dir_rule(&[("CI", "true")]), (ci_dir.clone(), ci_dir));
    // CARGO_TARGET_DIR wins, under CI too.
    assert_eq!(target_dir_rule(&[("CI", "true"), ("CARGO_TARGET_DIR", "/tmp/elsewhere")]), ("/tmp/elsewhere".to_string(), "/tmp/elsewhere".to_string()));
    assert_eq!(target_dir_rule(&[("CARGO_TARGET_DIR", "/tmp/elsewhere")]).0, "/tmp/elsewhere");

    // The scripts that build take the rule from that one file and set no target directory of their own.
    for script in [".ci/run", "bench/stage.sh"] {
        let s = read(script);
        assert!(s.lines().any(|l| l.trim() == "source .ci/target-dir.sh"), "{script} does not source .ci/target-dir.sh");
        assert!(!s.lines().any(|l| !l.trim_start().starts_with('#') && l.contains("CARGO_TARGET_DIR=")), "{script} sets CARGO_TARGET_DIR itself");
    }
}
