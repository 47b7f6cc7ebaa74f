//! `fp8-capture`: parse the flags, run, and turn any error into one line and a non-zero exit.

use clap::Parser;
use fp8_capture::cli::Cli;

fn main() {
    fp8_capture::process_clock::mark_start();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand) {
                let _ = e.print();
                std::process::exit(0);
            }
            let text = e.render().to_string();
            // The first paragraph on one line: the message, and the arguments it lists under it
            // (those a missing-argument error names).
            let first: Vec<&str> = text.lines().take_while(|l| !l.trim().is_empty()).map(str::trim).collect();
            let first = if first.is_empty() { "invalid arguments".to_string() } else { first.join(" ") };
            eprintln!("fp8-capture: {} (see --help)", first.trim_start_matches("error: "));
            std::process::exit(2);
        }
    };
    match fp8_capture::run(cli) {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("fp8-capture: {}", one_line(&e));
            let usage = e.downcast_ref::<fp8_capture::UsageError>().is_some();
            std::process::exit(if usage { 2 } else { 1 });
        }
    }
}

/// The error chain on one line, outermost first.
fn one_line(e: &anyhow::Error) -> String {
    e.chain().map(|c| c.to_string()).collect::<Vec<_>>().join(": ").replace('\n', " ")
}
