//! Running a [`Chain`] kernel of a plan: its values' slices are looked up by relative
//! id and handed to [`kernels::chain`] with the layouts the plan recorded.

use crate::fusion::Chain;
use crate::ir::{Layout, OpKind};
use crate::kernels::{self, ChainMatMul, ChainNorm, KernelError, Par};

/// Runs `chain`, reading each value through `data` (its root's f32 elements) and
/// writing `outputs` (in the chain's output order).
pub(super) fn run_chain<'a>(
    chain: &'a Chain,
    data: impl Fn(u32) -> Result<&'a [f32], KernelError>,
    outputs: &mut [&mut [f32]],
    par: Par,
) -> Result<(), KernelError> {
    let product = chain.matmul.as_ref().map(|m| m.product);
    // The program's inputs, on the stack for up to `INLINE` of them.
    const INLINE: usize = 16;
    let empty = Layout::contiguous(&[]);
    let mut inline: [(&[f32], &Layout); INLINE] = [(&[], &empty); INLINE];
    let heap: Vec<(&[f32], &Layout)>;
    let input = |(v, l): &'a (u32, Layout)| -> Result<(&'a [f32], &'a Layout), KernelError> {
        match product {
            Some(p) if p == *v => Ok((&[][..], l)),
            _ => Ok((data(*v)?, l)),
        }
    };
    let inputs: &[(&[f32], &Layout)] = if chain.inputs.len() <= INLINE {
        for (slot, i) in inline.iter_mut().zip(&chain.inputs) {
            *slot = input(i)?;
        }
        &inline[..chain.inputs.len()]
    } else {
        heap = chain.inputs.iter().map(input).collect::<Result<_, _>>()?;
        &heap
    };
    let matmul = match &chain.matmul {
        Some(m) => Some(ChainMatMul {
            lhs: (data(m.lhs.0)?, &m.lhs.1),
            rhs: (data(m.rhs.0)?, &m.rhs.1),
            input: m.input,
        }),
        None => None,
    };
    let norm = match &chain.norm {
        None => None,
        Some(n) => {
            let param = |i: usize| -> Result<(&'a [f32], &Layout), KernelError> {
                let (v, l) = n.params.get(i).ok_or_else(|| {
                    KernelError(format!(
                        "{} lacks parameter {i} (engine bug)",
                        n.kind.name()
                    ))
                })?;
                Ok((data(*v)?, l))
            };
            let norm = match n.kind {
                OpKind::Softmax => ChainNorm::Softmax,
                OpKind::LayerNorm { eps } => ChainNorm::LayerNorm {
                    weight: param(0)?,
                    bias: param(1)?,
                    eps: f64::from_bits(eps),
                },
                OpKind::RmsNorm { eps } => ChainNorm::RmsNorm {
                    weight: param(0)?,
                    eps: f64::from_bits(eps),
                },
                ref k => {
                    return Err(KernelError(format!(
                        "{} cannot end a chain (engine bug)",
                        k.name()
                    )))
                }
            };
            Some((norm, n.output))
        }
    };
    kernels::chain(
        &chain.dims,
        matmul,
        &chain.program,
        inputs,
        norm,
        outputs,
        par,
    )
}
