//! Loading a BERT-family model: its weights, read through the shared
//! [`WeightReader`], in the layout the forward pass uses ([`BertModel::load`],
//! [`BertModel::from_safetensors`]).

use std::path::{Path, PathBuf};

use super::super::weights::{Columns, WeightReader};
use super::super::{ModelError, Precision};
use super::config::{Activation, BertConfig};
use super::names::LayerNames;
use super::relative::RelativeBias;
use super::{BertModel, Layer};
use crate::Tensor;

/// The config (`config.json`) of the model folder `dir` and the path of its
/// `model.safetensors`.
pub(super) fn read_folder(dir: &Path) -> std::result::Result<(BertConfig, PathBuf), ModelError> {
    let config = BertConfig::load(&dir.join("config.json"))?;
    Ok((config, dir.join("model.safetensors")))
}

impl BertModel {
    /// Loads `config.json` and `model.safetensors` from the model folder `dir`.
    ///
    /// The safetensors file is read one weight at a time; each weight is converted
    /// from its bytes straight into the tensor the forward pass uses, and its bytes
    /// are dropped at once (loading holds the model and one weight's bytes, never the
    /// whole file besides). The pooler
    /// weights and position ids in the file are not used by sentence embeddings and
    /// are not loaded.
    pub fn load(dir: &Path) -> std::result::Result<BertModel, ModelError> {
        BertModel::load_as(dir, Precision::F32)
    }

    /// [`BertModel::load`] keeping the matrix weights in `precision`: a bf16 or int8
    /// model is made from the file's f32 weights (or bf16 ones, widened exactly) as it
    /// loads, so it never holds more than one weight in f32 at a time.
    pub fn load_as(dir: &Path, precision: Precision) -> std::result::Result<BertModel, ModelError> {
        let (config, path) = read_folder(dir)?;
        let r = WeightReader::open_file(&path, precision)?;
        BertModel::from_reader_with(config, &r, |_, _| Ok(())).map(|(model, ())| model)
    }

    /// Builds the model from `config` and the bytes of a safetensors file (`path` is
    /// only used in error messages), with f32 weights.
    pub fn from_safetensors(
        config: BertConfig,
        bytes: &[u8],
        path: &Path,
    ) -> std::result::Result<BertModel, ModelError> {
        BertModel::from_safetensors_as(config, bytes, path, Precision::F32)
    }

    /// [`BertModel::from_safetensors`] keeping the matrix weights in `precision`.
    pub fn from_safetensors_as(
        config: BertConfig,
        bytes: &[u8],
        path: &Path,
        precision: Precision,
    ) -> std::result::Result<BertModel, ModelError> {
        let r = WeightReader::open(bytes, path, precision)?;
        BertModel::from_reader_with(config, &r, |_, _| Ok(())).map(|(model, ())| model)
    }

