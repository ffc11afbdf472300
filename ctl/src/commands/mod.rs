//! One module per subcommand; [`dispatch`] picks it.

mod apply;
mod events;
mod gpus;
mod logs;
mod partition;
mod status;
mod workers;

use crate::cli::{Cli, Command};
use crate::{CtlError, Exit};
use gpu_agent_proto::v1 as pb;
use prost::Message;
use std::io::Write;

pub async fn dispatch(cli: Cli, out: &mut dyn Write, err: &mut dyn Write) -> Result<Exit, CtlError> {
    let json = cli.global.output == crate::cli::Output::Json;
    match cli.command {
        Command::Status => status::run(&cli.global, json, out).await,
        Command::Gpus => gpus::gpus(&cli.global, json, out).await,
        Command::Profiles { gpu } => gpus::profiles(&cli.global, &gpu, json, out).await,
        Command::Apply(args) => apply::apply(&cli.global, &args.file, args.dry_run, args.drain, json, out, err).await,
        Command::Partition(cmd) => partition::run(&cli.global, cmd, json, out, err).await,
        Command::Diff(args) => apply::diff(&cli.global, &args.file, json, out).await,
        Command::Workers => workers::run(&cli.global, json, out).await,
        Command::Events => events::run(&cli.global, json, out).await,
        Command::Logs { model, replica, follow, tail } => {
            logs::logs(&cli.global, &model, replica, follow, tail, out).await
        }
        Command::Drain { gpu } => partition::drain(&cli.global, &gpu, false, json, out, err).await,
        Command::Undrain { gpu } => partition::drain(&cli.global, &gpu, true, json, out, err).await,
        Command::Restart { model } => logs::action(&cli.global, &model, "restart", json, out).await,
        Command::Stop { model } => logs::action(&cli.global, &model, "stop", json, out).await,
    }
}

/// Maps an RPC failure to gpuctl's exit codes, unpacking a rejected plan's problems.
pub fn rpc_error(status: tonic::Status) -> CtlError {
    match status.code() {
        tonic::Code::InvalidArgument => {
            let problems: Vec<crate::views::Problem> = pb::PlanProblems::decode(status.details())
                .map(|d| {
                    d.problems
                        .into_iter()
                        .map(|p| crate::views::Problem {
                            path: p.path,
                            line: p.line,
                            column: p.column,
                            message: p.message,
                        })
                        .collect()
                })
                .unwrap_or_default();
            let message = if problems.is_empty() {
                status.message().to_string()
            } else {
                "invalid plan; nothing was changed".to_string()
            };
            CtlError { exit: Exit::Usage, message, problems }
        }
        tonic::Code::NotFound => CtlError::usage(status.message()),
        tonic::Code::FailedPrecondition => CtlError::failed(status.message()),
        _ => CtlError::failed(format!("agent: {}", status.message())),
    }
}

pub fn io_error(e: std::io::Error) -> CtlError {
    CtlError::failed(format!("writing output: {e}"))
}
