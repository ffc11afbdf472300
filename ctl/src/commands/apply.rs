use super::{io_error, rpc_error};
use crate::cli::Global;
use crate::output::json as print_json;
use crate::views;
use crate::{CtlError, Exit, client};
use gpu_agent_proto::v1 as pb;
use pb::apply_event::Event;
use std::io::{Read, Write};
use std::path::Path;

fn read_plan(file: &Path) -> Result<(String, String), CtlError> {
    if file == Path::new("-") {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .map_err(|e| CtlError::usage(format!("reading the plan from standard input: {e}")))?;
        return Ok((text, "<stdin>".to_string()));
    }
    let text = std::fs::read_to_string(file).map_err(|e| CtlError::usage(format!("plan {}: {e}", file.display())))?;
    let source = std::fs::canonicalize(file).unwrap_or_else(|_| file.to_path_buf());
    Ok((text, source.display().to_string()))
}

/// One line per step, as `diff` and `apply` print them.
pub fn describe(s: &pb::Step) -> String {
    let who = match s.replica {
        Some(r) => format!("{}/{r}", s.model),
        None => s.model.clone(),
    };
    let mut line = match s.action.as_str() {
        "start_worker" => {
            let at = if s.profile.is_empty() {
                format!("GPU {}", s.gpu)
            } else {
                format!("GPU {} {}@{}", s.gpu, s.profile, s.start.unwrap_or(0))
            };
            let device = if s.device.is_empty() { "new instance" } else { &s.device };
            format!("start_worker {who} on {at} ({device}) as {}", s.isolation)
        }
        "stop_worker" => {
            format!("stop_worker {who} on GPU {}{}", s.gpu, s.pid.map(|p| format!(" (pid {p})")).unwrap_or_default())
        }
        "create_gpu_instance" | "destroy_gpu_instance" => {
            format!("{} {}@{} on GPU {}", s.action, s.profile, s.start.unwrap_or(0), s.gpu)
        }
        "start_mps" | "stop_mps" => {
            let device = if s.device.is_empty() { String::new() } else { format!(" ({})", s.device) };
            format!("{} {} on GPU {}{device}", s.action, s.mps_daemon, s.gpu)
        }
        other => format!("{other} on GPU {}", s.gpu),
    };
    if !s.reason.is_empty() {
        line += &format!("  [{}]", s.reason);
    }
    line
}

fn sign(action: &str) -> char {
    if action.starts_with("stop") || action.starts_with("destroy") || action.starts_with("disable") { '-' } else { '+' }
}

pub async fn diff(global: &Global, file: &Path, as_json: bool, out: &mut dyn Write) -> Result<Exit, CtlError> {
    let (text, source) = read_plan(file)?;
    let mut c = client::connect(global).await?;
    let reply = c
        .diff(pb::PlanRequest { plan_toml: text, source, dry_run: true, drain: false })
        .await
        .map_err(rpc_error)?
        .into_inner();
    if as_json {
        print_json(out, &views::Steps { steps: reply.steps.iter().map(views::Step::from).collect() })
            .map_err(io_error)?;
    } else if reply.steps.is_empty() {
        writeln!(out, "no changes: the host matches the plan").map_err(io_error)?;
    } else {
        for s in &reply.steps {
            writeln!(out, "{} {}", sign(&s.action), describe(s)).map_err(io_error)?;
        }
    }
    Ok(if reply.steps.is_empty() { Exit::Ok } else { Exit::Failed })
}

pub async fn apply(
    global: &Global,
    file: &Path,
    dry_run: bool,
    drain: bool,
    as_json: bool,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<Exit, CtlError> {
    let (text, source) = read_plan(file)?;
    let mut c = client::connect(global).await?;
    let stream =
        c.apply(pb::PlanRequest { plan_toml: text, source, dry_run, drain }).await.map_err(rpc_error)?.into_inner();
    follow(stream, dry_run, as_json, out, err).await
}

/// Prints an apply's progress as it streams (or, with JSON, everything at the end) and turns
/// its outcome into gpuctl's exit code.
pub async fn follow(
    mut stream: tonic::Streaming<pb::ApplyEvent>,
    dry_run: bool,
    as_json: bool,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<Exit, CtlError> {
    let mut steps = Vec::new();
    let mut results = Vec::new();
    let mut rollback = Vec::new();
    let mut done: Option<pb::ApplyDone> = None;
    while let Some(event) = stream.message().await.map_err(rpc_error)? {
        match event.event {
            Some(Event::Plan(plan)) => {
                if !as_json {
                    let what = if dry_run { "would take" } else { "takes" };
                    writeln!(out, "plan {what} {} step(s)", plan.steps.len()).map_err(io_error)?;
                    if dry_run {
                        for (i, s) in plan.steps.iter().enumerate() {
                            writeln!(out, "{:>3}. {}", i + 1, describe(s)).map_err(io_error)?;
                        }
                    }
                }
                steps = plan.steps;
            }
            Some(Event::Started(_)) => {}
            Some(Event::Finished(f)) => {
                let step = f.step.clone().unwrap_or_default();
                if !as_json {
                    let verdict = if f.ok { "ok".to_string() } else { format!("FAILED: {}", f.error) };
                    writeln!(
                        out,
                        "[{}/{}] {} ... {verdict} ({} ms)",
                        f.index + 1,
                        steps.len(),
                        describe(&step),
                        f.millis
                    )
                    .map_err(io_error)?;
                }
                results.push(views::StepResult {
                    index: f.index,
                    action: step.action,
                    ok: f.ok,
                    error: (!f.ok).then_some(f.error),
                    millis: f.millis,
                });
            }
            Some(Event::RolledBack(r)) => {
                if !as_json {
                    let verdict = if r.ok { "ok".to_string() } else { format!("FAILED: {}", r.error) };
                    writeln!(out, "rollback: {} ... {verdict}", r.action).map_err(io_error)?;
                }
                rollback.push(views::RollbackAction { action: r.action, ok: r.ok, error: (!r.ok).then_some(r.error) });
            }
            Some(Event::Done(d)) => done = Some(d),
            None => {}
        }
    }
    let done = done.ok_or_else(|| {
        CtlError::failed(
            "the agent closed the apply stream before it finished; see `gpuctl status` and `gpuctl events`",
        )
    })?;
    if as_json {
        let applied = views::Applied {
            steps: steps.iter().map(views::Step::from).collect(),
            results,
            rollback,
            ok: done.ok,
            dry_run,
            rolled_back: done.rolled_back,
            message: done.message.clone(),
        };
        print_json(out, &applied).map_err(io_error)?;
    } else if done.ok {
        writeln!(out, "{}", done.message).map_err(io_error)?;
    } else {
        writeln!(err, "gpuctl: {}; see `gpuctl workers` and `gpuctl events`", done.message).map_err(io_error)?;
    }
    Ok(if done.ok { Exit::Ok } else { Exit::Failed })
}
