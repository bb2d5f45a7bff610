//! What a sentence embedder runs after its encoder, as sentence-transformers'
//! module list names it: [`Head`] holds the pooling modes (with `include_prompt`), the
//! `Dense` layers ([`Dense`], a linear map and its [`DenseActivation`]) and applies
//! them, then L2 normalisation per sequence where asked. All of it is engine ops on
//! the packed last hidden states (see `pooling.rs`).

use super::pooling::{pool, Pooling, Span};
use crate::{Error, Result, Tensor};

/// The activation after a `Dense` module's linear map, by the name
/// sentence-transformers writes in its config (`activation_function`, a PyTorch class
/// path).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DenseActivation {
    /// `torch.nn.modules.linear.Identity`.
    Identity,
    /// `torch.nn.modules.activation.Tanh` (sentence-transformers' default).
    Tanh,
    /// `torch.nn.modules.activation.ReLU`.
    Relu,
    /// `torch.nn.modules.activation.GELU` (exact, erf).
    Gelu,
    /// `torch.nn.modules.activation.Sigmoid`.
    Sigmoid,
    /// `torch.nn.modules.activation.SiLU`.
    Silu,
}

impl DenseActivation {
    /// The activation a config names (the class path, or its last part); an error
    /// naming it when the engine does not run it exactly.
    pub fn parse(name: &str) -> std::result::Result<DenseActivation, String> {
        let class = name.rsplit('.').next().unwrap_or(name);
        Ok(match class {
            "Identity" => DenseActivation::Identity,
            "Tanh" => DenseActivation::Tanh,
            "ReLU" => DenseActivation::Relu,
            "GELU" => DenseActivation::Gelu,
            "Sigmoid" => DenseActivation::Sigmoid,
            "SiLU" => DenseActivation::Silu,
            _ => {
                return Err(format!(
                    "activation_function `{name}` is not supported \
                     (Identity, Tanh, ReLU, GELU, Sigmoid, SiLU of torch.nn)"
                ))
            }
        })
    }

    fn apply(self, x: Tensor) -> Result<Tensor> {
        match self {
            DenseActivation::Identity => Ok(x),
            DenseActivation::Tanh => x.tanh(),
            DenseActivation::Relu => x.relu(),
            DenseActivation::Gelu => x.gelu(),
            DenseActivation::Sigmoid => x.sigmoid(),
            DenseActivation::Silu => x.silu(),
        }
    }
}

/// A sentence-transformers `Dense` module: `act(x @ w + b)`.
pub struct Dense {
    /// `[in, out]`.
    w: Tensor,
    /// `[out]`, when the module has a bias.
    b: Option<Tensor>,
    act: DenseActivation,
}

impl Dense {
    /// A layer from PyTorch's `linear.weight` (`[out, in]`, row-major) and, when the
    /// module has one, `linear.bias` (`[out]`).
    pub fn new(
        weight: Vec<f32>,
        out: usize,
        inp: usize,
        bias: Option<Vec<f32>>,
        act: DenseActivation,
    ) -> Result<Dense> {
        if weight.len() != out * inp || bias.as_ref().is_some_and(|b| b.len() != out) {
            return Err(Error::Shape {
                op: "dense",
                msg: format!(
                    "a [{out}, {inp}] layer needs {} weights and {out} biases, got {} and {:?}",
                    out * inp,
                    weight.len(),
                    bias.as_ref().map(Vec::len)
                ),
            });
        }
        let mut t = vec![0.0f32; out * inp];
        for (o, row) in weight.chunks_exact(inp.max(1)).enumerate() {
            for (i, &x) in row.iter().enumerate() {
                t[i * out + o] = x;
            }
        }
        Ok(Dense {
            w: Tensor::from_vec(t, &[inp, out])?,
            b: bias.map(|b| Tensor::from_vec(b, &[out])).transpose()?,
            act,
        })
    }

    /// Input width.
    pub fn in_features(&self) -> usize {
        self.w.dims()[0]
    }

    /// Output width.
    pub fn out_features(&self) -> usize {
        self.w.dims()[1]
    }

    /// Its activation.
    pub fn activation(&self) -> DenseActivation {
        self.act
    }

    fn apply(&self, x: &Tensor) -> Result<Tensor> {
        let y = x.matmul(&self.w)?;
        let y = match &self.b {
            Some(b) => y.add(b)?,
            None => y,
        };
        self.act.apply(y)
    }
}

/// The modules after the encoder: pooling, then each `Dense` layer in turn.
pub struct Head {
    pooling: Vec<Pooling>,
    include_prompt: bool,
    dense: Vec<Dense>,
    /// Width of the encoder's states.
    hidden: usize,
}

impl Head {
    /// The head over states `hidden` wide: `pooling` modes (concatenated in that
    /// order), prompt tokens pooled only when `include_prompt`, then `dense`. An error
    /// names a layer whose input width does not match what comes before it.
    pub fn new(
        hidden: usize,
        pooling: Vec<Pooling>,
        include_prompt: bool,
        dense: Vec<Dense>,
    ) -> std::result::Result<Head, String> {
        if pooling.is_empty() {
            return Err("no pooling mode".into());
        }
        let mut width = hidden * pooling.len();
        for (i, d) in dense.iter().enumerate() {
            if d.in_features() != width {
                return Err(format!(
                    "Dense module {i} takes {} features but gets {width}",
                    d.in_features()
                ));
            }
            width = d.out_features();
        }
        Ok(Head {
            pooling,
            include_prompt,
            dense,
            hidden,
        })
    }

