//! Restart policies: whether and when a worker that exited starts again. Pure: the supervisor
//! asks, then acts.

use std::time::Duration;

/// Backoff of a worker that keeps exiting: the first restart is immediate, then 1 s, 2 s, 4 s, ...
/// up to a minute, each with up to 10% jitter so crash-looping workers do not restart in lockstep.
/// A run of [`STABLE`] or longer resets it; [`GIVE_UP_AFTER`] quick exits in a row end it (the worker
/// is then `failed` until `gpuctl apply -f` or `gpuctl restart`).
pub const STABLE: Duration = Duration::from_secs(30);
pub const GIVE_UP_AFTER: u32 = 10;
/// The second restart's delay, doubling from there (the agent's `restart_backoff` setting).
pub const BASE: Duration = Duration::from_secs(1);
const MAX: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Leave it exited (policy `never`, or `on-failure` after a clean exit).
    Stay,
    /// Start it again after `delay`; `streak` quick exits in a row so far.
    Restart { delay: Duration, streak: u32 },
    /// Crash loop: stop trying.
    GiveUp { streak: u32 },
}

/// Decides for a worker with restart `policy` that exited (`success` or not) after running for
/// `ran_for`, having exited quickly `streak` times in a row before. `jitter` is in [0, 1).
pub fn decide(policy: &str, success: bool, ran_for: Duration, streak: u32, base: Duration, jitter: f64) -> Decision {
    let wanted = match policy {
        "always" => true,
        "on-failure" => !success,
        _ => false,
    };
    if !wanted {
        return Decision::Stay;
    }
    let streak = if ran_for >= STABLE { 1 } else { streak + 1 };
    if streak > GIVE_UP_AFTER {
        return Decision::GiveUp { streak };
    }
    let delay = if streak <= 1 { Duration::ZERO } else { (base * 2u32.saturating_pow(streak - 2)).min(MAX) };
    Decision::Restart { delay: delay.mul_f64(1.0 + 0.1 * jitter.clamp(0.0, 1.0)), streak }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policies_and_backoff() {
        let quick = Duration::from_millis(10);
        let s = |secs: u64| Duration::from_secs(secs);
        let cases = [
            // (policy, success, ran for, streak before, expected)
            ("never", false, quick, 0, Decision::Stay),
            ("on-failure", true, quick, 0, Decision::Stay),
            ("on-failure", false, quick, 0, Decision::Restart { delay: Duration::ZERO, streak: 1 }),
            ("always", true, quick, 0, Decision::Restart { delay: Duration::ZERO, streak: 1 }),
            ("always", false, quick, 1, Decision::Restart { delay: s(1), streak: 2 }),
            ("always", false, quick, 3, Decision::Restart { delay: s(4), streak: 4 }),
            ("always", false, quick, 9, Decision::Restart { delay: s(60), streak: 10 }),
            ("always", false, quick, 10, Decision::GiveUp { streak: 11 }),
            // A stable run resets the streak.
            ("always", false, s(31), 9, Decision::Restart { delay: Duration::ZERO, streak: 1 }),
        ];
        for (policy, success, ran, streak, want) in cases {
            assert_eq!(decide(policy, success, ran, streak, BASE, 0.0), want, "{policy} {success} {ran:?} {streak}");
        }
        // Jitter stretches the delay by at most 10%.
        let Decision::Restart { delay, .. } = decide("always", false, quick, 2, BASE, 0.99) else { panic!() };
        assert!(delay > s(2) && delay <= Duration::from_millis(2200), "{delay:?}");
    }
}
