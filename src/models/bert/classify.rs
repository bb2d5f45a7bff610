//! Sequence classification: [`BertClassifier`] is Hugging Face's
//! `BertForSequenceClassification` at inference, the architecture of
//! sentence-transformers' cross-encoder rerankers. The encoder is [`BertModel`]'s; the
//! head takes each sequence's first (`[CLS]`) hidden state through the pooler (a dense
//! layer, then tanh) and the classifier (a dense layer to `num_labels` logits). Dropout
//! is the identity at inference, so it has no place here.
//!
//! Sequences run as ragged batches ([`BertClassifier::classify_packed`]) with their
//! token types: a cross-encoder's pair `[CLS] query [SEP] document [SEP]` has type 0 up
//! to the first `[SEP]` and 1 after it. The head's weights stay in f32 whatever the
//! encoder's precision (`hidden² + hidden · num_labels` values, next to nothing).

use std::path::Path;

use super::super::weights::WeightReader;
use super::packed::Packing;
use super::weights::read_folder;
use super::{BertConfig, BertModel};
use crate::models::{ModelError, Precision};
use crate::{Result, Tensor};

/// A BERT encoder with a sequence-classification head: `num_labels` logits per
/// sequence. `Send + Sync`, like [`BertModel`].
pub struct BertClassifier {
    model: BertModel,
    /// `[hidden, hidden]`, for `x @ w + b`.
    pooler_w: Tensor,
    pooler_b: Tensor,
    /// `[hidden, num_labels]`.
    out_w: Tensor,
    out_b: Tensor,
}

impl BertClassifier {
    /// Loads `config.json` and `model.safetensors` of a `BertForSequenceClassification`
    /// folder (weights named `bert.…`, `bert.pooler.dense.…` and `classifier.…`, or
    /// without the `bert.` prefix), with f32 weights.
    pub fn load(dir: &Path) -> std::result::Result<BertClassifier, ModelError> {
        BertClassifier::load_as(dir, Precision::F32)
    }

    /// [`BertClassifier::load`] keeping the encoder's matrix weights in `precision`.
    pub fn load_as(
        dir: &Path,
        precision: Precision,
    ) -> std::result::Result<BertClassifier, ModelError> {
        let (config, path) = read_folder(dir)?;
        let r = WeightReader::open_file(&path, precision)?;
        BertClassifier::from_reader(config, &r, &path)
    }

    /// Builds the classifier from `config` (its `num_labels` is the head's width) and
    /// the bytes of a safetensors file (`path` is only used in error messages).
    pub fn from_safetensors_as(
        config: BertConfig,
        bytes: &[u8],
        path: &Path,
        precision: Precision,
    ) -> std::result::Result<BertClassifier, ModelError> {
        let r = WeightReader::open(bytes, path, precision)?;
        BertClassifier::from_reader(config, &r, path)
    }

    /// The classifier from `config` and the weights `r` reads from the file at `path`.
    fn from_reader(
        config: BertConfig,
        r: &WeightReader<'_>,
        path: &Path,
    ) -> std::result::Result<BertClassifier, ModelError> {
        let (h, labels) = (config.hidden_size, config.num_labels);
        if config.model_type != "bert" {
            // RoBERTa's families classify with another head (a dense layer and tanh
            // over the first token, then `out_proj`), not BERT's pooler.
            return Err(ModelError::Format {
                path: path.with_file_name("config.json"),
                msg: format!(
                    "a {} sequence classifier is not supported (only BERT's pooler and \
                     classifier head)",
                    config.model_type
                ),
            });
        }
        if labels == 0 {
            return Err(ModelError::Format {
                path: path.with_file_name("config.json"),
                msg: "`id2label` is empty: a classifier needs at least one label".into(),
            });
        }
        let (model, head) = BertModel::from_reader_with(config, r, |r, _| {
            Ok((
                r.linear_f32("pooler.dense.weight", h, h)?,
                r.tensor("pooler.dense.bias", &[h])?,
                r.linear_f32("classifier.weight", labels, h)?,
                r.tensor("classifier.bias", &[labels])?,
            ))
        })?;
        let (pooler_w, pooler_b, out_w, out_b) = head;
        Ok(BertClassifier {
            model,
            pooler_w,
            pooler_b,
            out_w,
            out_b,
        })
    }

    /// The encoder.
    pub fn model(&self) -> &BertModel {
        &self.model
    }

    /// Logits per sequence (`num_labels` of the config).
    pub fn labels(&self) -> usize {
        self.model.config().num_labels
    }

