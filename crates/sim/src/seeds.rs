//! Seeded runs of randomized tests, with a replay command on failure (TigerBeetle's habit).
//!
//! Environment:
//! - `SOFTRDMA_SEED=<n>` (decimal or `0x` hex): run only that seed, to replay a failure.
//! - `SOFTRDMA_SOAK_SEEDS=<n>`: run `n` seeds instead of the test's default count, starting at
//!   `SOFTRDMA_SEED_START` if set, otherwise at a start derived from the wall clock (printed), so
//!   that each soak explores new seeds. Each seed still replays exactly.
//!
//! Without either, a test runs its default seeds `0..default_count`, the same every time.

use std::panic::{catch_unwind, AssertUnwindSafe};

/// Environment variable naming the one seed to run.
pub const SEED_VAR: &str = "SOFTRDMA_SEED";
/// Environment variable giving the number of seeds for a soak run.
pub const SOAK_VAR: &str = "SOFTRDMA_SOAK_SEEDS";
/// Environment variable giving the first seed of a soak run.
pub const START_VAR: &str = "SOFTRDMA_SEED_START";

/// Where a randomized test lives, so a failure can print the command that replays it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Replay<'a> {
    /// Cargo package of the test (`softrdma-engine`).
    pub package: &'a str,
    /// Name of the integration-test target (`--test <name>`), or `None` for unit tests (`--lib`).
    pub test: Option<&'a str>,
    /// Name of the test function (the filter after `--`).
    pub name: &'a str,
}

impl<'a> Replay<'a> {
    /// A test function `name` in the integration-test target `test` of `package`.
    pub fn new(package: &'a str, test: &'a str, name: &'a str) -> Self {
        Replay {
            package,
            test: Some(test),
            name,
        }
    }

    /// The shell command that runs this test with just `seed`.
    pub fn command(&self, seed: u64) -> String {
        let release = if cfg!(debug_assertions) {
            ""
        } else {
            " --release"
        };
        let target = match self.test {
            Some(t) => format!("--test {t}"),
            None => "--lib".to_string(),
        };
        format!(
            "{SEED_VAR}={seed} cargo test{release} -p {} {target} -- {} --exact --nocapture",
            self.package, self.name
        )
    }
}

/// Parses a seed written in decimal or as `0x` hex.
pub fn parse_seed(s: &str) -> Option<u64> {
    let s = s.trim();
    match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => s.parse().ok(),
    }
}

/// The seeds a run should use, read from the environment (see the module docs).
///
/// # Panics
/// If a variable is set but does not parse (so a typo does not silently run other seeds).
pub fn seeds_from_env(default_count: u64) -> Vec<u64> {
    if let Ok(s) = std::env::var(SEED_VAR) {
        let seed = parse_seed(&s).unwrap_or_else(|| panic!("{SEED_VAR}={s:?} is not a seed"));
        return vec![seed];
    }
    if let Ok(n) = std::env::var(SOAK_VAR) {
        let n: u64 = n
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{SOAK_VAR}={n:?} is not a count"));
        let start = match std::env::var(START_VAR) {
            Ok(s) => parse_seed(&s).unwrap_or_else(|| panic!("{START_VAR}={s:?} is not a seed")),
            Err(_) => {
                let t = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos() as u64)
                    .unwrap_or(0);
                // Keep seeds short enough to type; the top bits rarely matter for coverage.
                crate::rng::mix(t) >> 16
            }
        };
        eprintln!("soak: {n} seeds from {START_VAR}={start}");
        return (0..n).map(|i| start.wrapping_add(i)).collect();
    }
    (0..default_count).collect()
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "panic with a non-string payload".to_string()
    }
}

/// Runs `f` once per seed (see the module docs for which seeds) and returns how many ran.
///
/// `f` fails by returning `Err(reason)` or by panicking.
///
/// # Panics
/// On the first failing seed, with the seed, the reason and the command that replays it.
pub fn for_each_seed(
    replay: &Replay<'_>,
    default_count: u64,
    mut f: impl FnMut(u64) -> Result<(), String>,
) -> u64 {
    let seeds = seeds_from_env(default_count);
    let total = seeds.len();
    for (i, &seed) in seeds.iter().enumerate() {
        let outcome = catch_unwind(AssertUnwindSafe(|| f(seed)));
        let reason = match outcome {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(e),
            Err(p) => Some(format!("panicked: {}", panic_message(p.as_ref()))),
        };
        if let Some(reason) = reason {
            panic!(
                "{} failed with seed {seed} ({} of {total}): {reason}\n    replay: {}",
                replay.name,
                i + 1,
                replay.command(seed)
            );
        }
        if total >= 1000 && (i + 1) % 1000 == 0 {
            eprintln!("{}: {} of {total} seeds passed", replay.name, i + 1);
        }
    }
    total as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replay_command_names_seed_package_target_and_test() {
        let r = Replay::new("softrdma-engine", "sweep", "rc_sweep");
        let c = r.command(1234);
        assert!(c.starts_with("SOFTRDMA_SEED=1234 cargo test"), "{c}");
        assert!(
            c.contains("-p softrdma-engine --test sweep -- rc_sweep --exact"),
            "{c}"
        );
        let lib = Replay {
            package: "softrdma-sim",
            test: None,
            name: "x",
        };
        assert!(lib.command(1).contains("--lib -- x"));
    }

    #[test]
    fn seeds_parse_in_decimal_and_hex() {
        assert_eq!(parse_seed("42"), Some(42));
        assert_eq!(parse_seed(" 0x2A "), Some(42));
        assert_eq!(parse_seed("nope"), None);
    }
}
