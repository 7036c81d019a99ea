//! Memory sizes and percentages as people write them.
//!
//! SIZE: `8GiB`, `512MiB`, `1.5GiB`, `8GB` (decimal), `4096` (bytes), `4K` (binary, like
//! `ulimit`). Units are case-insensitive; a space between number and unit is allowed.
//! PCT: `30%` or `30`, from 0 to 100.
//! DURATION: `30s`, `500ms`, `2m`, `1h`, or a number of seconds (`30`).

use std::fmt;

/// Why a SIZE or PCT could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    #[error("empty value")]
    Empty,
    #[error(
        "'{0}' is not a size: expected a number with an optional unit, e.g. 8GiB, 512MiB, 8GB or 1073741824"
    )]
    NotASize(String),
    #[error(
        "'{0}' has an unknown unit: use B, KiB, MiB, GiB, TiB (binary) or KB, MB, GB, TB (decimal)"
    )]
    UnknownUnit(String),
    #[error("'{0}' is too large")]
    TooLarge(String),
    #[error("'{0}' is not a percentage: expected 0-100, e.g. 30% or 30")]
    NotAPercent(String),
    #[error(
        "'{0}' is not a duration: expected a whole number with ms, s, m or h, e.g. 30s or 500ms"
    )]
    NotADuration(String),
}

const UNITS: &[(&str, u64)] = &[
    ("", 1),
    ("b", 1),
    ("k", 1 << 10),
    ("kib", 1 << 10),
    ("m", 1 << 20),
    ("mib", 1 << 20),
    ("g", 1 << 30),
    ("gib", 1 << 30),
    ("t", 1 << 40),
    ("tib", 1 << 40),
    ("kb", 1_000),
    ("mb", 1_000_000),
    ("gb", 1_000_000_000),
    ("tb", 1_000_000_000_000),
];

/// Parses a SIZE into bytes.
pub fn parse_size(input: &str) -> Result<u64, QuantityError> {
    let s = input.trim();
    if s.is_empty() {
        return Err(QuantityError::Empty);
    }
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let unit = unit.trim().to_ascii_lowercase();
    if num.is_empty() || num.starts_with('.') || num.ends_with('.') || num.matches('.').count() > 1
    {
        return Err(QuantityError::NotASize(input.to_string()));
    }
    let multiplier = UNITS
        .iter()
        .find(|(name, _)| *name == unit)
        .map(|(_, m)| *m)
        .ok_or_else(|| {
            if unit.chars().all(|c| c.is_ascii_alphabetic()) {
                QuantityError::UnknownUnit(input.to_string())
            } else {
                QuantityError::NotASize(input.to_string())
            }
        })?;
    let (int_part, frac_part) = num.split_once('.').unwrap_or((num, ""));
    let int: u64 = int_part
        .parse()
        .map_err(|_| QuantityError::TooLarge(input.to_string()))?;
    let mut bytes = int
        .checked_mul(multiplier)
        .ok_or_else(|| QuantityError::TooLarge(input.to_string()))?;
    if !frac_part.is_empty() {
        // Exact decimal fraction of the unit, rounded down to a whole byte.
        let digits = frac_part.len().min(18) as u32;
        let frac: u128 = frac_part[..digits as usize]
            .parse()
            .map_err(|_| QuantityError::NotASize(input.to_string()))?;
        let extra = frac * u128::from(multiplier) / 10u128.pow(digits);
        bytes = bytes
            .checked_add(
                u64::try_from(extra).map_err(|_| QuantityError::TooLarge(input.to_string()))?,
            )
            .ok_or_else(|| QuantityError::TooLarge(input.to_string()))?;
    }
    Ok(bytes)
}

/// Parses a PCT (`30%` or `30`) into a whole percentage 0..=100.
pub fn parse_percent(input: &str) -> Result<u8, QuantityError> {
    let s = input.trim();
    if s.is_empty() {
        return Err(QuantityError::Empty);
    }
    let digits = s.strip_suffix('%').unwrap_or(s).trim();
    match digits.parse::<u8>() {
        Ok(p) if p <= 100 => Ok(p),
        _ => Err(QuantityError::NotAPercent(input.to_string())),
    }
}