    /// The logits of `seqs` (token ids, each 1 to `BertConfig::positions` long and
    /// below `vocab_size`) with their token types (`types`: empty when every token is
    /// of type 0, else one list per sequence, empty or one type per token, each below
    /// `type_vocab_size`), from one ragged forward pass. One `Vec` of
    /// [`labels`](BertClassifier::labels) logits per sequence, in input order. Bad ids
    /// or types are an error naming the sequence.
    pub fn classify_packed(
        &self,
        seqs: &[&[u32]],
        types: &[&[u32]],
        packing: Packing,
    ) -> Result<Vec<Vec<f32>>> {
        if seqs.is_empty() {
            return Ok(Vec::new());
        }
        let packed = self
            .model
            .pack("bert_classify_packed", seqs, types, packing)?;
        let hidden = self.model.encode_packed(&packed)?;
        // The [CLS] rows; row 0 again for the filler slots, so that the head's shapes
        // follow the packing's few buckets.
        let mut cls = packed.starts.clone();
        cls.resize(packed.slots, 0);
        let logits = hidden
            .index_select(&Tensor::from_vec(cls, &[packed.slots])?, 0)?
            .matmul(&self.pooler_w)?
            .add(&self.pooler_b)?
            .tanh()?
            .matmul(&self.out_w)?
            .add(&self.out_b)?
            .to_vec::<f32>()?;
        Ok(logits
            .chunks_exact(self.labels())
            .take(seqs.len())
            .map(<[f32]>::to_vec)
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::bert::testing::{self, Weight};
    use crate::models::bert::Pooling;

    const H: usize = 8;

    fn config(labels: usize) -> BertConfig {
        BertConfig::from_json(&format!(
            r#"{{"vocab_size": 20, "hidden_size": {H}, "num_hidden_layers": 1,
                "num_attention_heads": 2, "intermediate_size": 16,
                "max_position_embeddings": 16, "type_vocab_size": 2,
                "num_labels": {labels}}}"#
        ))
        .unwrap()
    }

    /// Every weight of a one-layer classifier with `labels` outputs, named as Hugging
    /// Face saves `BertForSequenceClassification`, with deterministic values.
    fn weights(labels: usize) -> Vec<Weight> {
        let mut shapes = testing::encoder_shapes("bert.", 20, H, 16, 16);
        shapes.extend([
            ("bert.pooler.dense.weight".into(), vec![H, H]),
            ("bert.pooler.dense.bias".into(), vec![H]),
            ("classifier.weight".into(), vec![labels, H]),
            ("classifier.bias".into(), vec![labels]),
        ]);
        testing::filled(shapes, 7)
    }

    fn file(weights: &[Weight]) -> Vec<u8> {
        testing::safetensors_file(weights)
    }

    fn classifier(labels: usize) -> BertClassifier {
        let path = Path::new("c.safetensors");
        BertClassifier::from_safetensors_as(
            config(labels),
            &file(&weights(labels)),
            path,
            Precision::F32,
        )
        .unwrap()
    }

    /// The head in f64 on the host: tanh(cls @ Wp^T + bp) @ Wc^T + bc.
    fn head_by_hand(cls: &[f32], labels: usize) -> Vec<f64> {
        let w = weights(labels);
        let get = |name: &str| &w.iter().find(|(n, _, _)| n == name).unwrap().2;
        let (pw, pb) = (
            get("bert.pooler.dense.weight"),
            get("bert.pooler.dense.bias"),
        );
        let (cw, cb) = (get("classifier.weight"), get("classifier.bias"));
        let pooled: Vec<f64> = (0..H)
            .map(|o| {
                let z: f64 = (0..H).map(|i| pw[o * H + i] as f64 * cls[i] as f64).sum();
                (z + pb[o] as f64).tanh()
            })
            .collect();
        (0..labels)
            .map(|o| {
                (0..H)
                    .map(|i| cw[o * H + i] as f64 * pooled[i])
                    .sum::<f64>()
                    + cb[o] as f64
            })
            .collect()
    }

    /// The last hidden state of a sequence's first token, through the same encoder.
    fn cls_state(c: &BertClassifier, seq: &[u32], types: &[u32]) -> Vec<f32> {
        let packed = c
            .model
            .pack("test", &[seq], &[types], Packing::Exact)
            .unwrap();
        let states = c
            .model
            .encode_packed(&packed)
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
        states[..H].to_vec()
    }

    #[test]
    fn the_head_is_pooler_tanh_then_classifier_on_the_first_token() {
        for labels in [1, 3] {
            let c = classifier(labels);
            assert_eq!(c.labels(), labels);
            let seq: &[u32] = &[2, 5, 9, 3, 11, 12, 3];
            let types: &[u32] = &[0, 0, 0, 0, 1, 1, 1];
            let got = c.classify_packed(&[seq], &[types], Packing::Exact).unwrap();
            let want = head_by_hand(&cls_state(&c, seq, types), labels);
            assert_eq!(got[0].len(), labels);
            for (g, w) in got[0].iter().zip(&want) {
                assert!(
                    (*g as f64 - w).abs() < 1e-5,
                    "{labels} labels: {got:?} vs {want:?}"
                );
            }
        }
    }

