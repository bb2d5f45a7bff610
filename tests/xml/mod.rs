//! A small XML well-formedness checker for the tests of SVG pictures (no dependency):
//! one root element, every start tag closed in order, attributes quoted and unique,
//! only the five predefined entities and character references, no `<` or bare `&` in
//! text or attribute values. It returns the elements with their attributes and text,
//! so a test can look inside.
#![allow(dead_code)]

/// One element of a document.
#[derive(Debug, Clone)]
pub struct Element {
    pub name: String,
    pub attrs: Vec<(String, String)>,
    /// Its own text (entities decoded), not its children's.
    pub text: String,
    pub parent: Option<usize>,
}

impl Element {
    pub fn attr(&self, name: &str) -> Option<&str> {
        self.attrs
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

fn name_ok(n: &str) -> bool {
    let mut cs = n.chars();
    matches!(cs.next(), Some(c) if c.is_alphabetic() || c == '_' || c == ':')
        && cs.all(|c| c.is_alphanumeric() || matches!(c, '_' | ':' | '-' | '.'))
}

fn decode(s: &str, at: usize) -> Result<String, String> {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find(['&', '<']) {
        out.push_str(&rest[..i]);
        if rest.as_bytes()[i] == b'<' {
            return Err(format!("'<' in text or a value near byte {at}"));
        }
        let end = rest[i..]
            .find(';')
            .ok_or(format!("unterminated entity near byte {at}"))?;
        let ent = &rest[i + 1..i + end];
        let ch = match ent {
            "amp" => '&',
            "lt" => '<',
            "gt" => '>',
            "quot" => '"',
            "apos" => '\'',
            e if e.starts_with("#x") => u32::from_str_radix(&e[2..], 16)
                .ok()
                .and_then(char::from_u32)
                .ok_or(format!("bad character reference &{e}; near byte {at}"))?,
            e if e.starts_with('#') => e[1..]
                .parse::<u32>()
                .ok()
                .and_then(char::from_u32)
                .ok_or(format!("bad character reference &{e}; near byte {at}"))?,
            e => return Err(format!("unknown entity &{e}; near byte {at}")),
        };
        out.push(ch);
        rest = &rest[i + end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// Parses `doc`, or says what is wrong with it and where.
pub fn parse(doc: &str) -> Result<Vec<Element>, String> {
    let mut els: Vec<Element> = Vec::new();
    let mut open: Vec<usize> = Vec::new();
    let mut roots = 0;
    let mut i = 0;
    let b = doc.as_bytes();
    if doc.starts_with("<?xml") {
        i = doc.find("?>").ok_or("unterminated XML declaration")? + 2;
    }
    while i < b.len() {
        if b[i] != b'<' {
            let end = doc[i..].find('<').map_or(b.len(), |k| i + k);
            let text = decode(&doc[i..end], i)?;
            match open.last() {
                Some(&e) => els[e].text.push_str(&text),
                None if text.trim().is_empty() => {}
                None => return Err(format!("text outside the root at byte {i}")),
            }
            i = end;
            continue;
        }
        if doc[i..].starts_with("<!--") {
            i += doc[i..].find("-->").ok_or("unterminated comment")? + 3;
            continue;
        }
        if doc[i..].starts_with("<![CDATA[") {
            let end = doc[i..].find("]]>").ok_or("unterminated CDATA")?;
            if let Some(&e) = open.last() {
                els[e].text.push_str(&doc[i + 9..i + end]);
            }
            i += end + 3;
            continue;
        }
        let end = i + doc[i..]
            .find('>')
            .ok_or(format!("unterminated tag at byte {i}"))?;
        let tag = &doc[i + 1..end];
        if let Some(name) = tag.strip_prefix('/') {
            let e = open
                .pop()
                .ok_or(format!("</{name}> closes nothing at byte {i}"))?;
            if els[e].name != name.trim() {
                return Err(format!("</{name}> closes <{}> at byte {i}", els[e].name));
            }
        } else {
            let (body, empty) = match tag.strip_suffix('/') {
                Some(t) => (t, true),
                None => (tag, false),
            };
            let name_end = body.find(char::is_whitespace).unwrap_or(body.len());
            let name = &body[..name_end];
            if !name_ok(name) {
                return Err(format!("bad element name {name:?} at byte {i}"));
            }
            let mut attrs: Vec<(String, String)> = Vec::new();
            let mut rest = body[name_end..].trim_start();
            while !rest.is_empty() {
                let eq = rest
                    .find('=')
                    .ok_or(format!("attribute without value in <{name}> at byte {i}"))?;
                let an = rest[..eq].trim();
                if !name_ok(an) {
                    return Err(format!("bad attribute name {an:?} at byte {i}"));
                }
                let after = rest[eq + 1..].trim_start();
                let q = after.chars().next().filter(|&c| c == '"' || c == '\'');
                let q = q.ok_or(format!("unquoted attribute {an} at byte {i}"))?;
                let close = after[1..]
                    .find(q)
                    .ok_or(format!("unterminated attribute {an} at byte {i}"))?;
                let value = decode(&after[1..1 + close], i)?;
                if attrs.iter().any(|(n, _)| n == an) {
                    return Err(format!("attribute {an} twice at byte {i}"));
                }
                attrs.push((an.to_string(), value));
                rest = after[close + 2..].trim_start();
            }
            if open.is_empty() {
                roots += 1;
                if roots > 1 {
                    return Err(format!("a second root element at byte {i}"));
                }
            }
            els.push(Element {
                name: name.to_string(),
                attrs,
                text: String::new(),
                parent: open.last().copied(),
            });
            if !empty {
                open.push(els.len() - 1);
            }
        }
        i = end + 1;
    }
    if let Some(&e) = open.last() {
        return Err(format!("<{}> is never closed", els[e].name));
    }
    if roots != 1 {
        return Err("no root element".into());
    }
    Ok(els)
}

#[test]
fn the_checker_tells_good_from_bad() {
    assert!(parse("<?xml version=\"1.0\"?>\n<a x=\"1\"><b>t &amp; u</b><c/></a>\n").is_ok());
    for bad in [
        "<a><b></a></b>",
        "<a x=1></a>",
        "<a>&nbsp;</a>",
        "<a>1 < 2</a>",
        "<a></a><b></b>",
        "<a x=\"1\" x=\"2\"/>",
        "<a>",
    ] {
        assert!(parse(bad).is_err(), "{bad}");
    }
}