/// Displays bytes the way people read them: exact binary units when they divide evenly
/// (`8GiB`, `512MiB`), otherwise one decimal (`1.5GiB`) or plain bytes below 1 KiB.
/// DURATION → milliseconds: `500ms`, `30s`, `2m`, `1h`, or whole seconds (`30`).
pub fn parse_duration_ms(input: &str) -> Result<u64, QuantityError> {
    let t = input.trim();
    if t.is_empty() {
        return Err(QuantityError::Empty);
    }
    let bad = || QuantityError::NotADuration(input.to_string());
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num.parse().map_err(|_| bad())?;
    let per = match unit.trim().to_ascii_lowercase().as_str() {
        "ms" => 1,
        "" | "s" => 1000,
        "m" | "min" => 60_000,
        "h" => 3_600_000,
        _ => return Err(bad()),
    };
    n.checked_mul(per)
        .ok_or_else(|| QuantityError::TooLarge(input.to_string()))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Size(pub u64);

impl fmt::Display for Size {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const NAMES: [(&str, u64); 4] = [
            ("TiB", 1 << 40),
            ("GiB", 1 << 30),
            ("MiB", 1 << 20),
            ("KiB", 1 << 10),
        ];
        let b = self.0;
        for (name, unit) in NAMES {
            if b >= unit {
                if b.is_multiple_of(unit) {
                    return write!(f, "{}{name}", b / unit);
                }
                return write!(f, "{:.1}{name}", b as f64 / unit as f64);
            }
        }
        write!(f, "{b}B")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_people_write() {
        assert_eq!(parse_size("8GiB"), Ok(8 << 30));
        assert_eq!(parse_size("512MiB"), Ok(512 << 20));
        assert_eq!(parse_size("512mib"), Ok(512 << 20));
        assert_eq!(parse_size("8GB"), Ok(8_000_000_000));
        assert_eq!(parse_size("1073741824"), Ok(1 << 30));
        assert_eq!(parse_size("4K"), Ok(4096));
        assert_eq!(parse_size(" 2 GiB "), Ok(2 << 30));
        assert_eq!(parse_size("1.5GiB"), Ok(3 << 29));
        assert_eq!(parse_size("0"), Ok(0));
    }

    #[test]
    fn bad_sizes_say_why() {
        assert_eq!(parse_size(""), Err(QuantityError::Empty));
        assert_eq!(
            parse_size("lots"),
            Err(QuantityError::NotASize("lots".into()))
        );
        assert_eq!(parse_size("-1"), Err(QuantityError::NotASize("-1".into())));
        assert_eq!(
            parse_size("8XB"),
            Err(QuantityError::UnknownUnit("8XB".into()))
        );
        assert_eq!(
            parse_size("1.2.3G"),
            Err(QuantityError::NotASize("1.2.3G".into()))
        );
        assert_eq!(
            parse_size("99999999999TiB"),
            Err(QuantityError::TooLarge("99999999999TiB".into()))
        );
        let msg = parse_size("banana").unwrap_err().to_string();
        assert!(msg.contains("8GiB"), "{msg}");
    }

    #[test]
    fn percentages() {
        assert_eq!(parse_percent("30%"), Ok(30));
        assert_eq!(parse_percent("30"), Ok(30));
        assert_eq!(parse_percent("100%"), Ok(100));
        assert_eq!(
            parse_percent("101"),
            Err(QuantityError::NotAPercent("101".into()))
        );
        assert_eq!(
            parse_percent("-5%"),
            Err(QuantityError::NotAPercent("-5%".into()))
        );
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration_ms("30s"), Ok(30_000));
        assert_eq!(parse_duration_ms("30"), Ok(30_000));
        assert_eq!(parse_duration_ms("500ms"), Ok(500));
        assert_eq!(parse_duration_ms("2m"), Ok(120_000));
        assert_eq!(parse_duration_ms("1h"), Ok(3_600_000));
        assert_eq!(parse_duration_ms(" 5 s "), Ok(5_000));
        for bad in ["1.5s", "s", "-3s", "10 parsecs"] {
            assert_eq!(
                parse_duration_ms(bad),
                Err(QuantityError::NotADuration(bad.into())),
                "{bad}"
            );
        }
        assert_eq!(parse_duration_ms(""), Err(QuantityError::Empty));
    }

    #[test]
    fn display_round_trips_exact_sizes() {
        for s in ["8GiB", "512MiB", "1.5GiB", "100B", "3KiB"] {
            let bytes = parse_size(s).unwrap();
            assert_eq!(Size(bytes).to_string(), s);
        }
        assert_eq!(Size(805_306_368).to_string(), "768MiB");
    }
}
