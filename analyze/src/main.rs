//! The `fp8-analyze` binary: parses the command line, calls [`fp8_analyze::run`], prints its
//! output, and turns any error into one line on stderr. Exit status: 0 success, 1 findings
//! (for the commands whose help says so), 2 bad input.

use clap::Parser;
use clap::error::ErrorKind;
use std::io::Write;
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = match fp8_analyze::Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) => {
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("fp8-analyze: {}", one_line(&e.render().to_string()));
            return ExitCode::from(2);
        }
    };
    match fp8_analyze::run(cli) {
        Ok(outcome) => {
            let mut out = std::io::stdout().lock();
            // A closed pipe (`| head`) is not an error worth a message.
            let _ = out.write_all(outcome.stdout.as_bytes()).and_then(|_| out.flush());
            if outcome.findings { ExitCode::from(1) } else { ExitCode::SUCCESS }
        }
        Err(e) => {
            eprintln!("fp8-analyze: {}", one_line(&e.to_string()));
            ExitCode::from(2)
        }
    }
}

/// Folds a multi-line message (clap's usage hints, polars' error context) into one line.
fn one_line(msg: &str) -> String {
    let msg = msg.split("\n\nUsage:").next().unwrap_or(msg);
    let msg = msg.split("\n\nFor more information").next().unwrap_or(msg);
    let msg = msg.strip_prefix("error: ").unwrap_or(msg);
    msg.split_whitespace().collect::<Vec<_>>().join(" ")
}
