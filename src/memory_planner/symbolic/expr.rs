//! Sizes as expressions of symbols ([`TDim`]): sums of products of symbols with
//! non-negative integer coefficients, built, multiplied, evaluated and printed.

use std::fmt;

/// One product of a [`TDim`]: `coef × s[syms[0]] × s[syms[1]] × …`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Term {
    /// The constant factor.
    pub(crate) coef: u64,
    /// The symbols multiplied (by index, repeated for powers), sorted.
    pub(crate) syms: Vec<u32>,
}

/// A size as an expression of symbols: a sum of [`Term`]s (empty: zero).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub(crate) struct TDim {
    /// The terms added.
    pub(crate) terms: Vec<Term>,
}

impl TDim {
    #[cfg(test)]
    /// The constant `c`.
    pub(crate) fn constant(c: u64) -> TDim {
        TDim {
            terms: vec![Term {
                coef: c,
                syms: Vec::new(),
            }],
        }
    }

    #[cfg(test)]
    /// Symbol `i` alone.
    pub(crate) fn symbol(i: u32) -> TDim {
        TDim {
            terms: vec![Term {
                coef: 1,
                syms: vec![i],
            }],
        }
    }

    /// `coef × s[syms…]`: one product.
    pub(crate) fn product(coef: u64, syms: &[u32]) -> TDim {
        let mut syms = syms.to_vec();
        syms.sort_unstable();
        TDim {
            terms: vec![Term { coef, syms }],
        }
    }

    #[cfg(test)]
    /// `self + other`.
    pub(crate) fn add(&self, other: &TDim) -> TDim {
        let mut terms = self.terms.clone();
        terms.extend(other.terms.iter().cloned());
        TDim { terms }
    }

    #[cfg(test)]
    /// `self × other`, expanded into a sum of products.
    pub(crate) fn mul(&self, other: &TDim) -> TDim {
        let mut terms = Vec::with_capacity(self.terms.len() * other.terms.len());
        for a in &self.terms {
            for b in &other.terms {
                let mut syms: Vec<u32> = a.syms.iter().chain(&b.syms).copied().collect();
                syms.sort_unstable();
                terms.push(Term {
                    coef: a.coef.saturating_mul(b.coef),
                    syms,
                });
            }
        }
        TDim { terms }
    }

    #[cfg(test)]
    /// The largest symbol index used plus one (0 for a constant).
    pub(crate) fn symbols(&self) -> usize {
        self.terms
            .iter()
            .flat_map(|t| t.syms.iter())
            .map(|&s| s as usize + 1)
            .max()
            .unwrap_or(0)
    }

    /// The value for symbol values `values`; `None` on overflow or when a symbol has no
    /// value.
    pub(crate) fn eval(&self, values: &[u64]) -> Option<u64> {
        let mut sum: u64 = 0;
        for t in &self.terms {
            let mut p = t.coef;
            for &s in &t.syms {
                p = p.checked_mul(*values.get(s as usize)?)?;
            }
            sum = sum.checked_add(p)?;
        }
        Some(sum)
    }
}

impl fmt::Display for TDim {
    /// `4·s0·s1 + 64`; `0` for the empty sum.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.terms.is_empty() {
            return f.write_str("0");
        }
        for (i, t) in self.terms.iter().enumerate() {
            if i > 0 {
                f.write_str(" + ")?;
            }
            let mut first = true;
            if t.coef != 1 || t.syms.is_empty() {
                write!(f, "{}", t.coef)?;
                first = false;
            }
            for s in &t.syms {
                if !first {
                    f.write_str("·")?;
                }
                write!(f, "s{s}")?;
                first = false;
            }
        }
        Ok(())
    }
}
