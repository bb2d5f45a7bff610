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
//! optional. The `id` column is kept as text ([`Trace::ids`]) so a plan can be
//! written back with the ids exactly as they were; [`Buffer::id`] is the id when it
//! is a non-negative integer and the row's position otherwise. A row that cannot
//! be read is an error naming its line (the header is line 1).
//!
//! [`write`] produces the input rows, in input order, with an `offset` column
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
    /// Whether the trace had an `alignment` column (then [`write`] keeps it).
    pub has_alignment: bool,
}

/// Parses a trace from CSV text.
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
    let names: Vec<String> = header
        .trim_start_matches('\u{feff}')
        .split(',')
        .map(|c| c.trim().to_ascii_lowercase())
        .collect();
    let col = |name: &str| names.iter().position(|c| c == name);
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
    for (k, row) in lines {
        let line = k + 1;
        let err = |message: String| PlanError::Csv { line, message };
        let fields: Vec<&str> = row.split(',').map(str::trim).collect();
        if fields.len() != names.len() {
            return Err(err(format!(
                "expected {} fields, found {}",
                names.len(),
                fields.len()
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

/// Writes [`write`]'s output to a file.
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
}