    /// The model from `config` and the weights `r` reads, then `more` reads other
    /// weights of the same file (a classifier's head).
    pub(super) fn from_reader_with<T>(
        config: BertConfig,
        r: &WeightReader<'_>,
        more: impl FnOnce(&WeightReader<'_>, &BertConfig) -> std::result::Result<T, ModelError>,
    ) -> std::result::Result<(BertModel, T), ModelError> {
        config.validate().map_err(|msg| ModelError::Format {
            path: PathBuf::from("config.json"),
            msg,
        })?;
        let precision = r.precision();
        let h = config.hidden_size;
        let inter = config.intermediate_size;
        let positions = config.positions();

        let word_emb = r.tensor("embeddings.word_embeddings.weight", &[config.vocab_size, h])?;
        let pos = r.bytes(
            "embeddings.position_embeddings.weight",
            &[config.max_position_embeddings, h],
        )?;
        // The rows a sequence's positions read: from `position_offset` on (RoBERTa's
        // families skip the rows up to the padding id's).
        let pos_rows: Vec<f32> = pos
            .range(
                config.position_offset * h,
                config.max_position_embeddings * h,
            )
            .collect();
        // MPNet has no token types: its one type adds nothing.
        let types = match config.model_type.as_str() {
            "mpnet" => None,
            _ => Some(r.bytes(
                "embeddings.token_type_embeddings.weight",
                &[config.type_vocab_size, h],
            )?),
        };
        // Row `t * positions + p`: position p's embedding plus token type t's.
        let mut pos_type = Vec::with_capacity(config.type_vocab_size * positions * h);
        for t in 0..config.type_vocab_size {
            let type_t: Vec<f32> = match &types {
                Some(types) => types.range(t * h, (t + 1) * h).collect(),
                None => vec![0.0; h],
            };
            pos_type.extend(pos_rows.iter().enumerate().map(|(i, p)| p + type_t[i % h]));
        }
        let pos_type_emb = Tensor::from_vec(pos_type, &[config.type_vocab_size * positions, h])?;
        let emb_ln_w = r.tensor("embeddings.LayerNorm.weight", &[h])?;
        let emb_ln_b = r.tensor("embeddings.LayerNorm.bias", &[h])?;

        let scale = 1.0 / (config.head_dim() as f32).sqrt();
        let mut layers = Vec::with_capacity(config.num_hidden_layers);
        for l in 0..config.num_hidden_layers {
            let n = LayerNames::of(&config.model_type, l);
            let mut qkv_w = vec![0.0f32; h * 3 * h];
            let mut qkv_b = vec![0.0f32; 3 * h];
            for (j, (name, s)) in n.qkv.iter().zip([scale, 1.0, 1.0]).enumerate() {
                r.linear_into(
                    &format!("{name}.weight"),
                    [h, h],
                    s,
                    Columns {
                        data: &mut qkv_w,
                        cols: 3 * h,
                        first: j * h,
                    },
                )?;
                r.bias_into(
                    &format!("{name}.bias"),
                    h,
                    s,
                    &mut qkv_b[j * h..(j + 1) * h],
                )?;
            }
            let (w, b) = (".weight", ".bias");
            layers.push(Layer {
                qkv_w: r.weight(qkv_w, [h, 3 * h])?,
                qkv_b: Tensor::from_vec(qkv_b, &[3 * h])?,
                out_w: r.linear(&(n.out.clone() + w), h, h)?,
                out_b: r.tensor(&(n.out + b), &[h])?,
                ln1_w: r.tensor(&(n.ln1.clone() + w), &[h])?,
                ln1_b: r.tensor(&(n.ln1 + b), &[h])?,
                ff_in_w: r.linear(&(n.ff_in.clone() + w), inter, h)?,
                ff_in_b: r.tensor(&(n.ff_in + b), &[inter])?,
                ff_out_w: r.linear(&(n.ff_out.clone() + w), h, inter)?,
                ff_out_b: r.tensor(&(n.ff_out + b), &[h])?,
                ln2_w: r.tensor(&(n.ln2.clone() + w), &[h])?,
                ln2_b: r.tensor(&(n.ln2 + b), &[h])?,
            });
        }
        let rel_bias = match config.relative_attention_num_buckets {
            0 => None,
            buckets => Some(RelativeBias::new(r.tensor(
                "encoder.relative_attention_bias.weight",
                &[buckets, config.num_attention_heads],
            )?)),
        };
        let act = Activation::parse(&config.hidden_act).map_err(|msg| ModelError::Format {
            path: PathBuf::from("config.json"),
            msg,
        })?;
        let extra = more(r, &config)?;
        let model = BertModel {
            config,
            precision,
            act,
            word_emb,
            pos_type_emb,
            emb_ln_w,
            emb_ln_b,
            layers,
            rel_bias,
        };
        Ok((model, extra))
    }
}

#[cfg(test)]
mod tests {
    use safetensors::tensor::TensorView;
    use safetensors::Dtype;

    use super::*;

    fn tiny() -> BertConfig {
        BertConfig::from_json(
            r#"{"vocab_size": 5, "hidden_size": 4, "num_hidden_layers": 1,
                "num_attention_heads": 2, "intermediate_size": 8,
                "max_position_embeddings": 6, "type_vocab_size": 2,
                "layer_norm_eps": 1e-12, "hidden_act": "gelu", "pad_token_id": 0}"#,
        )
        .unwrap()
    }

    /// A safetensors file holding `tensors` (name, shape), every element 0.5.
    fn file(tensors: &[(&str, &[usize])]) -> Vec<u8> {
        let data: Vec<Vec<u8>> = tensors
            .iter()
            .map(|(_, shape)| 0.5f32.to_le_bytes().repeat(shape.iter().product()))
            .collect();
        let views = tensors.iter().zip(&data).map(|((name, shape), bytes)| {
            (
                name.to_string(),
                TensorView::new(Dtype::F32, shape.to_vec(), bytes).unwrap(),
            )
        });
        safetensors::serialize(views, None).unwrap()
    }

