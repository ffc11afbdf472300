//! gpuctl: the command-line client of gpu-agent. `main.rs` only calls [`run`], so tests drive the
//! very same code in-process against a real agent on a real socket.

pub mod cli;
pub mod client;
pub mod commands;
pub mod output;
pub mod views;

use std::ffi::OsString;
use std::io::Write;

/// Exit codes of the contract: 0 done, 1 failed (or, for `diff`, changes pending), 2 bad usage or
/// invalid input, 3 `diff` could not answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    Ok = 0,
    Failed = 1,
    Usage = 2,
    DiffError = 3,
}

/// An error on the way to an answer, with the exit code it maps to.
#[derive(Debug)]
pub struct CtlError {
    pub exit: Exit,
    pub message: String,
    /// Structured problems of a rejected plan, for `-o json`.
    pub problems: Vec<views::Problem>,
}

impl CtlError {
    pub fn failed(message: impl Into<String>) -> Self {
        CtlError { exit: Exit::Failed, message: message.into(), problems: Vec::new() }
    }

    pub fn usage(message: impl Into<String>) -> Self {
        CtlError { exit: Exit::Usage, message: message.into(), problems: Vec::new() }
    }
}

/// Runs gpuctl with `args` (the first is the program name), writing to `out` and `err`.
pub fn run(
    args: impl IntoIterator<Item = impl Into<OsString> + Clone>,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> i32 {
    use clap::Parser;
    let cli = match cli::Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            let code = if e.use_stderr() { Exit::Usage as i32 } else { Exit::Ok as i32 };
            let text = e.render().to_string();
            if e.use_stderr() {
                let _ = write!(err, "{text}");
            } else {
                let _ = write!(out, "{text}");
            }
            return code;
        }
    };
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("tokio runtime");
    let json = cli.global.output == cli::Output::Json;
    let is_diff = matches!(cli.command, cli::Command::Diff(_));
    match runtime.block_on(commands::dispatch(cli, out, err)) {
        Ok(exit) => exit as i32,
        Err(e) => {
            if json && !e.problems.is_empty() {
                let doc = serde_json::json!({ "error": e.message, "problems": e.problems });
                let _ = writeln!(out, "{}", serde_json::to_string_pretty(&doc).expect("json"));
            }
            let _ = writeln!(err, "gpuctl: {}", e.message);
            for p in &e.problems {
                let _ = writeln!(err, "  {p}");
            }
            // `diff` keeps 1 for "changes pending", so its errors are above 1.
            if is_diff && e.exit == Exit::Failed { Exit::DiffError as i32 } else { e.exit as i32 }
        }
    }
}
