//! Element types: the [`DType`] tag a tensor carries and the [`Element`] trait that lets
//! one generic kernel serve every type.
//!
//! A tensor's element type is fixed when it is created; `to_dtype` is the only op that
//! changes it. Kernels are written once over `T: Element`, and the engine picks the
//! instance from the tag.

use std::fmt;

/// The element type of a tensor. More types may come (the enum is non-exhaustive).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DType {
    /// 32-bit IEEE float: the type of activations and weights.
    F32,
    /// 32-bit unsigned integer: indices and `argmax` results.
    U32,
    /// 64-bit signed integer: indices as most tokenizers produce them.
    I64,
    /// bfloat16 (the top half of an f32: 8 exponent bits, 7 mantissa bits): weights
    /// kept in half the memory and multiplied with AVX512_BF16. A matrix `[k, n]`,
    /// made by [`to_dtype`](crate::Tensor::to_dtype) and used as the right operand of
    /// `matmul` (see `Tensor::to_dtype` for what it allows).
    BF16,
    /// Signed 8-bit integers with one f32 scale per column: weights kept in a quarter
    /// of the memory and multiplied with AVX512_VNNI. A matrix `[k, n]`, as
    /// [`DType::BF16`].
    I8,
    /// An f32 matrix kept as the sum of two bf16 (`hi + lo`: about 16 significant
    /// bits, in the f32's memory), whose products are taken as three bf16 products
    /// (`a_hi·b_hi + a_hi·b_lo + a_lo·b_hi`, f32 sums) on AMX tiles: within
    /// `2⁻¹⁴ · Σ|a·b|` of the f32 product, several times faster where the CPU has
    /// AMX-BF16 (portable loops elsewhere, slower than f32). A matrix `[k, n]`, as
    /// [`DType::BF16`].
    BF16X3,
}

impl DType {
    /// Size of one element in bytes.
    pub fn size_in_bytes(self) -> usize {
        match self {
            DType::F32 | DType::U32 | DType::BF16X3 => 4,
            DType::I64 => 8,
            DType::BF16 => 2,
            DType::I8 => 1,
        }
    }

    /// Whether tensors of this type are weights kept in reduced precision (`BF16`,
    /// `I8`, `BF16X3`): matrices that only `matmul` (as its right operand) and
    /// `to_dtype` take.
    pub fn is_weight_only(self) -> bool {
        matches!(self, DType::BF16 | DType::I8 | DType::BF16X3)
    }

    /// Whether this is a floating-point type (transcendental ops need one).
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32)
    }

    /// The lower-case name used in error messages (`f32`, `u32`, `i64`).
    pub fn as_str(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::U32 => "u32",
            DType::I64 => "i64",
            DType::BF16 => "bf16",
            DType::I8 => "i8",
            DType::BF16X3 => "bf16x3",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A Rust type that can be stored in a tensor.
///
/// The arithmetic here is what the generic kernels need: the identity elements, the
/// binary ops with wrapping integer semantics (integer division by zero gives zero, never a
/// panic), and lossy conversion through `f64` for casts.
pub trait Element:
    Copy + Send + Sync + PartialOrd + PartialEq + Default + fmt::Debug + 'static
{
    /// The tag of this type.
    const DTYPE: DType;
    /// Additive identity.
    fn zero() -> Self;
    /// Multiplicative identity.
    fn one() -> Self;
    /// The smallest value of the type (identity of `max`).
    fn min_value() -> Self;
    /// `self + rhs`, wrapping for integers.
    fn add(self, rhs: Self) -> Self;
    /// `self - rhs`, wrapping for integers.
    fn sub(self, rhs: Self) -> Self;
    /// `self * rhs`, wrapping for integers.
    fn mul(self, rhs: Self) -> Self;
    /// `self / rhs`; integer division by zero gives zero.
    fn div(self, rhs: Self) -> Self;
    /// The larger of the two (NaN propagates for floats).
    fn maximum(self, rhs: Self) -> Self;
    /// The smaller of the two (NaN propagates for floats).
    fn minimum(self, rhs: Self) -> Self;
    /// Conversion to `f64` (exact for `f32` and `u32`).
    fn to_f64(self) -> f64;
    /// Conversion from `f64`, saturating for integers (`as` semantics).
    fn from_f64(v: f64) -> Self;
    /// Conversion to `i64` for use as an index; `None` when it cannot be one.
    fn to_index(self) -> Option<i64>;
}

macro_rules! int_element {
    ($t:ty, $tag:expr) => {
        impl Element for $t {
            const DTYPE: DType = $tag;
            #[inline(always)]
            fn zero() -> Self {
                0
            }
            #[inline(always)]
            fn one() -> Self {
                1
            }
            #[inline(always)]
            fn min_value() -> Self {
                <$t>::MIN
            }
            #[inline(always)]
            fn add(self, rhs: Self) -> Self {
                self.wrapping_add(rhs)
            }
            #[inline(always)]
            fn sub(self, rhs: Self) -> Self {
                self.wrapping_sub(rhs)
            }
            #[inline(always)]
            fn mul(self, rhs: Self) -> Self {
                self.wrapping_mul(rhs)
            }
            #[inline(always)]
            fn div(self, rhs: Self) -> Self {
                if rhs == 0 {
                    0
                } else {
                    self.wrapping_div(rhs)
                }
            }
            #[inline(always)]
            fn maximum(self, rhs: Self) -> Self {
                self.max(rhs)
            }
            #[inline(always)]
            fn minimum(self, rhs: Self) -> Self {
                self.min(rhs)
            }
            #[inline(always)]
            fn to_f64(self) -> f64 {
                self as f64
            }
            #[inline(always)]
            fn from_f64(v: f64) -> Self {
                v as $t
            }
            #[inline(always)]
            fn to_index(self) -> Option<i64> {
                i64::try_from(self).ok()
            }
        }
    };
}

int_element!(u32, DType::U32);
int_element!(i64, DType::I64);

impl Element for f32 {
    const DTYPE: DType = DType::F32;
    #[inline(always)]
    fn zero() -> Self {
        0.0
    }
    #[inline(always)]
    fn one() -> Self {
        1.0
    }
    #[inline(always)]
    fn min_value() -> Self {
        f32::NEG_INFINITY
    }
    #[inline(always)]
    fn add(self, rhs: Self) -> Self {
        self + rhs
    }
    #[inline(always)]
    fn sub(self, rhs: Self) -> Self {
        self - rhs
    }
    #[inline(always)]
    fn mul(self, rhs: Self) -> Self {
        self * rhs
    }
    #[inline(always)]
    fn div(self, rhs: Self) -> Self {
        self / rhs
    }
    #[inline(always)]
    fn maximum(self, rhs: Self) -> Self {
        if self.is_nan() || self > rhs {
            self
        } else {
            rhs
        }
    }
    #[inline(always)]
    fn minimum(self, rhs: Self) -> Self {
        if self.is_nan() || self < rhs {
            self
        } else {
            rhs
        }
    }
    #[inline(always)]
    fn to_f64(self) -> f64 {
        self as f64
    }
    #[inline(always)]
    fn from_f64(v: f64) -> Self {
        v as f32
    }
    #[inline(always)]
    fn to_index(self) -> Option<i64> {
        None
    }
}