    fn load_error(bytes: &[u8]) -> String {
        match BertModel::from_safetensors(tiny(), bytes, Path::new("m.safetensors")) {
            Ok(_) => panic!("a broken file loaded"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn a_missing_weight_is_named() {
        let e = load_error(&file(&[("unrelated", &[2])]));
        assert!(e.contains("embeddings.word_embeddings.weight"), "{e}");
        assert!(e.contains("missing") && e.contains("m.safetensors"), "{e}");
    }

    #[test]
    fn a_mis_shaped_weight_is_named_with_both_shapes() {
        let e = load_error(&file(&[("embeddings.word_embeddings.weight", &[4, 5])]));
        assert!(e.contains("embeddings.word_embeddings.weight"), "{e}");
        assert!(e.contains("[4, 5]") && e.contains("[5, 4]"), "{e}");
    }

    #[test]
    fn weights_under_a_bert_prefix_are_found_and_the_next_missing_one_is_named() {
        let e = load_error(&file(&[(
            "bert.embeddings.word_embeddings.weight",
            &[5, 4],
        )]));
        assert!(e.contains("embeddings.position_embeddings.weight"), "{e}");
    }

    /// Every weight of the tiny model, with values that bf16 holds exactly.
    fn every_weight() -> Vec<(String, Vec<usize>, Vec<f32>)> {
        let mut names: Vec<(String, Vec<usize>)> = vec![
            ("embeddings.word_embeddings.weight".into(), vec![5, 4]),
            ("embeddings.position_embeddings.weight".into(), vec![6, 4]),
            ("embeddings.token_type_embeddings.weight".into(), vec![2, 4]),
            ("embeddings.LayerNorm.weight".into(), vec![4]),
            ("embeddings.LayerNorm.bias".into(), vec![4]),
        ];
        let p = "encoder.layer.0.";
        for part in ["query", "key", "value"] {
            names.push((format!("{p}attention.self.{part}.weight"), vec![4, 4]));
            names.push((format!("{p}attention.self.{part}.bias"), vec![4]));
        }
        for (name, shape) in [
            ("attention.output.dense.weight", vec![4, 4]),
            ("attention.output.dense.bias", vec![4]),
            ("attention.output.LayerNorm.weight", vec![4]),
            ("attention.output.LayerNorm.bias", vec![4]),
            ("intermediate.dense.weight", vec![8, 4]),
            ("intermediate.dense.bias", vec![8]),
            ("output.dense.weight", vec![4, 8]),
            ("output.dense.bias", vec![4]),
            ("output.LayerNorm.weight", vec![4]),
            ("output.LayerNorm.bias", vec![4]),
        ] {
            names.push((format!("{p}{name}"), shape));
        }
        names
            .into_iter()
            .enumerate()
            .map(|(t, (name, shape))| {
                let n: usize = shape.iter().product();
                // Multiples of 1/32 in [-1, 1): exact in bf16.
                let v = (0..n)
                    .map(|i| ((i * 7 + t * 3) % 64) as f32 / 32.0 - 1.0)
                    .collect();
                (name, shape, v)
            })
            .collect()
    }

    /// A safetensors file of `weights` in `dtype` (F32 or BF16).
    fn file_in(weights: &[(String, Vec<usize>, Vec<f32>)], dtype: Dtype) -> Vec<u8> {
        crate::models::weights::safetensors_file(weights, dtype)
    }

    #[test]
    fn bf16_files_load_as_they_are_at_every_precision() {
        let w = every_weight();
        let (f32_file, bf16_file) = (file_in(&w, Dtype::F32), file_in(&w, Dtype::BF16));
        let path = Path::new("m.safetensors");
        let ids: &[u32] = &[1, 3, 2, 4];
        for precision in [
            Precision::F32,
            Precision::Bf16,
            Precision::Int8,
            Precision::Bf16x3,
        ] {
            let embed = |bytes: &[u8]| {
                let m = BertModel::from_safetensors_as(tiny(), bytes, path, precision).unwrap();
                assert_eq!(m.precision(), precision);
                m.embed_batch(&[ids]).unwrap()
            };
            // The values are exact in bf16, so both files make the same model.
            assert_eq!(embed(&f32_file), embed(&bf16_file), "{precision}");
        }
        // Another dtype is named.
        let f16: Vec<(String, TensorView<'_>)> = vec![(
            "embeddings.word_embeddings.weight".into(),
            TensorView::new(Dtype::F16, vec![5, 4], &[0u8; 40]).unwrap(),
        )];
        let e = load_error(&safetensors::serialize(f16, None).unwrap());
        assert!(e.contains("F16") && e.contains("F32 and BF16"), "{e}");
    }

    #[test]
    fn bytes_that_are_not_safetensors_are_an_error() {
        let e = load_error(b"not a safetensors file");
        assert!(e.contains("not a valid safetensors file"), "{e}");
    }
}
