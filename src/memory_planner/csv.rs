//! Reading and writing traces in the MiniMalloc CSV format.
//!
//! A trace is a header and one buffer a row:
//!
//! ```text
//! id,lower,upper,size[,alignment][,offset]
//! b1,0,3,4
//! ```
//!
//! Columns may come in any order; `alignment` (default 1) and `offset` are
//! optional. A header that names a column twice, or a column not listed above,
//! is an error naming that column. The `id` column is kept as text ([`Trace::ids`]) so a plan can be
//! written back with the ids exactly as they were; [`Buffer::id`] is the id when it
//! is a non-negative integer and the row's position otherwise. A row that cannot
//! be read is an error naming its line (the header is line 1).
//!
//! [`write()`] produces the input rows, in input order, with an `offset` column
//! added (or replaced).

use std::fmt::Write as _;

use super::error::PlanError;
use super::problem::{Buffer, Problem};

/// A trace read from CSV.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Trace {
    /// The buffers, one per row, in row order (no aliases or in-place pairs: the
    /// format has none).
    pub problem: Problem,
    /// The `id` column of every row, as written.
    pub ids: Vec<String>,
    /// The `offset` column, if the trace had one (a plan written earlier).
    pub offsets: Option<Vec<u64>>,
    /// Whether the trace had an `alignment` column (then [`write()`] keeps it).
    pub has_alignment: bool,
}

/// The columns a trace may have, in the order [`write()`] puts them.
const COLUMNS: [&str; 6] = ["id", "lower", "upper", "size", "alignment", "offset"];

/// The column names of a header line (lower case, trimmed), each one of
/// [`COLUMNS`]. A name that is not, or that comes twice, is an error naming it:
/// silently keeping one of two `size` columns would plan the wrong trace.
fn header_columns(header: &str) -> Result<Vec<&'static str>, String> {
    let mut names: Vec<&'static str> = Vec::new();
    for raw in header.trim_start_matches('\u{feff}').split(',') {
        let name = raw.trim().to_ascii_lowercase();
        let Some(&known) = COLUMNS.iter().find(|&&c| c == name) else {
            return Err(format!(
                "header names an unknown column {:?} (the columns are {})",
                raw.trim(),
                COLUMNS.join(", ")
            ));
        };
        if names.contains(&known) {
            return Err(format!("header names the column {known:?} twice"));
        }
        names.push(known);
    }
    Ok(names)
}

/// Parses a trace from CSV text.
///
/// The header must name each of `id`, `lower`, `upper` and `size` once, and may
/// name `alignment` and `offset`; any other column, or any column named twice,
/// is an error naming it.
pub fn read(text: &str) -> Result<Trace, PlanError> {
    let mut lines = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty());
    let Some((h, header)) = lines.next() else {
        return Err(PlanError::Csv {
            line: 1,
            message: "empty input: expected a header `id,lower,upper,size`".into(),
        });
    };
    let names = header_columns(header).map_err(|message| PlanError::Csv {
        line: h + 1,
        message,
    })?;
    let col = |name: &str| names.iter().position(|&c| c == name);
    let (Some(c_id), Some(c_lo), Some(c_up), Some(c_size)) =
        (col("id"), col("lower"), col("upper"), col("size"))
    else {
        return Err(PlanError::Csv {
            line: h + 1,
            message: format!(
                "header {header:?} must name the columns id, lower, upper and size (alignment and offset are optional)"
            ),
        });
    };
    let (c_align, c_off) = (col("alignment"), col("offset"));
    let mut trace = Trace {
        has_alignment: c_align.is_some(),
        offsets: c_off.map(|_| Vec::new()),
        ..Trace::default()
    };
    // Every column is known and named once, so a row has at most COLUMNS fields.
    let mut fields = [""; COLUMNS.len()];
    for (k, row) in lines {
        let line = k + 1;
        let err = |message: String| PlanError::Csv { line, message };
        let mut found = 0;
        for f in row.split(',') {
            if found < names.len() {
                fields[found] = f.trim();
            }
            found += 1;
        }
        if found != names.len() {
            return Err(err(format!(
                "expected {} fields, found {found}",
                names.len()
            )));
        }
        let num = |c: usize| -> Result<u64, PlanError> {
            fields[c].parse::<u64>().map_err(|_| {
                err(format!(
                    "{} {:?} is not a non-negative integer that fits in 64 bits",
                    names[c], fields[c]
                ))
            })
        };
        let (lower, upper, size) = (num(c_lo)?, num(c_up)?, num(c_size)?);
        let alignment = match c_align {
            Some(c) => num(c)?,
            None => 1,
        };
        if upper <= lower {
            return Err(err(format!(
                "buffer {}: upper {upper} must be greater than lower {lower}",
                fields[c_id]
            )));
        }
        if size == 0 {
            return Err(err(format!("buffer {}: size is zero", fields[c_id])));
        }
        if alignment == 0 {
            return Err(err(format!("buffer {}: alignment is zero", fields[c_id])));
        }
        if let (Some(c), Some(offs)) = (c_off, trace.offsets.as_mut()) {
            offs.push(num(c)?);
        }
        let id_text = fields[c_id].to_string();
        let id = id_text
            .parse::<usize>()
            .unwrap_or(trace.problem.buffers.len());
        trace.problem.buffers.push(Buffer {
            id,
            lower,
            upper,
            size,
            alignment,
        });
        trace.ids.push(id_text);
    }
    Ok(trace)
}

