//! Kubernetes resource quantities (`8Gi`, `30`, `4294967296`, `1.5G`, `500m`, `1e3`) as the
//! API server serializes them, parsed to whole numbers (rounded up, as the scheduler does).

use anyhow::{Result, bail};

/// Parses a quantity to a whole number, rounding a fraction up. Refuses negatives, values
/// above `u64::MAX`, and anything that is not a quantity.
pub fn parse(q: &str) -> Result<u64> {
    let s = q.trim();
    let (num, mult_num, mult_den): (&str, u128, u128) = if let Some(n) = s.strip_suffix("Ki") {
        (n, 1 << 10, 1)
    } else if let Some(n) = s.strip_suffix("Mi") {
        (n, 1 << 20, 1)
    } else if let Some(n) = s.strip_suffix("Gi") {
        (n, 1 << 30, 1)
    } else if let Some(n) = s.strip_suffix("Ti") {
        (n, 1 << 40, 1)
    } else if let Some(n) = s.strip_suffix("Pi") {
        (n, 1 << 50, 1)
    } else if let Some(n) = s.strip_suffix("Ei") {
        (n, 1 << 60, 1)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 1, 1000)
    } else if let Some(n) = s.strip_suffix('k') {
        (n, 1_000, 1)
    } else if let Some(n) = s.strip_suffix('M') {
        (n, 1_000_000, 1)
    } else if let Some(n) = s.strip_suffix('G') {
        (n, 1_000_000_000, 1)
    } else if let Some(n) = s.strip_suffix('T') {
        (n, 1_000_000_000_000, 1)
    } else if let Some(n) = s.strip_suffix('P') {
        (n, 1_000_000_000_000_000, 1)
    } else if let Some((n, e)) = s.split_once(['e', 'E']) {
        let e: u32 = match e.strip_prefix('+').unwrap_or(e).parse() {
            Ok(e) if e <= 18 => e,
            _ => bail!("quantity '{q}': unsupported exponent"),
        };
        (n, 10u128.pow(e), 1)
    } else {
        (s, 1, 1)
    };
    let (int, frac) = num.split_once('.').unwrap_or((num, ""));
    if int.is_empty() && frac.is_empty()
        || !int.bytes().all(|b| b.is_ascii_digit())
        || !frac.bytes().all(|b| b.is_ascii_digit())
        || int.len() > 20
        || frac.len() > 18
    {
        bail!("'{q}' is not a Kubernetes quantity (expected e.g. 8Gi, 30 or 4294967296)");
    }
    let int: u128 = if int.is_empty() { 0 } else { int.parse()? };
    let frac_den = 10u128.pow(frac.len() as u32);
    let frac_num: u128 = if frac.is_empty() { 0 } else { frac.parse()? };
    // (int + frac_num/frac_den) * mult_num / mult_den, rounded up.
    let num = (int * frac_den + frac_num)
        .checked_mul(mult_num)
        .ok_or_else(|| anyhow::anyhow!("quantity '{q}' is too large"))?;
    let den = frac_den * mult_den;
    let v = num.div_ceil(den);
    u64::try_from(v).map_err(|_| anyhow::anyhow!("quantity '{q}' is too large"))
}

/// Bytes as a binary quantity when exact (`8Gi`), else plain bytes.
pub fn bytes(b: u64) -> String {
    for (suffix, shift) in [("Ti", 40), ("Gi", 30), ("Mi", 20), ("Ki", 10)] {
        if b != 0 && b.trailing_zeros() >= shift {
            return format!("{}{suffix}", b >> shift);
        }
    }
    b.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities() {
        assert_eq!(parse("8Gi").unwrap(), 8 << 30);
        assert_eq!(parse("4294967296").unwrap(), 4 << 30);
        assert_eq!(parse("30").unwrap(), 30);
        assert_eq!(parse("1.5Gi").unwrap(), 3 << 29);
        assert_eq!(parse("1G").unwrap(), 1_000_000_000);
        assert_eq!(parse("500m").unwrap(), 1, "rounded up");
        assert_eq!(parse("1e3").unwrap(), 1000);
        assert_eq!(parse("0").unwrap(), 0);
        for bad in [
            "",
            "-1Gi",
            "8GB",
            "Gi",
            "1..2",
            "abc",
            "1e99",
            "99999999999Ei",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
        assert_eq!(bytes(8 << 30), "8Gi");
        assert_eq!(bytes(80 << 30), "80Gi");
        assert_eq!(bytes(1000), "1000");
    }
}
