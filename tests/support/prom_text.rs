//! A strict parser of Prometheus' text exposition format (version 0.0.4), for the
//! tests that read the server's `/metrics`. Written here rather than taken from a
//! crate: the parsers on crates.io (`prometheus-parse`) are lenient (they skip what
//! they do not understand) and bring chrono, regex and itertools; this one is a page,
//! and fails on anything malformed, which is what a test of the format wants.
//!
//! It checks: every line is a `# HELP`, a `# TYPE`, another comment, blank, or a
//! sample `name{label="value",...} value [timestamp]` with well-formed names, quoted
//! and escaped label values and a float value (`+Inf`, `-Inf`, `NaN` included); each
//! sample belongs to a family whose `# TYPE` came first (a histogram's samples are its
//! `_bucket`, `_sum` and `_count`); no series appears twice; a histogram's buckets
//! have an `le` label, are cumulative, and its `+Inf` bucket equals its `_count`.
#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap, HashSet};

/// One sample: its name, labels and value.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// A parsed exposition: the samples in order, and each family's type.
#[derive(Debug, Default)]
pub struct Exposition {
    pub samples: Vec<Sample>,
    pub types: HashMap<String, String>,
}

impl Exposition {
    /// The value of the series `name` whose labels include `labels`; `None` when no
    /// series matches, a panic when several do.
    pub fn get(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let has = |s: &&Sample| {
            labels
                .iter()
                .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        };
        let found: Vec<f64> = self
            .samples
            .iter()
            .filter(|s| s.name == name)
            .filter(has)
            .map(|s| s.value)
            .collect();
        assert!(
            found.len() <= 1,
            "{name} {labels:?} matches {} series",
            found.len()
        );
        found.first().copied()
    }
}

fn is_name(s: &str, colon: bool) -> bool {
    let mut chars = s.chars();
    let ok_first = |c: char| c.is_ascii_alphabetic() || c == '_' || (colon && c == ':');
    chars.next().is_some_and(ok_first) && chars.all(|c| ok_first(c) || c.is_ascii_digit())
}

fn number(s: &str) -> Result<f64, String> {
    match s {
        "+Inf" | "Inf" => Ok(f64::INFINITY),
        "-Inf" => Ok(f64::NEG_INFINITY),
        "NaN" => Ok(f64::NAN),
        _ => s.parse().map_err(|_| format!("`{s}` is not a number")),
    }
}

/// The labels of `{...}` (`s` starts after the brace); returns them and the rest after
/// the closing brace.
fn labels(mut s: &str) -> Result<(BTreeMap<String, String>, &str), String> {
    let mut out = BTreeMap::new();
    loop {
        if let Some(rest) = s.strip_prefix('}') {
            return Ok((out, rest));
        }
        let eq = s.find('=').ok_or("a label without `=`")?;
        let name = &s[..eq];
        if !is_name(name, false) {
            return Err(format!("bad label name `{name}`"));
        }
        s = s[eq + 1..]
            .strip_prefix('"')
            .ok_or("a label value must be quoted")?;
        let mut value = String::new();
        let mut chars = s.char_indices();
        let end = loop {
            match chars.next() {
                None => return Err("an unterminated label value".into()),
                Some((i, '"')) => break i,
                Some((_, '\\')) => match chars.next() {
                    Some((_, '\\')) => value.push('\\'),
                    Some((_, '"')) => value.push('"'),
                    Some((_, 'n')) => value.push('\n'),
                    other => return Err(format!("bad escape {other:?}")),
                },
                Some((_, c)) => value.push(c),
            }
        };
        if out.insert(name.to_string(), value).is_some() {
            return Err(format!("label `{name}` twice"));
        }
        s = &s[end + 1..];
        s = s.strip_prefix(',').unwrap_or(s);
    }
}

/// The family a sample named `name` belongs to, given the declared types.
fn family<'a>(name: &'a str, types: &HashMap<String, String>) -> Option<&'a str> {
    if types.contains_key(name) {
        return Some(name);
    }
    ["_bucket", "_sum", "_count"].iter().find_map(|suffix| {
        let base = name.strip_suffix(suffix)?;
        matches!(
            types.get(base).map(String::as_str),
            Some("histogram" | "summary")
        )
        .then_some(base)
    })
}

