//! The counts `sparta plan` reads: ids per table (`--ids embedding=1e9,wide=250M`) and a rate
//! (`--samples-per-sec 2M`).

/// Multiplier of a count's one-letter suffix: K, M, G (or B, a billion), T, powers of 1000,
/// either case.
fn suffix(c: char) -> Option<u64> {
    match c.to_ascii_uppercase() {
        'K' => Some(1_000),
        'M' => Some(1_000_000),
        'G' | 'B' => Some(1_000_000_000),
        'T' => Some(1_000_000_000_000),
        _ => None,
    }
}

/// What a count may be written as, for error messages.
const FORMS: &str =
    "a whole number, in scientific notation (1e9) or with a suffix K, M, G (or B), \
                     T (250M), `_` between digits allowed";

/// Parses an amount: a number (decimals and exponents allowed, `_` between digits), optionally
/// followed by K, M, G or B, T (powers of 1000). Must be finite and above 0.
pub fn parse_amount(text: &str) -> Result<f64, String> {
    let t: String = text.trim().chars().filter(|&c| c != '_').collect();
    let (num, mult) = match t.chars().last().and_then(|c| suffix(c).map(|m| (c, m))) {
        Some((c, m)) => (&t[..t.len() - c.len_utf8()], m),
        None => (t.as_str(), 1),
    };
    let bad = || format!("{text:?} is not a count: expected {FORMS}");
    if num.is_empty() || !num.starts_with(|c: char| c.is_ascii_digit() || c == '.') {
        return Err(bad());
    }
    // Whole numbers exactly (an f64 holds integers exactly only up to 2^53).
    if num.bytes().all(|b| b.is_ascii_digit()) {
        let n: u64 = num.parse().map_err(|_| format!("{text:?} is too large"))?;
        let v = n
            .checked_mul(mult)
            .ok_or_else(|| format!("{text:?} is too large"))?;
        if v == 0 {
            return Err(format!("{text:?} must be above 0"));
        }
        return Ok(v as f64);
    }
    let n: f64 = num.parse().map_err(|_| bad())?;
    let v = n * mult as f64;
    if !v.is_finite() {
        return Err(bad());
    }
    if v <= 0.0 {
        return Err(format!("{text:?} must be above 0"));
    }
    Ok(v)
}

/// Parses a count of ids: an amount ([`parse_amount`]) that is a whole number of at least 1.
pub fn parse_count(text: &str) -> Result<u64, String> {
    let t: String = text.trim().chars().filter(|&c| c != '_').collect();
    let digits = t.trim_end_matches(|c: char| suffix(c).is_some());
    if !digits.is_empty()
        && digits.len() + 1 >= t.len()
        && digits.bytes().all(|b| b.is_ascii_digit())
    {
        // Exact for every u64 (parse_amount returns an f64).
        let n: u64 = digits
            .parse()
            .map_err(|_| format!("{text:?} is too large"))?;
        let mult = t[digits.len()..]
            .chars()
            .next()
            .and_then(suffix)
            .unwrap_or(1);
        return match n.checked_mul(mult) {
            Some(0) => Err(format!("{text:?} must be above 0")),
            Some(v) => Ok(v),
            None => Err(format!("{text:?} is too large")),
        };
    }
    let v = parse_amount(text)?;
    if v.fract() != 0.0 {
        return Err(format!("{text:?} is not a whole number of ids"));
    }
    if v >= u64::MAX as f64 {
        return Err(format!("{text:?} is too large"));
    }
    Ok(v as u64)
}

/// Parses one `TABLE=COUNT` of `--ids`.
pub fn parse_table_ids(text: &str) -> Result<(String, u64), String> {
    let (name, count) = text
        .split_once('=')
        .ok_or_else(|| format!("{text:?}: expected TABLE=COUNT, e.g. embedding=1e9"))?;
    let name = name.trim();
    if name.is_empty() {
        return Err(format!("{text:?}: no table name before `=`"));
    }
    Ok((name.to_string(), parse_count(count)?))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn counts_read_plain_scientific_and_suffixed_forms() {
        assert_eq!(parse_count("1000"), Ok(1000));
        assert_eq!(parse_count("1e9"), Ok(1_000_000_000));
        assert_eq!(parse_count("2.5e8"), Ok(250_000_000));
        assert_eq!(parse_count("250M"), Ok(250_000_000));
        assert_eq!(parse_count("250m"), Ok(250_000_000));
        assert_eq!(parse_count("2G"), Ok(2_000_000_000));
        assert_eq!(parse_count("3B"), Ok(3_000_000_000));
        assert_eq!(parse_count("1.5K"), Ok(1500));
        assert_eq!(parse_count("4T"), Ok(4_000_000_000_000));
        assert_eq!(parse_count("1_000_000"), Ok(1_000_000));
        assert_eq!(parse_count(" 7 "), Ok(7));
        assert_eq!(parse_count("18446744073709551615"), Ok(u64::MAX));
    }

    #[test]
    fn counts_refuse_zero_fractions_negatives_and_words() {
        for bad in [
            "0",
            "0M",
            "0.0",
            "1.5",
            "0.0005K",
            "-3",
            "-1e3",
            "",
            "M",
            "abc",
            "1e999",
            "nan",
            "inf",
            "12X",
            "1e9e3",
            "18446744073709551616",
            "20000000000T",
            ".",
        ] {
            assert!(parse_count(bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn rates_may_be_fractional_but_not_zero() {
        assert_eq!(parse_amount("0.5"), Ok(0.5));
        assert_eq!(parse_amount("1.5M"), Ok(1_500_000.0));
        assert!(parse_amount("0").is_err());
        assert!(parse_amount("-2").is_err());
    }

    #[test]
    fn table_ids_name_a_table_and_a_count() {
        assert_eq!(
            parse_table_ids("embedding.1=2G"),
            Ok(("embedding.1".into(), 2_000_000_000))
        );
        assert!(parse_table_ids("embedding").is_err());
        assert!(parse_table_ids("=5").is_err());
        assert!(parse_table_ids("wide=").is_err());
    }

    proptest! {
        #[test]
        fn every_whole_number_reads_back_plain_and_with_each_suffix(n in 1u64..=u64::MAX / 1_000_000_000_000) {
            prop_assert_eq!(parse_count(&n.to_string()), Ok(n));
            for (s, m) in [("K", 1_000), ("M", 1_000_000), ("G", 1_000_000_000), ("T", 1_000_000_000_000)] {
                prop_assert_eq!(parse_count(&format!("{n}{s}")), Ok(n * m));
            }
        }

        #[test]
        fn scientific_notation_reads_as_its_value(m in 1u64..10_000, e in 0u32..10) {
            prop_assert_eq!(parse_count(&format!("{m}e{e}")), Ok(m * 10u64.pow(e)));
        }

        #[test]
        fn no_text_panics_the_parser(t in "\\PC{0,12}") {
            let _ = parse_count(&t);
            let _ = parse_table_ids(&t);
        }
    }
}
