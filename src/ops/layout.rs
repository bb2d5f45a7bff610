//! Ops that move or reinterpret elements: `to_dtype` (cast), `contiguous` (a copy into
//! a fresh row-major buffer) and views (a new layout over the same buffer, no kernel).

use super::{dst, output, per_output_element, typed, Family, FusionClass};
use crate::kernels::{self, KernelError};

/// The registry entry of `to_dtype`.
pub(super) static CAST: Family = Family {
    name: "to_dtype",
    class: FusionClass::Single,
    work: per_output_element,
    run: |op, inputs, _, out, par| {
        with_dtype!(op.inputs[0].dtype, S => {
            with_dtype!(output(op)?.dtype, T => {
                kernels::cast::<S, T>(typed(inputs[0])?, &op.inputs[0].layout, dst(out)?, par)
            })
        })
    },
};

/// The registry entry of `contiguous`.
pub(super) static CONTIGUOUS: Family = Family {
    name: "contiguous",
    class: FusionClass::Single,
    work: per_output_element,
    run: |op, inputs, _, out, par| {
        with_dtype!(output(op)?.dtype, T => {
            kernels::copy::<T>(typed(inputs[0])?, &op.inputs[0].layout, dst(out)?, par)
        })
    },
};

/// The registry entry of views (`reshape`, `transpose`, `narrow`, ...): they alias
/// their input, cost nothing and have no kernel.
pub(super) static VIEW: Family = Family {
    name: "view",
    class: FusionClass::Alias,
    work: |_| 0,
    run: |_, _, _, _, _| Err(KernelError("a view has no kernel (engine bug)".into())),
};