/// Reads a trace from a file.
pub fn read_file(path: impl AsRef<std::path::Path>) -> Result<Trace, PlanError> {
    let path = path.as_ref();
    let text = std::fs::read_to_string(path).map_err(|e| PlanError::Io {
        path: path.display().to_string(),
        message: e.to_string(),
    })?;
    read(&text)
}

/// The rows of `trace` in input order with an `offset` column holding `offsets`
/// (one per row).
pub fn write(trace: &Trace, offsets: &[u64]) -> String {
    let mut out = String::with_capacity(32 * (trace.ids.len() + 1));
    out.push_str(if trace.has_alignment {
        "id,lower,upper,size,alignment,offset\n"
    } else {
        "id,lower,upper,size,offset\n"
    });
    for ((id, b), off) in trace.ids.iter().zip(&trace.problem.buffers).zip(offsets) {
        let _ = write!(out, "{id},{},{},{}", b.lower, b.upper, b.size);
        if trace.has_alignment {
            let _ = write!(out, ",{}", b.alignment);
        }
        let _ = writeln!(out, ",{off}");
    }
    out
}

/// Writes [`write()`]'s output to a file.
pub fn write_file(
    path: impl AsRef<std::path::Path>,
    trace: &Trace,
    offsets: &[u64],
) -> Result<(), PlanError> {
    let path = path.as_ref();
    std::fs::write(path, write(trace, offsets)).map_err(|e| PlanError::Io {
        path: path.display().to_string(),
        message: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_minimalloc_format_with_text_ids() {
        let t = read("id,lower,upper,size\nb1,0,3,4\nb2,3,9,4\n").unwrap();
        assert_eq!(t.ids, vec!["b1", "b2"]);
        assert_eq!(
            t.problem.buffers[1],
            Buffer {
                id: 1,
                lower: 3,
                upper: 9,
                size: 4,
                alignment: 1
            }
        );
        assert_eq!(
            write(&t, &[0, 4]),
            "id,lower,upper,size,offset\nb1,0,3,4,0\nb2,3,9,4,4\n"
        );
    }

    #[test]
    fn columns_in_any_order_and_optional_alignment() {
        let t = read("size,id,upper,lower,alignment\r\n8,17,5,1,16\r\n").unwrap();
        assert_eq!(
            t.problem.buffers[0],
            Buffer {
                id: 17,
                lower: 1,
                upper: 5,
                size: 8,
                alignment: 16
            }
        );
        assert!(t.has_alignment);
    }

    #[test]
    fn bad_rows_name_their_line() {
        let e = read("id,lower,upper,size\n0,0,3,4\n1,5,5,4\n").unwrap_err();
        assert_eq!(
            e.to_string(),
            "line 3: buffer 1: upper 5 must be greater than lower 5"
        );
        let e = read("id,lower,upper,size\n0,0,3,x\n").unwrap_err();
        assert!(e.to_string().starts_with("line 2:"), "{e}");
        let e = read("id,lower,upper,size\n0,0,3\n").unwrap_err();
        assert!(e.to_string().starts_with("line 2:"), "{e}");
        let e = read("id,lower,upper,size\n0,0,3,0\n").unwrap_err();
        assert!(e.to_string().contains("size is zero"), "{e}");
        let e = read("id,start,end,size\n").unwrap_err();
        assert!(e.to_string().starts_with("line 1:"), "{e}");
        let e = read("id,lower,upper,size\n0,0,3,99999999999999999999\n").unwrap_err();
        assert!(e.to_string().contains("64 bits"), "{e}");
    }

    #[test]
    fn repeated_or_unknown_columns_are_errors_naming_them() {
        // A second `size` used to be dropped silently (the first one won).
        let e = read("id,lower,upper,size,size\n0,0,3,4,8\n").unwrap_err();
        assert_eq!(
            e.to_string(),
            "line 1: header names the column \"size\" twice"
        );
        let e = read("ID,lower,upper,size,id\n").unwrap_err();
        assert!(e.to_string().contains("\"id\" twice"), "{e}");
        let e = read("id,lower,upper,size,colour\n0,0,3,4,red\n").unwrap_err();
        assert!(matches!(e, PlanError::Csv { line: 1, .. }), "{e:?}");
        assert!(e.to_string().contains("unknown column \"colour\""), "{e}");
        let e = read("id,lower,upper,size,\n0,0,3,4,\n").unwrap_err();
        assert!(e.to_string().contains("unknown column \"\""), "{e}");
    }
}
