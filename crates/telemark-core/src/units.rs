//! Human-written quantities shared by every command line and config file.

/// Parses a duration: a number with a unit `ns`, `us`, `ms`, `s`, `m`, `h` or `d` (seconds
/// when there is none), e.g. `250ms`, `2s`, `7d`. Zero is allowed; negative, non-finite or
/// absurdly long durations are not.
pub fn parse_duration_ns(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let units: [(&str, f64); 7] = [
        ("ns", 1.0),
        ("us", 1e3),
        ("ms", 1e6),
        ("s", 1e9),
        ("m", 60e9),
        ("h", 3600e9),
        ("d", 86_400e9),
    ];
    let (num, mult) =
        units.iter().find_map(|(u, m)| s.strip_suffix(u).map(|n| (n, *m))).unwrap_or((s, 1e9));
    match num.trim().parse::<f64>() {
        Ok(v) if v >= 0.0 && v.is_finite() && v * mult < 1.8e19 => Ok((v * mult) as u64),
        _ => Err(format!("{s:?} is not a duration (like 100ms, 2s, 15m, 7d)")),
    }
}

/// Parses a duration as [`parse_duration_ns`] does, refusing zero (an interval, a timeout).
pub fn parse_positive_duration_ns(s: &str) -> Result<u64, String> {
    match parse_duration_ns(s)? {
        0 => Err(format!("{s:?}: must be more than zero")),
        ns => Ok(ns),
    }
}

/// Parses a size in bytes: a number with a unit `B`, `KB`, `MB` or `GB` (powers of 1000;
/// bytes when there is none), or `KiB`, `MiB`, `GiB` (powers of 1024), e.g. `150KB`.
/// Times are not sizes: `10ms` is refused.
pub fn parse_size_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let units: [(&str, f64); 7] = [
        ("KiB", 1024.0),
        ("MiB", 1048576.0),
        ("GiB", 1073741824.0),
        ("KB", 1e3),
        ("MB", 1e6),
        ("GB", 1e9),
        ("B", 1.0),
    ];
    let (num, mult) = units
        .iter()
        .find_map(|(u, m)| t.strip_suffix(u).map(|n| (n.trim(), *m)))
        .unwrap_or((t, 1.0));
    match num.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 && v * mult < 1.8e19 => Ok((v * mult) as u64),
        _ => Err(format!("{s:?} is not a size (like 1500, 150KB, 4MB)")),
    }
}

/// Parses a link rate: a number with a unit `bit`, `kbit`, `Mbit` or `Gbit` (optionally
/// followed by `/s`), e.g. `100Mbit`, `2.5Gbit/s`; in bits per second, more than zero.
pub fn parse_rate_bps(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let t = t.strip_suffix("/s").unwrap_or(t);
    let units: [(&str, f64); 4] = [("kbit", 1e3), ("Mbit", 1e6), ("Gbit", 1e9), ("bit", 1.0)];
    let parsed = units.iter().find_map(|(u, m)| t.strip_suffix(u).map(|n| (n.trim(), *m)));
    match parsed.map(|(n, m)| (n.parse::<f64>(), m)) {
        Some((Ok(v), m)) if v.is_finite() && v * m >= 1.0 && v * m < 1e13 => Ok((v * m) as u64),
        _ => Err(format!("{s:?} is not a rate (like 10Mbit, 1Gbit/s)")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_in_every_unit() {
        for (s, b) in
            [("1500", 1500), ("150KB", 150_000), ("1.5MB", 1_500_000), ("2GB", 2_000_000_000)]
        {
            assert_eq!(parse_size_bytes(s), Ok(b), "{s}");
        }
        assert_eq!(parse_size_bytes("150KiB"), Ok(153_600));
        assert_eq!(parse_size_bytes("150KB"), Ok(150_000));
        for bad in ["", "10ms", "-1KB", "KB", "1e30GB", "KiB"] {
            assert!(parse_size_bytes(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn rates_in_every_unit() {
        for (s, bps) in [("10Mbit", 10_000_000), ("1.5Gbit/s", 1_500_000_000), ("500kbit", 500_000)]
        {
            assert_eq!(parse_rate_bps(s), Ok(bps), "{s}");
        }
        for bad in ["", "10", "10MB", "-1Mbit", "0Mbit", "NaNbit"] {
            assert!(parse_rate_bps(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn durations_in_every_unit() {
        for (s, ns) in [
            ("1s", 1_000_000_000),
            ("250ms", 250_000_000),
            ("20us", 20_000),
            ("500ns", 500),
            ("3", 3_000_000_000),
            ("1.5m", 90_000_000_000),
            ("2h", 7_200_000_000_000),
            ("7d", 604_800_000_000_000),
            ("0", 0),
        ] {
            assert_eq!(parse_duration_ns(s), Ok(ns), "{s}");
        }
        for bad in ["", "x", "-1s", "1e30d", "NaNs", "5 parsecs"] {
            assert!(parse_duration_ns(bad).is_err(), "{bad}");
        }
    }
}
