//! What a kernel binding reads and writes: borrowed, typed slices of tensor elements.

use crate::ir::Element;

/// A borrowed, typed slice of tensor elements: what a kernel reads.
#[derive(Clone, Copy, Debug)]
pub enum Data<'a> {
    /// f32 elements.
    F32(&'a [f32]),
    /// u32 elements.
    U32(&'a [u32]),
    /// i64 elements.
    I64(&'a [i64]),
}

/// A mutably borrowed, typed slice of tensor elements: what a kernel writes.
#[derive(Debug)]
pub enum DataMut<'a> {
    /// f32 elements.
    F32(&'a mut [f32]),
    /// u32 elements.
    U32(&'a mut [u32]),
    /// i64 elements.
    I64(&'a mut [i64]),
}

/// Elements that can be viewed out of a [`Data`] or [`DataMut`] of their own type.
pub trait DataElement: Element {
    /// The slice if `data` holds this type.
    fn from_data(data: Data<'_>) -> Option<&[Self]>;
    /// The slice if `data` holds this type.
    fn from_data_mut(data: DataMut<'_>) -> Option<&mut [Self]>;
}

macro_rules! data_element {
    ($t:ty, $variant:ident) => {
        impl DataElement for $t {
            fn from_data(data: Data<'_>) -> Option<&[Self]> {
                match data {
                    Data::$variant(v) => Some(v),
                    _ => None,
                }
            }
            fn from_data_mut(data: DataMut<'_>) -> Option<&mut [Self]> {
                match data {
                    DataMut::$variant(v) => Some(v),
                    _ => None,
                }
            }
        }
    };
}

data_element!(f32, F32);
data_element!(u32, U32);
data_element!(i64, I64);