/// Parses `text`, or says which line is wrong and why.
pub fn parse(text: &str) -> Result<Exposition, String> {
    let mut e = Exposition::default();
    let mut seen = HashSet::new();
    for (n, line) in text.lines().enumerate() {
        let at = |msg: String| format!("line {}: {msg}: `{line}`", n + 1);
        if line.trim().is_empty() {
            continue;
        }
        if let Some(comment) = line.strip_prefix('#') {
            let words: Vec<&str> = comment.trim_start().splitn(3, ' ').collect();
            match words.as_slice() {
                ["TYPE", name, kind] => {
                    if !is_name(name, true) {
                        return Err(at("bad metric name".into()));
                    }
                    if !["counter", "gauge", "histogram", "summary", "untyped"].contains(kind) {
                        return Err(at(format!("unknown type `{kind}`")));
                    }
                    if e.types.insert(name.to_string(), kind.to_string()).is_some() {
                        return Err(at("a second TYPE line".into()));
                    }
                }
                ["TYPE", ..] => return Err(at("a TYPE line needs a name and a type".into())),
                ["HELP", name, ..] if !is_name(name, true) => {
                    return Err(at("bad metric name".into()))
                }
                _ => {}
            }
            continue;
        }
        let name_end = line.find(['{', ' ']).ok_or_else(|| at("no value".into()))?;
        let name = &line[..name_end];
        if !is_name(name, true) {
            return Err(at(format!("bad metric name `{name}`")));
        }
        let (labels, rest) = match line[name_end..].strip_prefix('{') {
            Some(inner) => labels(inner).map_err(at)?,
            None => (BTreeMap::new(), &line[name_end..]),
        };
        let fields: Vec<&str> = rest
            .strip_prefix(' ')
            .ok_or_else(|| at("no space before the value".into()))?
            .split(' ')
            .collect();
        let value = match fields.as_slice() {
            [v] => number(v).map_err(at)?,
            [v, ts] => {
                ts.parse::<i64>()
                    .map_err(|_| at(format!("bad timestamp `{ts}`")))?;
                number(v).map_err(at)?
            }
            _ => return Err(at("more than a value and a timestamp".into())),
        };
        if family(name, &e.types).is_none() {
            return Err(at(format!("`{name}` has no TYPE line before it")));
        }
        if name.ends_with("_bucket") && !labels.contains_key("le") {
            return Err(at("a bucket without `le`".into()));
        }
        if !seen.insert((name.to_string(), labels.clone())) {
            return Err(at("a series twice".into()));
        }
        e.samples.push(Sample {
            name: name.to_string(),
            labels,
            value,
        });
    }
    check_histograms(&e)?;
    Ok(e)
}

/// A histogram series' buckets: (`le`, count).
type Buckets = Vec<(f64, f64)>;

/// Each histogram series: cumulative buckets, the `+Inf` one equal to `_count`.
fn check_histograms(e: &Exposition) -> Result<(), String> {
    for (base, _) in e.types.iter().filter(|(_, t)| *t == "histogram") {
        let bucket = format!("{base}_bucket");
        let mut series: BTreeMap<Vec<(String, String)>, Buckets> = BTreeMap::new();
        for s in e.samples.iter().filter(|s| s.name == bucket) {
            let mut key: Vec<(String, String)> = s
                .labels
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            key.retain(|(k, _)| k != "le");
            let le = number(&s.labels["le"])?;
            series.entry(key).or_default().push((le, s.value));
        }
        for (key, mut buckets) in series {
            buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
            if buckets.windows(2).any(|w| w[1].1 < w[0].1) {
                return Err(format!("{base} {key:?}: buckets are not cumulative"));
            }
            let (le, inf) = *buckets.last().expect("one bucket at least");
            let labels: Vec<(&str, &str)> =
                key.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            let count = e.get(&format!("{base}_count"), &labels);
            if le != f64::INFINITY || count != Some(inf) {
                return Err(format!(
                    "{base} {key:?}: the +Inf bucket ({inf}) is not the count ({count:?})"
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_parser_takes_the_format_and_refuses_what_is_not() {
        let good = "# HELP a_total A counter.\n# TYPE a_total counter\n\
                    a_total{route=\"/x\",status=\"200\"} 3\n\
                    # TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_bucket{le=\"+Inf\"} 2\n\
                    h_sum 1.5\nh_count 2\n# TYPE g gauge\ng{q=\"a \\\"b\\\"\"} -1e3 1700000000\n";
        let e = parse(good).unwrap();
        assert_eq!(e.get("a_total", &[("route", "/x")]), Some(3.0));
        assert_eq!(e.get("g", &[("q", "a \"b\"")]), Some(-1000.0));
        assert_eq!(e.types["h"], "histogram");
        for bad in [
            "a_total 3\n",                    // no TYPE
            "# TYPE a counter\na{x=\"1} 3\n", // unterminated value
            "# TYPE a counter\na{x=1} 3\n",   // unquoted value
            "# TYPE a counter\na 3 4 5\n",    // too many fields
            "# TYPE a counter\na three\n",    // not a number
            "# TYPE a counter\na 1\na 2\n",   // a series twice
            "# TYPE a countr\na 1\n",         // unknown type
            "# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\nh_count 1\n",
            "# TYPE h histogram\nh_bucket{le=\"+Inf\"} 2\nh_count 3\n",
            "# TYPE h histogram\nh_bucket 2\n", // no le
        ] {
            assert!(parse(bad).is_err(), "accepted {bad:?}");
        }
    }
}
