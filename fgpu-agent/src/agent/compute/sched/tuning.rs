//! The compute model's constants that an experiment may override from the agent's
//! environment (docs/compute.md): every override is logged at start, a bad one is ignored
//! with a warning.

use super::{LIGHT_DUTY, QUEUE_NS, ROUND_NS};

/// The model's constants, overridable from the environment for experiments (the agent logs
/// every override at start): `FGPU_COMPUTE_LIGHT_DUTY` (0-1), `FGPU_COMPUTE_ROUND_MS`
/// (10-2000), `FGPU_COMPUTE_QUEUE_US` (100-50000), `FGPU_COMPUTE_OVERLAP` (0/1: open the
/// next turn while the previous holder drains), `FGPU_COMPUTE_QUEUE_SCALE` (0/1: scale the
/// queue bound by the container's active processes, `Tenant::queue_bound`),
/// `FGPU_COMPUTE_OPEN_QUEUE_US` (100-50000: the queue bound while a device runs open),
/// `FGPU_COMPUTE_WHOLE_QUANTA` (0/1: a holder whose quantum is over while the rival waiting
/// is still ahead of it gets a whole further quantum, as before 2026-12-04, instead of
/// running on only until it is level).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tuning {
    pub light_duty: f64,
    pub round_ns: i64,
    pub queue_ns: u64,
    pub overlap: bool,
    pub queue_scale: bool,
    /// Whether devices may run open when that serves every tenant better (`probe`).
    pub open: bool,
    /// Each process's queue bound while its device runs open (before the container's
    /// scale): how long a latency-bound neighbour's kernel waits behind it.
    pub open_queue_ns: u64,
    /// A holder past its quantum with a rival ahead of it renews a whole quantum.
    pub whole_quanta: bool,
}

impl Default for Tuning {
    fn default() -> Tuning {
        Tuning {
            light_duty: LIGHT_DUTY,
            round_ns: ROUND_NS,
            queue_ns: QUEUE_NS,
            overlap: false,
            queue_scale: true,
            open: true,
            open_queue_ns: QUEUE_NS,
            whole_quanta: false,
        }
    }
}

impl Tuning {
    /// The defaults with the agent's environment's overrides.
    pub fn from_env() -> Tuning {
        Tuning::from_lookup(|name| std::env::var(name).ok())
    }

    /// The defaults with the overrides `lookup` gives by variable name.
    fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Tuning {
        /// `name`'s value, if set, parsed and accepted by `ok`; logged either way.
        fn parse<T: std::str::FromStr>(
            lookup: &dyn Fn(&str) -> Option<String>,
            name: &str,
            ok: impl Fn(&T) -> bool,
        ) -> Option<T> {
            let v = lookup(name)?;
            match v.parse::<T>() {
                Ok(x) if ok(&x) => {
                    tracing::info!(name, value = %v, "compute controller: tuning override");
                    Some(x)
                }
                _ => {
                    tracing::warn!(name, value = %v, "compute controller: bad tuning override ignored");
                    None
                }
            }
        }
        let l: &dyn Fn(&str) -> Option<String> = &lookup;
        let d = Tuning::default();
        let flag = |name: &str, default: bool| {
            parse(l, name, |x: &u8| *x <= 1).map_or(default, |x| x == 1)
        };
        Tuning {
            light_duty: parse(l, "FGPU_COMPUTE_LIGHT_DUTY", |x: &f64| {
                (0.0..=1.0).contains(x)
            })
            .unwrap_or(d.light_duty),
            round_ns: parse(l, "FGPU_COMPUTE_ROUND_MS", |x: &i64| {
                (10..=2000).contains(x)
            })
            .map_or(d.round_ns, |ms| ms * 1_000_000),
            queue_ns: parse(l, "FGPU_COMPUTE_QUEUE_US", |x: &u64| {
                (100..=50_000).contains(x)
            })
            .map_or(d.queue_ns, |us| us * 1000),
            overlap: flag("FGPU_COMPUTE_OVERLAP", d.overlap),
            queue_scale: flag("FGPU_COMPUTE_QUEUE_SCALE", d.queue_scale),
            open: flag("FGPU_COMPUTE_OPEN", d.open),
            open_queue_ns: parse(l, "FGPU_COMPUTE_OPEN_QUEUE_US", |x: &u64| {
                (100..=50_000).contains(x)
            })
            .map_or(d.open_queue_ns, |us| us * 1000),
            whole_quanta: flag("FGPU_COMPUTE_WHOLE_QUANTA", d.whole_quanta),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn with(vars: &[(&str, &str)]) -> Tuning {
        let m: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Tuning::from_lookup(|name| m.get(name).cloned())
    }

    #[test]
    fn no_overrides_are_the_documented_defaults() {
        let t = with(&[]);
        assert_eq!(t, Tuning::default());
        assert_eq!(t.round_ns, 200_000_000);
        assert_eq!(t.queue_ns, 4_000_000);
        assert!(!t.overlap && t.queue_scale && !t.whole_quanta);
    }

    #[test]
    fn good_overrides_apply_in_their_units() {
        let t = with(&[
            ("FGPU_COMPUTE_ROUND_MS", "600"),
            ("FGPU_COMPUTE_QUEUE_US", "1000"),
            ("FGPU_COMPUTE_LIGHT_DUTY", "0.5"),
            ("FGPU_COMPUTE_OVERLAP", "1"),
            ("FGPU_COMPUTE_QUEUE_SCALE", "0"),
            ("FGPU_COMPUTE_OPEN_QUEUE_US", "500"),
            ("FGPU_COMPUTE_WHOLE_QUANTA", "1"),
        ]);
        assert_eq!(t.open_queue_ns, 500_000);
        assert_eq!(t.round_ns, 600_000_000);
        assert_eq!(t.queue_ns, 1_000_000);
        assert_eq!(t.light_duty, 0.5);
        assert!(t.overlap && !t.queue_scale && t.whole_quanta);
    }

    #[test]
    fn bad_overrides_leave_the_defaults() {
        let t = with(&[
            ("FGPU_COMPUTE_ROUND_MS", "5"),     // under 10 ms
            ("FGPU_COMPUTE_QUEUE_US", "ten"),   // not a number
            ("FGPU_COMPUTE_LIGHT_DUTY", "1.5"), // over 1
            ("FGPU_COMPUTE_OVERLAP", "2"),      // not 0/1
            ("FGPU_COMPUTE_QUEUE_SCALE", "-1"), // not 0/1
        ]);
        assert_eq!(t, Tuning::default());
    }
}
