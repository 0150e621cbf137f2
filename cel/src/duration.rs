//! Go's durations (`1h2m3.5s`, `300ms`, `1µs`), parsed exactly and printed as Go prints them.
//!
//! CEL's `duration()` takes Go's `time.ParseDuration` syntax, and configuration files write
//! `metav1.Duration` fields the same way, so the one parser lives here, below both the
//! interpreter and the configuration kinds.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A `metav1.Duration`: written as Go writes durations (`1h2m3.5s`, `300ms`, `0s`),
/// held in nanoseconds (negative values are representable so validation can refuse them
/// with the field's name).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default, Hash)]
pub struct Duration(pub i64);

impl Duration {
    pub const fn from_secs(s: i64) -> Self {
        Self(s.saturating_mul(1_000_000_000))
    }

    pub const fn from_millis(ms: i64) -> Self {
        Self(ms.saturating_mul(1_000_000))
    }

    pub fn nanos(self) -> i64 {
        self.0
    }

    pub fn is_negative(self) -> bool {
        self.0 < 0
    }

    pub fn is_zero(self) -> bool {
        self.0 == 0
    }

    /// As a `std` duration; negative values become zero.
    pub fn to_std(self) -> std::time::Duration {
        std::time::Duration::from_nanos(u64::try_from(self.0).unwrap_or(0))
    }

    /// Parses Go's `time.ParseDuration` syntax: a sign, then one or more decimal numbers
    /// each with a unit of `ns`, `us` (or `µs`), `ms`, `s`, `m`, `h`. Overflow is an error.
    pub fn parse(text: &str) -> Result<Self, String> {
        let bad = || format!("time: invalid duration {text:?}");
        let (neg, mut rest) = match text.as_bytes().first() {
            Some(b'-') => (true, &text[1..]),
            Some(b'+') => (false, &text[1..]),
            _ => (false, text),
        };
        if rest == "0" {
            return Ok(Self(0));
        }
        if rest.is_empty() {
            return Err(bad());
        }
        let mut total: i128 = 0;
        while !rest.is_empty() {
            let digits = rest
                .find(|c: char| !c.is_ascii_digit() && c != '.')
                .ok_or_else(bad)?;
            if digits == 0 {
                return Err(bad());
            }
            let number = &rest[..digits];
            rest = &rest[digits..];
            let unit_len = rest
                .find(|c: char| c.is_ascii_digit() || c == '.')
                .unwrap_or(rest.len());
            let unit: i128 = match &rest[..unit_len] {
                "ns" => 1,
                "us" | "µs" | "μs" => 1_000,
                "ms" => 1_000_000,
                "s" => 1_000_000_000,
                "m" => 60_000_000_000,
                "h" => 3_600_000_000_000,
                _ => return Err(bad()),
            };
            rest = &rest[unit_len..];
            let (whole, frac) = number.split_once('.').unwrap_or((number, ""));
            if whole.is_empty() && frac.is_empty() {
                return Err(bad());
            }
            let whole: i128 = if whole.is_empty() {
                0
            } else {
                whole.parse().map_err(|_| bad())?
            };
            let mut part = whole.checked_mul(unit).ok_or_else(bad)?;
            let mut scale = unit;
            for d in frac.bytes().take(18) {
                scale /= 10;
                // A second '.' ("1.2.3s") is not a digit.
                let digit = d.checked_sub(b'0').filter(|d| *d <= 9).ok_or_else(bad)?;
                part = part
                    .checked_add(i128::from(digit).saturating_mul(scale))
                    .ok_or_else(bad)?;
            }
            total = total.checked_add(part).ok_or_else(bad)?;
            if total > i128::from(i64::MAX) {
                return Err(bad());
            }
        }
        let total = i64::try_from(total).map_err(|_| bad())?;
        Ok(Self(if neg { total.saturating_neg() } else { total }))
    }
}

impl fmt::Display for Duration {
    /// Go's `Duration.String()`: `1h2m3s`, `1.5s`, `300ms`, `0s`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0;
        if n == 0 {
            return f.write_str("0s");
        }
        let sign = if n < 0 { "-" } else { "" };
        let u = n.unsigned_abs();
        if u < 1_000 {
            return write!(f, "{sign}{u}ns");
        }
        if u < 1_000_000 {
            return write!(f, "{sign}{}µs", trim_fraction(u, 1_000));
        }
        if u < 1_000_000_000 {
            return write!(f, "{sign}{}ms", trim_fraction(u, 1_000_000));
        }
        let secs_total = u / 1_000_000_000;
        let h = secs_total / 3600;
        let m = (secs_total % 3600) / 60;
        let rem = u % 60_000_000_000;
        let secs = trim_fraction(rem, 1_000_000_000);
        if h > 0 {
            write!(f, "{sign}{h}h{m}m{secs}s")
        } else if m > 0 {
            write!(f, "{sign}{m}m{secs}s")
        } else {
            write!(f, "{sign}{secs}s")
        }
    }
}

fn trim_fraction(value: u64, unit: u64) -> String {
    let whole = value.checked_div(unit).unwrap_or_default();
    let frac = value.checked_rem(unit).unwrap_or_default();
    if frac == 0 {
        return whole.to_string();
    }
    let width = unit.ilog10() as usize;
    let digits = format!("{frac:0width$}");
    format!("{whole}.{}", digits.trim_end_matches('0'))
}

impl Serialize for Duration {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Duration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        Duration::parse(&text).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_and_print_as_go_does() {
        for (text, nanos, printed) in [
            ("0", 0, "0s"),
            ("0s", 0, "0s"),
            ("300ms", 300_000_000, "300ms"),
            ("1.5s", 1_500_000_000, "1.5s"),
            ("1h2m3s", 3_723_000_000_000, "1h2m3s"),
            ("2m", 120_000_000_000, "2m0s"),
            ("-5s", -5_000_000_000, "-5s"),
            ("1us", 1_000, "1µs"),
            (".5s", 500_000_000, "500ms"),
        ] {
            let d = Duration::parse(text).unwrap();
            assert_eq!(d.nanos(), nanos, "{text}");
            assert_eq!(d.to_string(), printed, "{text}");
        }
        for bad in [
            "",
            "5",
            "s",
            "1x",
            "1.s.",
            "9999999999999999999h",
            "--1s",
            "1.2.3s",
        ] {
            assert!(Duration::parse(bad).is_err(), "{bad}");
        }
    }
}
