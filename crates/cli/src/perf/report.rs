//! perftest's output tables: the same columns and units as `ib_write_bw` and `ib_write_lat`.

use std::time::Duration;

/// The dashed rule perftest prints around its tables.
pub const RULE: &str =
    "---------------------------------------------------------------------------------------";

/// One row of a bandwidth table.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BwResult {
    /// Message size in bytes.
    pub size: u64,
    /// Messages completed.
    pub iters: u64,
    /// Time from the first post to the last completion.
    pub elapsed: Duration,
    /// Highest rate seen over a window of the run, bytes per second.
    pub peak_bytes_per_sec: f64,
}

impl BwResult {
    /// Average bandwidth, bytes per second.
    pub fn avg_bytes_per_sec(&self) -> f64 {
        let s = self.elapsed.as_secs_f64();
        if s > 0.0 {
            (self.size * self.iters) as f64 / s
        } else {
            0.0
        }
    }

    /// Messages per second, in millions (perftest's `MsgRate[Mpps]`).
    pub fn mpps(&self) -> f64 {
        let s = self.elapsed.as_secs_f64();
        if s > 0.0 {
            self.iters as f64 / s / 1e6
        } else {
            0.0
        }
    }
}

/// A bandwidth in perftest's units: MB/sec (2^20 bytes per second), or Gb/sec (10^9 bits per
/// second) with `--report_gbits`.
pub fn bw_units(bytes_per_sec: f64, gbits: bool) -> f64 {
    if gbits {
        bytes_per_sec * 8.0 / 1e9
    } else {
        bytes_per_sec / (1u64 << 20) as f64
    }
}

/// The unit label of [`bw_units`].
pub fn bw_unit_label(gbits: bool) -> &'static str {
    if gbits {
        "Gb/sec"
    } else {
        "MB/sec"
    }
}

/// The bandwidth table header, as `ib_write_bw` prints it.
pub fn bw_header(gbits: bool) -> String {
    let u = bw_unit_label(gbits);
    format!(" #bytes     #iterations    BW peak[{u}]    BW average[{u}]   MsgRate[Mpps]")
}

/// One bandwidth row.
pub fn bw_row(r: &BwResult, gbits: bool) -> String {
    format!(
        " {:<7}    {:<10}       {:<7.2}            {:<7.2}              {:<7.6}",
        r.size,
        r.iters,
        bw_units(r.peak_bytes_per_sec, gbits),
        bw_units(r.avg_bytes_per_sec(), gbits),
        r.mpps()
    )
}

/// Peak rate over windows of the run: the best bytes/second over any stretch holding at least
/// a twentieth of the messages and more than `in_flight`, the messages that may be
/// outstanding at once (shorter windows would measure one burst of completions, not the link).
/// `marks` are (time since start, messages completed by then), in order.
pub fn peak_rate(
    size: u64,
    marks: &[(Duration, u64)],
    total: Duration,
    iters: u64,
    in_flight: u64,
) -> f64 {
    let avg = if total.as_secs_f64() > 0.0 {
        (size * iters) as f64 / total.as_secs_f64()
    } else {
        0.0
    };
    let min_msgs = (iters / 20).max(in_flight + 1);
    let mut best = avg;
    let mut j = 0;
    let mut pts = Vec::with_capacity(marks.len() + 1);
    pts.push((Duration::ZERO, 0u64));
    pts.extend_from_slice(marks);
    for i in 0..pts.len() {
        // Smallest j > i with at least min_msgs between them: the shortest qualifying window
        // from i gives the highest rate for that start.
        if j <= i {
            j = i + 1;
        }
        while j < pts.len() && pts[j].1 - pts[i].1 < min_msgs {
            j += 1;
        }
        if j >= pts.len() {
            break;
        }
        let dt = (pts[j].0 - pts[i].0).as_secs_f64();
        if dt > 0.0 {
            best = best.max((pts[j].1 - pts[i].1) as f64 * size as f64 / dt);
        }
    }
    best
}

/// Statistics of one latency run, in microseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LatStats {
    /// Message size in bytes.
    pub size: u64,
    /// Samples.
    pub iters: u64,
    /// Smallest.
    pub min: f64,
    /// Largest.
    pub max: f64,
    /// Median (perftest's t_typical).
    pub typical: f64,
    /// Mean.
    pub avg: f64,
    /// Standard deviation.
    pub stdev: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
}

impl LatStats {
    /// Compute from samples in microseconds (any order). `None` for no samples.
    pub fn from_samples(size: u64, samples: &mut [f64]) -> Option<LatStats> {
        if samples.is_empty() {
            return None;
        }
        samples.sort_by(f64::total_cmp);
        let n = samples.len();
        let avg = samples.iter().sum::<f64>() / n as f64;
        let var = samples.iter().map(|x| (x - avg) * (x - avg)).sum::<f64>() / n as f64;
        let pct = |p: f64| {
            let idx = ((p * n as f64).ceil() as usize).clamp(1, n) - 1;
            samples[idx]
        };
        Some(LatStats {
            size,
            iters: n as u64,
            min: samples[0],
            max: samples[n - 1],
            typical: samples[n / 2],
            avg,
            stdev: var.sqrt(),
            p99: pct(0.99),
            p999: pct(0.999),
        })
    }
}

/// The latency table header, as `ib_write_lat` prints it.
pub fn lat_header() -> &'static str {
    " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec]"
}

/// One latency row.
pub fn lat_row(s: &LatStats) -> String {
    format!(
        " {:<7} {:<10}     {:<7.2}        {:<7.2}      {:<7.2}            {:<7.2}        {:<7.2}         {:<7.2}                {:<7.2}",
        s.size, s.iters, s.min, s.max, s.typical, s.avg, s.stdev, s.p99, s.p999
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_statistics_of_known_samples() {
        let mut v: Vec<f64> = (1..=1000).map(f64::from).collect();
        let s = LatStats::from_samples(2, &mut v).unwrap();
        assert_eq!(s.min, 1.0);
        assert_eq!(s.max, 1000.0);
        assert_eq!(s.typical, 501.0);
        assert_eq!(s.avg, 500.5);
        assert_eq!(s.p99, 990.0);
        assert_eq!(s.p999, 999.0);
        assert!((s.stdev - 288.675).abs() < 0.01);
        assert!(LatStats::from_samples(2, &mut []).is_none());
    }

    #[test]
    fn bandwidth_units_follow_perftest() {
        assert_eq!(bw_units(1048576.0, false), 1.0);
        assert_eq!(bw_units(125_000_000.0, true), 1.0);
        let r = BwResult {
            size: 1 << 20,
            iters: 100,
            elapsed: Duration::from_secs(1),
            peak_bytes_per_sec: 200.0 * 1048576.0,
        };
        let row = bw_row(&r, false);
        assert!(row.contains("200.00") && row.contains("100.00") && row.contains("0.000100"));
        assert!(bw_header(true).contains("BW average[Gb/sec]"));
    }

    #[test]
    fn peak_is_at_least_the_average_and_finds_a_fast_stretch() {
        let marks: Vec<(Duration, u64)> = (1..=100)
            .map(|i| {
                // The second half runs twice as fast.
                let t = if i <= 50 {
                    i * 20
                } else {
                    1000 + (i - 50) * 10
                };
                (Duration::from_millis(t), i)
            })
            .collect();
        let total = Duration::from_millis(1500);
        let p = peak_rate(1000, &marks, total, 100, 1);
        assert!((p - 100_000.0).abs() < 1.0, "{p}");
    }
}
