//! When a certificate is due for renewal: a share of its validity left, the server's policy
//! (`--renew-when-remaining`).

/// "Renew when less than `numerator`/`denominator` of the validity remains."
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RenewAt {
    numerator: u32,
    denominator: u32,
}

impl RenewAt {
    /// A third: a one-year leaf renews with four months left, a 3-day one after two days.
    pub const THIRD: Self = Self {
        numerator: 1,
        denominator: 3,
    };

    /// `N/D` with 0 < N < D.
    pub fn parse(text: &str) -> Result<Self, String> {
        let (n, d) = text
            .split_once('/')
            .ok_or_else(|| format!("`{text}` is not a fraction like 1/3"))?;
        let parse = |s: &str| {
            s.trim()
                .parse::<u32>()
                .map_err(|_| format!("`{text}` is not a fraction like 1/3"))
        };
        let (numerator, denominator) = (parse(n)?, parse(d)?);
        if numerator == 0 || numerator >= denominator {
            return Err(format!(
                "`{text}` must be a fraction between 0 and 1, like 1/3"
            ));
        }
        Ok(Self {
            numerator,
            denominator,
        })
    }

    /// Whether a certificate valid from `not_before` to `not_after` is due at `now`.
    pub fn due(self, not_before: i64, not_after: i64, now: i64) -> bool {
        let lifetime = i128::from(not_after - not_before);
        let remaining = i128::from(not_after - now);
        remaining * i128::from(self.denominator) < lifetime * i128::from(self.numerator)
    }
}

impl Default for RenewAt {
    fn default() -> Self {
        Self::THIRD
    }
}

impl std::fmt::Display for RenewAt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.numerator, self.denominator)
    }
}
