//! Percentiles of latency samples (nearest-rank, so every reported value is a real sample).

/// The count, median, 99th percentile and maximum of a set of samples, in the samples' unit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    /// How many samples.
    pub count: usize,
    /// The 50th percentile.
    pub p50: f64,
    /// The 99th percentile.
    pub p99: f64,
    /// The largest sample.
    pub max: f64,
}

/// The nearest-rank percentile `p` (in 0..=100) of `sorted`, which must be ascending.
/// `None` when there are no samples.
pub fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    debug_assert!(sorted.windows(2).all(|w| w[0] <= w[1]), "samples must be sorted");
    let rank = ((p.clamp(0.0, 100.0) / 100.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// Summarises `samples` (any order; non-finite values are dropped). `None` when none are left.
pub fn summarize(mut samples: Vec<f64>) -> Option<Summary> {
    samples.retain(|x| x.is_finite());
    samples.sort_by(f64::total_cmp);
    Some(Summary {
        count: samples.len(),
        p50: percentile(&samples, 50.0)?,
        p99: percentile(&samples, 99.0)?,
        max: *samples.last()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(samples: &[f64], p: f64, expected: Option<f64>) {
        let mut s = samples.to_vec();
        s.sort_by(f64::total_cmp);
        assert_eq!(percentile(&s, p), expected, "p{p} of {samples:?}");
    }

    #[test]
    fn nearest_rank_percentiles() {
        check(&[], 50.0, None);
        check(&[7.0], 50.0, Some(7.0));
        check(&[7.0], 99.0, Some(7.0));
        check(&[1.0, 2.0], 50.0, Some(1.0));
        check(&[1.0, 2.0, 3.0, 4.0], 50.0, Some(2.0));
        check(&[1.0, 2.0, 3.0, 4.0], 75.0, Some(3.0));
        check(&[1.0, 2.0, 3.0, 4.0], 100.0, Some(4.0));
        check(&[1.0, 2.0, 3.0, 4.0], 0.0, Some(1.0));
        let hundred: Vec<f64> = (1..=100).map(f64::from).collect();
        check(&hundred, 99.0, Some(99.0));
        check(&hundred, 50.0, Some(50.0));
        let thousand: Vec<f64> = (1..=1000).map(f64::from).collect();
        check(&thousand, 99.0, Some(990.0));
    }

    #[test]
    fn summary_sorts_and_drops_non_finite() {
        let s = summarize(vec![5.0, f64::NAN, 1.0, 3.0, f64::INFINITY, 2.0, 4.0]).unwrap();
        assert_eq!(s, Summary { count: 5, p50: 3.0, p99: 5.0, max: 5.0 });
        assert_eq!(summarize(vec![f64::NAN]), None);
        assert_eq!(summarize(Vec::new()), None);
    }
}
