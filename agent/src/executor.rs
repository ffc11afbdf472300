//! The thin effectful layer under reconciliation: carries out steps in order and reports each.
//! A failed worker step does not stop the rest: every worker the plan can run is started, and the
//! failure is reported (the worker's record says why), so the host ends in a known state.

use crate::reconcile::Step;
use crate::workers::Supervisor;
use std::sync::Arc;
use std::time::Instant;

/// Progress of one apply, as the RPC layer streams it.
#[derive(Debug, Clone)]
pub enum Progress {
    Started { index: usize, step: Step },
    Finished { index: usize, step: Step, result: Result<(), String>, millis: u64 },
}

#[derive(Debug, Clone, Default)]
pub struct Outcome {
    pub steps: usize,
    pub failed: usize,
}

pub async fn execute(
    steps: &[Step],
    supervisor: &Arc<Supervisor>,
    read_only_gpus: bool,
    mut progress: impl FnMut(Progress),
) -> Outcome {
    let mut outcome = Outcome { steps: steps.len(), failed: 0 };
    for (index, step) in steps.iter().enumerate() {
        progress(Progress::Started { index, step: step.clone() });
        let began = Instant::now();
        let span = tracing::info_span!("step", index, action = step.action(), gpu = step.gpu());
        let _guard = span.enter();
        let result = if read_only_gpus && step.changes_gpu_settings() {
            Err(format!(
                "{} on GPU {} changes a GPU setting, and the agent runs with --read-only-gpus",
                step.action(),
                step.gpu()
            ))
        } else {
            run(step, supervisor).await
        };
        drop(_guard);
        if let Err(e) = &result {
            outcome.failed += 1;
            tracing::error!(action = step.action(), gpu = step.gpu(), error = %e, "step failed");
        }
        progress(Progress::Finished { index, step: step.clone(), result, millis: began.elapsed().as_millis() as u64 });
    }
    outcome
}

async fn run(step: &Step, supervisor: &Arc<Supervisor>) -> Result<(), String> {
    match step {
        Step::StartWorker { spec, .. } => supervisor.start((**spec).clone()).map(|_| ()).map_err(|e| e.to_string()),
        Step::StopWorker { key, .. } => supervisor.stop(key).await.map_err(|e| e.to_string()),
    }
}
