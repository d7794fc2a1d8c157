//! Finite-difference gradient checker used by the tests (public so downstream crates can reuse
//! it for their own layers).

/// Result of a check.
#[derive(Clone, Debug, PartialEq)]
pub struct GradCheckReport {
    /// Coordinates compared.
    pub checked: usize,
    /// Coordinates skipped because the central difference crossed a kink (ReLU).
    pub skipped: usize,
    /// Worst `|a - n| / (atol + rtol * max(|a|, |n|))` seen (<= 1 means pass).
    pub worst_ratio: f64,
    /// Index of the worst coordinate.
    pub worst_index: usize,
    /// Analytic and numeric values at the worst coordinate.
    pub worst: (f64, f64),
}

/// Tolerances of the checker.
#[derive(Clone, Copy, Debug)]
pub struct GradCheck {
    /// Finite-difference step (a power of two keeps `x + eps` exact for moderate |x|).
    pub eps: f64,
    /// Relative tolerance.
    pub rtol: f64,
    /// Absolute tolerance.
    pub atol: f64,
}

impl Default for GradCheck {
    fn default() -> Self {
        GradCheck {
            eps: 1.0 / 1024.0,
            rtol: 2e-2,
            atol: 2e-4,
        }
    }
}

impl GradCheck {
    /// Compares `analytic[i]` with the central difference `(f(i, +eps) - f(i, -eps)) / 2eps`,
    /// where `f(i, d)` evaluates the loss with coordinate `i` shifted by `d` (and restores it).
    /// Coordinates whose second difference shows a kink (`|f+ - 2 f0 + f-|` much larger than
    /// smooth curvature allows) are skipped and counted. Returns `Err` if any coordinate fails.
    pub fn check(
        &self,
        analytic: &[f64],
        mut f: impl FnMut(usize, f64) -> f64,
    ) -> Result<GradCheckReport, GradCheckReport> {
        let f0 = f(0, 0.0);
        let mut rep = GradCheckReport {
            checked: 0,
            skipped: 0,
            worst_ratio: 0.0,
            worst_index: 0,
            worst: (0.0, 0.0),
        };
        for (i, &a) in analytic.iter().enumerate() {
            let fp = f(i, self.eps);
            let fm = f(i, -self.eps);
            let numeric = (fp - fm) / (2.0 * self.eps);
            let second = (fp - 2.0 * f0 + fm).abs();
            // A slope jump of size J across a kink gives second ~ J * eps; smooth functions give
            // ~ eps^2 * f''. Skip only when it is clearly kink-like.
            if second > 50.0 * self.eps * self.eps * (1.0 + f0.abs())
                && second > 1e-3 * self.eps * numeric.abs().max(1e-2)
            {
                rep.skipped += 1;
                continue;
            }
            rep.checked += 1;
            let ratio = (a - numeric).abs() / (self.atol + self.rtol * a.abs().max(numeric.abs()));
            if ratio > rep.worst_ratio {
                rep.worst_ratio = ratio;
                rep.worst_index = i;
                rep.worst = (a, numeric);
            }
        }
        if rep.worst_ratio <= 1.0 {
            Ok(rep)
        } else {
            Err(rep)
        }
    }
}