    /// Pooling alone, in one mode, prompts included: what a folder without a module
    /// list runs.
    pub fn pooling_only(hidden: usize, pooling: Pooling) -> Head {
        Head {
            pooling: vec![pooling],
            include_prompt: true,
            dense: Vec::new(),
            hidden,
        }
    }

    /// The pooling modes, in the order they are concatenated.
    pub fn pooling(&self) -> &[Pooling] {
        &self.pooling
    }

    /// Whether prompt tokens are pooled.
    pub fn include_prompt(&self) -> bool {
        self.include_prompt
    }

    /// The `Dense` layers.
    pub fn dense(&self) -> &[Dense] {
        &self.dense
    }

    /// Width of the vectors it makes.
    pub fn dim(&self) -> usize {
        self.dense
            .last()
            .map_or(self.hidden * self.pooling.len(), Dense::out_features)
    }

    /// The vectors `[n, dim]` of the sequences at `spans` of the packed states
    /// `[total, hidden]`, sequence `i` L2-normalised (divided by its norm, at least
    /// 1e-12, as sentence-transformers' `Normalize`) where `normalize[i]`. A span's
    /// `skip` (its prompt) is honoured only when the head does not include prompts.
    pub fn apply(&self, states: &Tensor, spans: &[Span], normalize: &[bool]) -> Result<Tensor> {
        let spans: Vec<Span> = spans
            .iter()
            .map(|&s| Span {
                skip: if self.include_prompt { 0 } else { s.skip },
                ..s
            })
            .collect();
        let mut x = pool(states, &spans, &self.pooling)?;
        for d in &self.dense {
            x = d.apply(&x)?;
        }
        if !normalize.iter().any(|&n| n) {
            return Ok(x);
        }
        let norm = x
            .mul(&x)?
            .sum_keepdim(-1)?
            .sqrt()?
            .maximum(&Tensor::full(1e-12, &[1])?)?;
        if normalize.iter().all(|&n| n) {
            return x.div(&norm);
        }
        // norm · 1 + 0 where a sequence is normalised (its norm exactly), 0 + 1 where not.
        let on: Vec<f32> = normalize.iter().map(|&n| f32::from(u8::from(n))).collect();
        let off: Vec<f32> = on.iter().map(|f| 1.0 - f).collect();
        let n = normalize.len();
        let div = norm
            .mul(&Tensor::from_vec(on, &[n, 1])?)?
            .add(&Tensor::from_vec(off, &[n, 1])?)?;
        x.div(&div)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn activations_are_read_by_class_and_unknown_ones_named() {
        assert_eq!(
            DenseActivation::parse("torch.nn.modules.activation.Tanh").unwrap(),
            DenseActivation::Tanh
        );
        assert_eq!(
            DenseActivation::parse("torch.nn.modules.linear.Identity").unwrap(),
            DenseActivation::Identity
        );
        let e = DenseActivation::parse("torch.nn.modules.activation.Softsign").unwrap_err();
        assert!(e.contains("Softsign"), "{e}");
    }

    #[test]
    fn dense_and_normalize_per_sequence() {
        // w = [[1, 2], [0, 1], [3, 0]] (out 3, in 2), b = [0, 1, -1].
        let d = Dense::new(
            vec![1.0, 2.0, 0.0, 1.0, 3.0, 0.0],
            3,
            2,
            Some(vec![0.0, 1.0, -1.0]),
            DenseActivation::Identity,
        )
        .unwrap();
        let head = Head::new(2, vec![Pooling::Cls], true, vec![d]).unwrap();
        assert_eq!(head.dim(), 3);
        let states = Tensor::from_vec(vec![1.0f32, 1.0, 2.0, 0.0], &[2, 2]).unwrap();
        let spans = [
            Span {
                start: 0,
                len: 1,
                skip: 0,
            },
            Span {
                start: 1,
                len: 1,
                skip: 0,
            },
        ];
        let v = head.apply(&states, &spans, &[false, true]).unwrap();
        let v = v.to_vec::<f32>().unwrap();
        // [3, 2, 2] as is; [2, 1, 5] / sqrt(30).
        let r = 30f32.sqrt();
        let want = [3.0, 2.0, 2.0, 2.0 / r, 1.0 / r, 5.0 / r];
        assert!(
            v.iter().zip(want).all(|(a, b)| (a - b).abs() < 1e-6),
            "{v:?}"
        );
        let e = Head::new(4, vec![Pooling::Mean], true, vec![]).map(|h| h.dim());
        assert_eq!(e, Ok(4));
        let d = Dense::new(vec![0.0; 6], 3, 2, None, DenseActivation::Tanh).unwrap();
        let e = Head::new(4, vec![Pooling::Mean], true, vec![d])
            .err()
            .unwrap();
        assert!(e.contains("takes 2"), "{e}");
    }
}
