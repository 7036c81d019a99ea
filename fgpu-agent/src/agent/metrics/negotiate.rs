//! Which format a scrape gets, from its `Accept` header (RFC 9110, section 12.5.1): the
//! media ranges with their `q` weights, the most specific range that matches a format
//! giving that format's weight (`application/openmetrics-text;version=1.0.0` before
//! `application/openmetrics-text` before `application/*` before `*/*`).
//!
//! - OpenMetrics 1.0.0 matches `application/openmetrics-text` without a version or with
//!   `version=1.0.0` (the one prometheus-client writes; `version=0.0.1` does not match);
//! - the classic text format matches `text/plain` without a version or with `version=0.0.4`
//!   (or `1.0.0`, the text format with UTF-8 names, of which 0.0.4 with our legacy names is
//!   a valid instance).
//!
//! The heavier format wins; on a tie the more specific match, then the range written first,
//! then the classic format. No header, `*/*` (curl, browsers) or no acceptable format at all
//! gets the classic one, as the Go client answers.
//!
//! Prometheus 2.5 to 2.48 sends `application/openmetrics-text;version=1.0.0,
//! application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1`
//! (OpenMetrics); from 2.49 the header follows `scrape_protocols`, for instance
//! `text/plain;version=0.0.4;q=0.6,*/*;q=0.5` for `[PrometheusText0.0.4]` (classic).

use super::classic;

/// What `/metrics` answers with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    OpenMetrics,
    Classic,
}

pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

impl Format {
    pub fn content_type(self) -> &'static str {
        match self {
            Format::OpenMetrics => OPENMETRICS,
            Format::Classic => classic::CONTENT_TYPE,
        }
    }
}

/// Media ranges read from one header at most (a request head is at most 16 KiB anyway).
const MAX_RANGES: usize = 64;

/// The format for a request whose `Accept` header(s), joined by commas, say `accept`.
pub fn negotiate(accept: Option<&str>) -> Format {
    let Some(accept) = accept else {
        return Format::Classic;
    };
    let ranges: Vec<Range> = accept
        .split(',')
        .take(MAX_RANGES)
        .filter_map(Range::parse)
        .collect();
    // (weight, specificity, earlier-in-header) of each acceptable format, classic first so
    // that it wins a full tie.
    let mut best: Option<((u16, u8, usize), Format)> = None;
    for format in [Format::Classic, Format::OpenMetrics] {
        let Some((spec, pos, q)) = ranges
            .iter()
            .enumerate()
            .filter_map(|(i, r)| r.matches(format).map(|spec| (spec, i, r.q)))
            // The most specific range decides; among equally specific ones, the first.
            .min_by_key(|&(spec, i, _)| (u8::MAX - spec, i))
        else {
            continue;
        };
        if q == 0 {
            continue;
        }
        let key = (q, spec, usize::MAX - pos);
        if best.is_none_or(|(k, _)| key > k) {
            best = Some((key, format));
        }
    }
    best.map_or(Format::Classic, |(_, f)| f)
}

/// One media range of an `Accept` header.
#[derive(Debug, PartialEq)]
struct Range {
    kind: String,
    subtype: String,
    version: Option<String>,
    /// Thousandths (RFC 9110 allows three decimals).
    q: u16,
}

impl Range {
    /// `None` for what is not a media range (it is ignored, as the Go client does).
    fn parse(text: &str) -> Option<Range> {
        let mut parts = text.split(';');
        let (kind, subtype) = parts.next()?.trim().split_once('/')?;
        let (kind, subtype) = (kind.trim(), subtype.trim());
        let token = |s: &str| !s.is_empty() && !s.contains(char::is_whitespace);
        if !token(kind) || !token(subtype) || (kind == "*" && subtype != "*") {
            return None;
        }
        let mut range = Range {
            kind: kind.to_ascii_lowercase(),
            subtype: subtype.to_ascii_lowercase(),
            version: None,
            q: 1000,
        };
        for param in parts {
            let (name, value) = param.split_once('=')?;
            let name = name.trim().to_ascii_lowercase();
            let value = value.trim();
            let value = value
                .strip_prefix('"')
                .and_then(|v| v.strip_suffix('"'))
                .unwrap_or(value);
            match name.as_str() {
                "q" => {
                    range.q = weight(value)?;
                    // What follows the weight are accept extensions, not media type parameters.
                    break;
                }
                "version" => range.version = Some(value.to_string()),
                _ => {}
            }
        }
        Some(range)
    }

    /// How specifically the range names `format` (3: type, subtype and version; 2: type and
    /// subtype; 1: `type/*`; 0: `*/*`), `None` if it does not.
    fn matches(&self, format: Format) -> Option<u8> {
        let (kind, subtype, versions): (&str, &str, &[&str]) = match format {
            Format::OpenMetrics => ("application", "openmetrics-text", &["1.0.0"]),
            Format::Classic => ("text", "plain", &["0.0.4", "1.0.0"]),
        };
        match (self.kind.as_str(), self.subtype.as_str()) {
            ("*", "*") => Some(0),
            (k, "*") if k == kind => Some(1),
            (k, s) if k == kind && s == subtype => match &self.version {
                None => Some(2),
                Some(v) if versions.contains(&v.as_str()) => Some(3),
                Some(_) => None,
            },
            _ => None,
        }
    }
}

