//! Reading a model's `config.json`: the top-level object and its typed fields, with
//! errors that name the field (what every family's config parser needs).

use serde_json::{Map, Value};

/// The top-level object of the JSON text `text`.
pub(super) fn object(text: &str) -> Result<Map<String, Value>, String> {
    match serde_json::from_str(text).map_err(|e| format!("not valid JSON: {e}"))? {
        Value::Object(obj) => Ok(obj),
        _ => Err("expected a JSON object at the top level".to_string()),
    }
}

/// The non-negative integer field `name` of `obj`.
pub(super) fn usize_field(obj: &Map<String, Value>, name: &str) -> Result<usize, String> {
    obj.get(name)
        .ok_or_else(|| format!("missing field `{name}`"))?
        .as_u64()
        .map(|n| n as usize)
        .ok_or_else(|| format!("field `{name}` must be a non-negative integer"))
}

/// An error naming the first of `fields` (name, value) that is 0.
pub(super) fn all_positive(fields: &[(&str, usize)]) -> Result<(), String> {
    match fields.iter().find(|(_, n)| *n == 0) {
        Some((name, _)) => Err(format!("field `{name}` must be positive")),
        None => Ok(()),
    }
}
