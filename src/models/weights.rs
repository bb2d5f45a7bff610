//! Reading a model's weights from a safetensors file, for every family: each tensor
//! checked by name, dtype and shape and converted straight into the layout and
//! precision the forward pass uses ([`WeightReader`]). A folder's file is read one
//! tensor at a time (`WeightReader::open_file`), so loading never holds the whole
//! file beside the model it makes; a file already in memory is read in place.

use std::borrow::Cow;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use safetensors::tensor::Metadata;
use safetensors::{Dtype, SafeTensors};

use super::{ModelError, Precision};
use crate::{DType, Tensor};

/// Says once per precision, in the log, that the tier has no fast product for it and
/// the model keeps its weights' values in f32 instead.
fn warn_slow(p: Precision) {
    use std::sync::atomic::{AtomicU8, Ordering};
    static SAID: AtomicU8 = AtomicU8::new(0);
    let bit = 1u8 << (p as u8);
    if SAID.fetch_or(bit, Ordering::Relaxed) & bit == 0 {
        log::warn!(
            "precision {p}: the CPU tier in use ({}) has no {p} product faster than f32's; \
             keeping the {p} weights' values in f32 and multiplying in f32 (f32's speed \
             and memory)",
            crate::cpu::tier()
        );
    }
}

/// Reads tensors out of a parsed safetensors file and converts them to f32 vectors
/// (also what the other families' loaders read their files with).
pub(in crate::models) struct WeightReader<'a> {
    source: Source<'a>,
    path: &'a Path,
    /// What the matrix weights become.
    precision: Precision,
}

/// Where a reader's tensors come from.
enum Source<'a> {
    /// A whole safetensors file in memory.
    Memory(SafeTensors<'a>),
    /// An open safetensors file whose header is parsed: each tensor's bytes are read
    /// when it is asked for, so loading holds one tensor's bytes at a time, never the
    /// whole file beside the model it makes.
    File {
        file: File,
        /// Where the tensors' data starts (after the length and the header).
        data_start: u64,
        /// Bytes of data the file holds after the header.
        data_len: u64,
        meta: Metadata,
    },
}

/// The little-endian bytes of one tensor in the file, and their dtype.
pub(in crate::models) struct Raw<'a> {
    /// bfloat16 (widened to f32 exactly: a bf16 model loaded in bf16 keeps its values)
    /// or f32.
    bf16: bool,
    data: Cow<'a, [u8]>,
}

impl Raw<'_> {
    /// The values, in f32.
    pub(in crate::models) fn values(&self) -> Box<dyn Iterator<Item = f32> + '_> {
        match self.bf16 {
            false => Box::new(f32s(&self.data)),
            true => Box::new(
                self.data
                    .chunks_exact(2)
                    .map(|c| f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16)),
            ),
        }
    }

    /// Elements `from..to` of it, in f32.
    pub(in crate::models) fn range(
        &self,
        from: usize,
        to: usize,
    ) -> impl Iterator<Item = f32> + '_ {
        self.values().skip(from).take(to - from)
    }
}