/// A `q` value in thousandths: `0` to `1` with at most three decimals.
fn weight(value: &str) -> Option<u16> {
    let (int, frac) = value.split_once('.').unwrap_or((value, ""));
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if !(int == "0" || int == "1") || frac.len() > 3 || !digits(frac) {
        return None;
    }
    let frac: u16 = format!("{frac:0<3}").parse().ok()?;
    let q = if int == "1" { 1000 + frac } else { frac };
    (q <= 1000).then_some(q)
}

#[cfg(test)]
mod tests {
    use super::Format::{Classic, OpenMetrics};
    use super::*;

    #[test]
    fn prometheus_servers_get_what_they_ask_for_first() {
        // Prometheus 2.5 to 2.48 (Debian 12 has 2.42).
        let v2 = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        assert_eq!(negotiate(Some(v2)), OpenMetrics);
        // 2.49 and later, default scrape_protocols.
        let v249 = "application/openmetrics-text;version=1.0.0;q=0.5,application/openmetrics-text;version=0.0.1;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2";
        assert_eq!(negotiate(Some(v249)), OpenMetrics);
        // 3.x defaults: UTF-8 escaping parameters, protobuf first.
        let v3 = "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0.6,application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.5,application/openmetrics-text;version=0.0.1;q=0.4,text/plain;version=1.0.0;escaping=allow-utf-8;q=0.3,text/plain;version=0.0.4;q=0.2,*/*;q=0.1";
        assert_eq!(negotiate(Some(v3)), OpenMetrics);
        // scrape_protocols: [PrometheusText0.0.4] and [PrometheusText1.0.0].
        assert_eq!(
            negotiate(Some("text/plain;version=0.0.4;q=0.6,*/*;q=0.5")),
            Classic
        );
        assert_eq!(
            negotiate(Some(
                "text/plain;version=1.0.0;escaping=allow-utf-8;q=0.6,*/*;q=0.5"
            )),
            Classic
        );
        // [OpenMetricsText0.0.1] only: not what we write; the wildcard gets classic.
        assert_eq!(
            negotiate(Some(
                "application/openmetrics-text;version=0.0.1;q=0.6,*/*;q=0.5"
            )),
            Classic
        );
    }

    #[test]
    fn curl_browsers_and_no_header_get_the_classic_format() {
        assert_eq!(negotiate(None), Classic);
        assert_eq!(negotiate(Some("*/*")), Classic);
        assert_eq!(negotiate(Some("")), Classic);
        let firefox = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8";
        assert_eq!(negotiate(Some(firefox)), Classic);
        assert_eq!(negotiate(Some("text/*")), Classic);
        assert_eq!(negotiate(Some("application/json")), Classic, "nothing fits");
    }

    #[test]
    fn weights_and_specificity_decide() {
        assert_eq!(negotiate(Some("application/openmetrics-text")), OpenMetrics);
        assert_eq!(negotiate(Some("application/*")), OpenMetrics);
        assert_eq!(
            negotiate(Some("text/plain;q=0.4, application/openmetrics-text;q=0.5")),
            OpenMetrics
        );
        assert_eq!(
            negotiate(Some("text/plain;q=0.5, application/openmetrics-text;q=0.4")),
            Classic
        );
        // A tie: the explicit range beats the wildcard, then the first written wins.
        assert_eq!(
            negotiate(Some("*/*, application/openmetrics-text")),
            OpenMetrics
        );
        assert_eq!(
            negotiate(Some("application/openmetrics-text, text/plain")),
            OpenMetrics
        );
        assert_eq!(
            negotiate(Some("text/plain, application/openmetrics-text")),
            Classic
        );
        // q=0 refuses, and the most specific range says it even under a wildcard.
        assert_eq!(negotiate(Some("*/*, text/plain;q=0")), OpenMetrics);
        assert_eq!(
            negotiate(Some(
                "application/*;q=0.9, application/openmetrics-text;q=0"
            )),
            Classic
        );
        // Case, spaces and quoted parameter values.
        assert_eq!(
            negotiate(Some(
                " Application/OpenMetrics-Text ; Version=\"1.0.0\" ; Q=0.7 , text/plain;q=0.6"
            )),
            OpenMetrics
        );
    }

    #[test]
    fn malformed_ranges_are_ignored() {
        for bad in [
            "application/openmetrics-text;q=2",
            "application/openmetrics-text;q=0.5x",
            "application/openmetrics-text;q=0.1234",
            "openmetrics",
            "*/openmetrics-text",
            "application/openmetrics-text;version",
        ] {
            assert_eq!(Range::parse(bad), None, "{bad}");
            assert_eq!(
                negotiate(Some(&format!("{bad},text/plain;q=0.1"))),
                Classic,
                "{bad}"
            );
        }
        // Only the first 64 ranges are read.
        let many = format!("{}application/openmetrics-text", "x/y;q=0.1,".repeat(64));
        assert_eq!(negotiate(Some(&many)), Classic);
    }

    #[test]
    fn weights_parse_as_rfc_9110_says() {
        for (text, q) in [
            ("1", 1000),
            ("1.000", 1000),
            ("0", 0),
            ("0.5", 500),
            ("0.25", 250),
            ("0.001", 1),
            ("1.", 1000),
            ("0.", 0),
        ] {
            assert_eq!(weight(text), Some(q), "{text}");
        }
        for text in ["1.001", "2", "-0.5", "", ".5", "0.1234", "0,5"] {
            assert_eq!(weight(text), None, "{text}");
        }
        assert_eq!(
            Format::Classic.content_type(),
            "text/plain; version=0.0.4; charset=utf-8"
        );
    }
}
