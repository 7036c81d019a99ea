//! Byte-size parsing shared by the library and `fgpu-sim-load` (included there with `#[path]`).

/// Parses `16GiB`, `512MiB`, `8GB`, `4k`, `1.5GiB` or plain bytes. Binary suffixes (`KiB`, `MiB`,
/// `GiB`, `TiB`) are powers of 1024, decimal ones (`KB`, `MB`, `GB`, `TB`) powers of 1000; a lone
/// `K`/`M`/`G`/`T` is read as binary. Case-insensitive; an optional trailing `B` alone means bytes.
pub fn parse_size(text: &str) -> Option<u64> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, suffix) = t.split_at(split);
    if num.is_empty() {
        return None;
    }
    let mult: u64 = match suffix.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "t" | "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        _ => return None,
    };
    if let Ok(n) = num.parse::<u64>() {
        return n.checked_mul(mult);
    }
    let f: f64 = num.parse().ok()?;
    let v = f * mult as f64;
    (v.is_finite() && v >= 0.0 && v < u64::MAX as f64).then_some(v as u64)
}
