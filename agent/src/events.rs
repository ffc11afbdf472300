//! What the agent did and saw: a bounded in-memory log served by `gpuctl events`, each entry
//! also written to the tracing log.

use serde::Serialize;
use std::collections::VecDeque;
use std::sync::Mutex;

const KEEP: usize = 2000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    Info,
    Warning,
    Error,
}

#[derive(Debug, Clone, Serialize)]
pub struct Event {
    pub at_unix_ms: i64,
    pub level: Level,
    pub kind: &'static str,
    pub message: String,
    pub model: Option<String>,
    pub gpu: Option<u32>,
}

#[derive(Default)]
pub struct Events {
    log: Mutex<VecDeque<Event>>,
}

pub fn now_unix_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

impl Events {
    pub fn emit(
        &self,
        level: Level,
        kind: &'static str,
        model: Option<&str>,
        gpu: Option<u32>,
        message: impl Into<String>,
    ) {
        let message = message.into();
        match level {
            Level::Info => tracing::info!(kind, model, gpu, "{message}"),
            Level::Warning => tracing::warn!(kind, model, gpu, "{message}"),
            Level::Error => tracing::error!(kind, model, gpu, "{message}"),
        }
        let event = Event { at_unix_ms: now_unix_ms(), level, kind, message, model: model.map(str::to_string), gpu };
        let mut log = self.log.lock().expect("events lock");
        if log.len() == KEEP {
            log.pop_front();
        }
        log.push_back(event);
    }

    pub fn list(&self) -> Vec<Event> {
        self.log.lock().expect("events lock").iter().cloned().collect()
    }
}