impl<'a> WeightReader<'a> {
    /// A reader of the safetensors file `bytes` (`path` names it in errors), making
    /// matrix weights in `precision`.
    pub(in crate::models) fn open(
        bytes: &'a [u8],
        path: &'a Path,
        precision: Precision,
    ) -> std::result::Result<WeightReader<'a>, ModelError> {
        let st = SafeTensors::deserialize(bytes).map_err(|e| ModelError::Format {
            path: path.to_path_buf(),
            msg: format!("not a valid safetensors file: {e:?}"),
        })?;
        Ok(WeightReader {
            source: Source::Memory(st),
            path,
            precision,
        })
    }

    /// A reader of the safetensors file at `path`, making matrix weights in
    /// `precision`: only its header is read now, each tensor when it is asked for.
    pub(in crate::models) fn open_file(
        path: &'a Path,
        precision: Precision,
    ) -> std::result::Result<WeightReader<'a>, ModelError> {
        let io = |error| ModelError::Io {
            path: path.to_path_buf(),
            error,
        };
        let bad = |msg: String| ModelError::Format {
            path: path.to_path_buf(),
            msg: format!("not a valid safetensors file: {msg}"),
        };
        let mut file = File::open(path).map_err(io)?;
        let file_len = file.metadata().map_err(io)?.len();
        let mut n = [0u8; 8];
        file.read_exact(&mut n)
            .map_err(|e| bad(format!("no header length ({e})")))?;
        let n = u64::from_le_bytes(n);
        // safetensors' own bound on a header.
        if n > 100_000_000 || n + 8 > file_len {
            return Err(bad(format!(
                "a header of {n} bytes in a file of {file_len}"
            )));
        }
        let mut header = vec![0u8; n as usize];
        file.read_exact(&mut header).map_err(io)?;
        let meta: Metadata =
            serde_json::from_slice(&header).map_err(|e| bad(format!("header: {e}")))?;
        Ok(WeightReader {
            source: Source::File {
                file,
                data_start: 8 + n,
                data_len: file_len - 8 - n,
                meta,
            },
            path,
            precision,
        })
    }

    /// The precision the reader makes matrix weights in.
    pub(in crate::models) fn precision(&self) -> Precision {
        self.precision
    }

    /// The linear weights `parts` (each `(name, out)`, `[out, inp]` in the file) side
    /// by side as one `[inp, Σ out]` weight in the model's precision, each part
    /// times its `scale`: one product for several projections of the same input.
    pub(in crate::models) fn linears_joined(
        &self,
        parts: &[(&str, usize, f32)],
        inp: usize,
    ) -> std::result::Result<Tensor, ModelError> {
        let cols: usize = parts.iter().map(|p| p.1).sum();
        let mut w = vec![0.0f32; inp * cols];
        let mut first = 0;
        for &(name, out, scale) in parts {
            let dst = Columns {
                data: &mut w,
                cols,
                first,
            };
            self.linear_into(name, [out, inp], scale, dst)?;
            first += out;
        }
        self.weight(w, [inp, cols])
    }

    fn err(&self, msg: String) -> ModelError {
        ModelError::Format {
            path: self.path.to_path_buf(),
            msg,
        }
    }

    /// The raw little-endian bytes of `name` (also tried with a `bert.`, `roberta.`,
    /// `mpnet.` or `model.` prefix),
    /// checked against `shape`: f32 or bf16.
    pub(in crate::models) fn bytes(
        &self,
        name: &str,
        shape: &[usize],
    ) -> std::result::Result<Raw<'a>, ModelError> {
        let names = ["", "bert.", "roberta.", "mpnet.", "model."].map(|p| format!("{p}{name}"));
        let missing = || self.err(format!("weight `{name}` is missing"));
        match &self.source {
            Source::Memory(st) => {
                let view = names
                    .iter()
                    .find_map(|n| st.tensor(n).ok())
                    .ok_or_else(missing)?;
                let bf16 = self.checked(name, view.dtype(), view.shape(), shape)?;
                Ok(Raw {
                    bf16,
                    data: Cow::Borrowed(view.data()),
                })
            }
            Source::File {
                file,
                data_start,
                data_len,
                meta,
            } => {
                let info = names
                    .iter()
                    .find_map(|n| meta.info(n))
                    .ok_or_else(missing)?;
                // Checked before its bytes are read.
                let bf16 = self.checked(name, info.dtype, &info.shape, shape)?;
                let (from, to) = (info.data_offsets.0 as u64, info.data_offsets.1 as u64);
                if to > *data_len {
                    return Err(self.err(format!(
                        "weight `{name}` lies at bytes {from}..{to} of the data, past its end ({data_len})"
                    )));
                }
                let mut buf = vec![0u8; (to - from) as usize];
                let mut f = file;
                f.seek(SeekFrom::Start(data_start + from))
                    .and_then(|_| f.read_exact(&mut buf))
                    .map_err(|error| ModelError::Io {
                        path: self.path.to_path_buf(),
                        error,
                    })?;
                Ok(Raw {
                    bf16,
                    data: Cow::Owned(buf),
                })
            }
        }
    }

    /// Whether the weight `name` of `dtype` and shape `have` is bf16 (else f32), or
    /// the error naming what is wrong with it when `have` is not `want` or the dtype
    /// is neither.
    fn checked(
        &self,
        name: &str,
        dtype: Dtype,
        have: &[usize],
        want: &[usize],
    ) -> std::result::Result<bool, ModelError> {
        if have != want {
            return Err(self.err(format!(
                "weight `{name}` has shape {have:?}, expected {want:?}"
            )));
        }
        match dtype {
            Dtype::F32 => Ok(false),
            Dtype::BF16 => Ok(true),
            other => Err(self.err(format!(
                "weight `{name}` is {other:?}; only F32 and BF16 weights are supported"
            ))),
        }
    }

    /// A matrix weight `[k, n]` in the model's precision, kept packed for products.
    /// Where the tier has no fast product for a reduced precision
    /// ([`Precision::fast_here`]), the weight holds that precision's values (bf16's
    /// rounding, int8's integers times their scales; `Bf16x3`'s are the f32 values
    /// themselves) in f32, for the f32 tile.
    pub(in crate::models) fn weight(
        &self,
        w: Vec<f32>,
        dims: [usize; 2],
    ) -> std::result::Result<Tensor, ModelError> {
        let p = self.precision;
        if p.fast_here() && p != Precision::F32 {
            return Ok(Tensor::from_vec(w, &dims)?.to_dtype(p.dtype())?);
        }
        let w = match p {
            Precision::Bf16 | Precision::Int8 => {
                warn_slow(p);
                let packed = Tensor::from_vec(w, &dims)?.to_dtype(p.own_dtype())?;
                packed.to_dtype(DType::F32)?.to_vec::<f32>()?
            }
            Precision::F32 | Precision::Bf16x3 => w,
        };
        Ok(Tensor::weight(w, &dims)?)
    }

    /// `name` as a tensor of `shape`, converted in one pass.
    pub(in crate::models) fn tensor(
        &self,
        name: &str,
        shape: &[usize],
    ) -> std::result::Result<Tensor, ModelError> {
        let raw = self.bytes(name, shape)?;
        Ok(Tensor::from_vec(raw.values().collect(), shape)?)
    }

    /// The linear weight `name` (`[out, in]` in the file) transposed to `[in, out]`,
    /// times `scale`, written into `dst`'s columns `first..first + out`.
    pub(in crate::models) fn linear_into(
        &self,
        name: &str,
        [out, inp]: [usize; 2],
        scale: f32,
        dst: Columns<'_>,
    ) -> std::result::Result<(), ModelError> {
        let raw = self.bytes(name, &[out, inp])?;
        for (at, x) in raw.values().enumerate() {
            let (o, i) = (at / inp, at % inp);
            dst.data[i * dst.cols + dst.first + o] = x * scale;
        }
        Ok(())
    }

    /// The linear weight `name` (`[out, in]` in the file) as an `[in, out]` tensor, kept
    /// packed for products in the model's precision.
    pub(in crate::models) fn linear(
        &self,
        name: &str,
        out: usize,
        inp: usize,
    ) -> std::result::Result<Tensor, ModelError> {
        self.weight(self.transposed(name, out, inp)?, [inp, out])
    }

    /// The linear weight `name` (`[out, in]` in the file) as a plain `[in, out]` f32
    /// tensor, whatever the model's precision: for a small head that multiplies a row
    /// per sequence, where packing buys nothing.
    pub(in crate::models) fn linear_f32(
        &self,
        name: &str,
        out: usize,
        inp: usize,
    ) -> std::result::Result<Tensor, ModelError> {
        Ok(Tensor::from_vec(
            self.transposed(name, out, inp)?,
            &[inp, out],
        )?)
    }

    /// The values of the linear weight `name` (`[out, in]` in the file) as a row-major
    /// `[in, out]` matrix.
    fn transposed(
        &self,
        name: &str,
        out: usize,
        inp: usize,
    ) -> std::result::Result<Vec<f32>, ModelError> {
        let mut w = vec![0.0f32; out * inp];
        self.linear_into(
            name,
            [out, inp],
            1.0,
            Columns {
                data: &mut w,
                cols: out,
                first: 0,
            },
        )?;
        Ok(w)
    }

    pub(in crate::models) fn bias_into(
        &self,
        name: &str,
        n: usize,
        scale: f32,
        dst: &mut [f32],
    ) -> std::result::Result<(), ModelError> {
        let raw = self.bytes(name, &[n])?;
        for (d, x) in dst.iter_mut().zip(raw.values()) {
            *d = x * scale;
        }
        Ok(())
    }
}