    #[test]
    fn a_batch_equals_each_sequence_alone_and_types_matter() {
        let c = classifier(1);
        let seqs: [&[u32]; 3] = [&[2, 5, 3, 7, 3], &[2, 8, 8, 3, 9, 10, 11, 3], &[2, 3, 3]];
        let types: [&[u32]; 3] = [&[0, 0, 0, 1, 1], &[0, 0, 0, 0, 1, 1, 1, 1], &[]];
        for packing in [Packing::Exact, Packing::Bucketed] {
            let all = c.classify_packed(&seqs, &types, packing).unwrap();
            assert_eq!(all.len(), 3);
            for i in 0..3 {
                let one = c
                    .classify_packed(&seqs[i..=i], &types[i..=i], packing)
                    .unwrap();
                assert!((all[i][0] - one[0][0]).abs() < 1e-5, "{packing:?} {i}");
            }
        }
        // All type 0 (no types given) is another input than the pair's types.
        let untyped = c.classify_packed(&seqs[..1], &[], Packing::Exact).unwrap();
        let typed = c
            .classify_packed(&seqs[..1], &types[..1], Packing::Exact)
            .unwrap();
        assert!(
            (untyped[0][0] - typed[0][0]).abs() > 1e-6,
            "{untyped:?} {typed:?}"
        );
        // An empty type list is all type 0.
        let empty = c
            .classify_packed(&seqs[..1], &[&[]], Packing::Exact)
            .unwrap();
        assert_eq!(empty, untyped);
        assert!(c
            .classify_packed(&[], &[], Packing::Exact)
            .unwrap()
            .is_empty());
    }

    #[test]
    fn type_zero_rows_are_the_embeddings_rows() {
        // The position-type table's first rows (type 0) are what the padded pass
        // narrows and what untyped packed sequences read: all three agree.
        let c = classifier(1);
        let seq: &[u32] = &[2, 5, 9, 3];
        let cls = cls_state(&c, seq, &[0, 0, 0, 0]);
        let norm = cls.iter().map(|x| x * x).sum::<f32>().sqrt();
        let packed = c
            .model
            .embed_packed(&[seq], Pooling::Cls, Packing::Exact)
            .unwrap();
        for (p, x) in packed[0].iter().zip(&cls) {
            assert!((p - x / norm).abs() < 1e-6, "{packed:?} vs {cls:?}");
        }
        let mean = c
            .model
            .embed_packed(&[seq], Pooling::Mean, Packing::Exact)
            .unwrap();
        let padded = c.model.embed_batch(&[seq]).unwrap();
        for (p, q) in mean[0].iter().zip(&padded[0]) {
            assert!((p - q).abs() < 1e-5, "{mean:?} vs {padded:?}");
        }
    }

    #[test]
    fn bad_types_and_heads_are_named() {
        let c = classifier(1);
        let seq: &[u32] = &[2, 5, 3];
        let err = |types: &[&[u32]]| {
            c.classify_packed(&[seq], types, Packing::Exact)
                .unwrap_err()
                .to_string()
        };
        let e = err(&[&[0, 2, 1]]);
        assert!(e.contains("token type 2") && e.contains("0 to 1"), "{e}");
        let e = err(&[&[0, 1]]);
        assert!(e.contains("3 tokens but 2 token types"), "{e}");
        let e = err(&[&[0, 0, 0], &[0]]);
        assert!(e.contains("2 lists of token types for 1 sequences"), "{e}");

        let load_err = |labels: usize, weights: &[Weight]| {
            let path = Path::new("c.safetensors");
            match BertClassifier::from_safetensors_as(
                config(labels),
                &file(weights),
                path,
                Precision::F32,
            ) {
                Ok(_) => panic!("a broken classifier loaded"),
                Err(e) => e.to_string(),
            }
        };
        // A head of another width than the config's labels.
        let e = load_err(2, &weights(1));
        assert!(
            e.contains("classifier.weight") && e.contains("[1, 8]"),
            "{e}"
        );
        // No head at all: an encoder's file.
        let mut encoder_only = weights(1);
        encoder_only.retain(|(n, _, _)| !n.contains("pooler") && !n.starts_with("classifier"));
        let e = load_err(1, &encoder_only);
        assert!(
            e.contains("pooler.dense.weight") && e.contains("missing"),
            "{e}"
        );
        let e = load_err(0, &weights(1));
        assert!(e.contains("at least one label"), "{e}");
    }
}