/// A row-major `[rows, cols]` destination matrix and the first column to write.
pub(in crate::models) struct Columns<'d> {
    /// The matrix.
    pub(in crate::models) data: &'d mut [f32],
    /// Its columns.
    pub(in crate::models) cols: usize,
    /// The first column to write.
    pub(in crate::models) first: usize,
}

/// Little-endian f32 values of `bytes` (whose length is a multiple of 4).
fn f32s(bytes: &[u8]) -> impl Iterator<Item = f32> + '_ {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
}

/// A safetensors file of `tensors` (name, shape, values) in `dtype` (F32 or BF16,
/// the values rounded down to it): what the loaders' tests read.
#[cfg(test)]
pub(in crate::models) fn safetensors_file(
    tensors: &[(String, Vec<usize>, Vec<f32>)],
    dtype: Dtype,
) -> Vec<u8> {
    let data: Vec<Vec<u8>> = tensors
        .iter()
        .map(|(_, _, v)| match dtype {
            Dtype::BF16 => v
                .iter()
                .flat_map(|x| ((x.to_bits() >> 16) as u16).to_le_bytes())
                .collect(),
            _ => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        })
        .collect();
    let views = tensors.iter().zip(&data).map(|((name, shape, _), bytes)| {
        let view = safetensors::tensor::TensorView::new(dtype, shape.clone(), bytes);
        (name.clone(), view.unwrap())
    });
    safetensors::serialize(views, None).unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(tensors: &[(&str, &[usize], Vec<f32>)], dtype: Dtype) -> Vec<u8> {
        let owned: Vec<_> = tensors
            .iter()
            .map(|(n, s, v)| (n.to_string(), s.to_vec(), v.clone()))
            .collect();
        safetensors_file(&owned, dtype)
    }

    fn temp(name: &str, bytes: &[u8]) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("sf-weights-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, bytes).unwrap();
        path
    }

    #[test]
    fn a_file_read_a_tensor_at_a_time_gives_what_memory_gives() {
        let w: Vec<f32> = (0..6).map(|i| i as f32 * 0.25 - 0.5).collect();
        let b = vec![1.0f32, 2.0];
        for dtype in [Dtype::F32, Dtype::BF16] {
            let bytes = file(
                &[
                    ("a.weight", &[2, 3], w.clone()),
                    ("model.b", &[2], b.clone()),
                ],
                dtype,
            );
            let path = temp(&format!("ok-{dtype:?}.safetensors"), &bytes);
            let mem = WeightReader::open(&bytes, &path, Precision::F32).unwrap();
            let disk = WeightReader::open_file(&path, Precision::F32).unwrap();
            for r in [&mem, &disk] {
                // [out 2, in 3] in the file, [in 3, out 2] as a linear weight.
                let t = r.linear("a.weight", 2, 3).unwrap().to_vec::<f32>().unwrap();
                assert_eq!(t, [-0.5, 0.25, -0.25, 0.5, 0.0, 0.75]);
                // The `model.` prefix is found.
                assert_eq!(r.tensor("b", &[2]).unwrap().to_vec::<f32>().unwrap(), b);
                let e = r.tensor("a.weight", &[3, 2]).unwrap_err().to_string();
                assert!(e.contains("shape [2, 3]"), "{e}");
                let e = r.tensor("c", &[1]).unwrap_err().to_string();
                assert!(e.contains("`c` is missing"), "{e}");
            }
        }
    }

    #[test]
    fn a_broken_file_is_an_error_naming_it() {
        let good = file(&[("a", &[4], vec![1.0; 4])], Dtype::F32);
        // Cut short: the tensor lies past the end of the data.
        let path = temp("short.safetensors", &good[..good.len() - 4]);
        let r = WeightReader::open_file(&path, Precision::F32).unwrap();
        let e = r.tensor("a", &[4]).unwrap_err().to_string();
        assert!(
            e.contains("past its end") && e.contains("short.safetensors"),
            "{e}"
        );
        // A header longer than the file, an empty file, a header that is not JSON.
        let mut long = good.clone();
        long[..8].copy_from_slice(&(1u64 << 20).to_le_bytes());
        let mut junk = 4u64.to_le_bytes().to_vec();
        junk.extend_from_slice(b"nope");
        for (name, bytes) in [("long", long), ("empty", vec![]), ("junk", junk)] {
            let path = temp(&format!("{name}.safetensors"), &bytes);
            let e = WeightReader::open_file(&path, Precision::F32)
                .err()
                .unwrap()
                .to_string();
            assert!(e.contains("not a valid safetensors file"), "{name}: {e}");
        }
        let e = WeightReader::open_file(Path::new("/nonexistent/m.safetensors"), Precision::F32)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("/nonexistent/m.safetensors"), "{e}");
    }
}
