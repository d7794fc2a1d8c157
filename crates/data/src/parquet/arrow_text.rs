//! The values of an Arrow array as the text a line would hold (see [`crate::parquet`]): the
//! record batches handed in ([`super::RecordRows`]) become rows through the same text as a
//! Parquet file's values (the same writers, [`super::text`]).

use arrow_array::cast::AsArray;
use arrow_array::types::{
    Float32Type, Float64Type, Int16Type, Int32Type, Int64Type, Int8Type, UInt16Type, UInt32Type,
    UInt64Type, UInt8Type,
};
use arrow_array::{Array, ArrowPrimitiveType, OffsetSizeTrait, PrimitiveArray};
use arrow_schema::DataType;

use super::text::{write_bool, write_float, write_int};

/// The values of one Arrow column as the text a line would hold.
pub(crate) trait TextValues {
    /// Appends the text of value `i` (nothing for a null).
    fn write(&self, i: usize, out: &mut Vec<u8>);
}

/// Integers as decimal text.
struct Integers<'a, T: ArrowPrimitiveType>(&'a PrimitiveArray<T>);

impl<T: ArrowPrimitiveType> TextValues for Integers<'_, T>
where
    T::Native: std::fmt::Display,
{
    fn write(&self, i: usize, out: &mut Vec<u8>) {
        if self.0.is_valid(i) {
            write_int(self.0.value(i), out);
        }
    }
}

/// Floats as their shortest round-trip decimal text (NaN: missing, see [`write_float`]).
struct Floats<'a, T: ArrowPrimitiveType>(&'a PrimitiveArray<T>);

impl<T: ArrowPrimitiveType> TextValues for Floats<'_, T>
where
    T::Native: std::fmt::Display + Into<f64>,
{
    fn write(&self, i: usize, out: &mut Vec<u8>) {
        if self.0.is_valid(i) {
            write_float(self.0.value(i), out);
        }
    }
}

/// Booleans as `1` / `0`.
struct Bools<'a>(&'a arrow_array::BooleanArray);

impl TextValues for Bools<'_> {
    fn write(&self, i: usize, out: &mut Vec<u8>) {
        if self.0.is_valid(i) {
            write_bool(self.0.value(i), out);
        }
    }
}

/// Strings and binary values as their bytes.
struct Bytes<'a, A>(&'a A, fn(&'a A, usize) -> &'a [u8]);

impl<A: Array> TextValues for Bytes<'_, A> {
    fn write(&self, i: usize, out: &mut Vec<u8>) {
        if self.0.is_valid(i) {
            out.extend_from_slice((self.1)(self.0, i));
        }
    }
}

/// A dictionary-encoded column (pandas `category`, Polars `Categorical`) as the text of the
/// value each key points to.
struct Dictionary<'a> {
    keys: &'a dyn Array,
    /// The keys as indexes into `values` (0 where a key is null).
    index: Vec<usize>,
    values: Box<dyn TextValues + 'a>,
}

impl TextValues for Dictionary<'_> {
    fn write(&self, i: usize, out: &mut Vec<u8>) {
        if self.keys.is_valid(i) {
            self.values.write(self.index[i], out);
        }
    }
}

/// A list as its items' text joined by the column's separator.
struct Lists<'a, O: OffsetSizeTrait> {
    list: &'a arrow_array::GenericListArray<O>,
    items: Box<dyn TextValues + 'a>,
    sep: u8,
}

impl<O: OffsetSizeTrait> TextValues for Lists<'_, O> {
    fn write(&self, i: usize, out: &mut Vec<u8>) {
        if !self.list.is_valid(i) {
            return;
        }
        let offsets = self.list.value_offsets();
        let (a, b) = (offsets[i].as_usize(), offsets[i + 1].as_usize());
        for k in a..b {
            if k > a {
                out.push(self.sep);
            }
            self.items.write(k, out);
        }
    }
}

/// A column of a type that is not read (see [`crate::parquet`] for the types read).
#[derive(Debug, thiserror::Error)]
#[error("a column of type {0} is not read")]
pub(crate) struct UnreadType(DataType);

/// The text writer of `array` (lists joined by `sep`).
pub(crate) fn text_values(
    array: &dyn Array,
    sep: u8,
) -> Result<Box<dyn TextValues + '_>, UnreadType> {
    Ok(match array.data_type() {
        DataType::List(_) => {
            let list = array.as_list::<i32>();
            Box::new(Lists {
                list,
                items: scalar_values(list.values().as_ref())?,
                sep,
            })
        }
        DataType::LargeList(_) => {
            let list = array.as_list::<i64>();
            Box::new(Lists {
                list,
                items: scalar_values(list.values().as_ref())?,
                sep,
            })
        }
        _ => scalar_values(array)?,
    })
}

fn scalar_values(a: &dyn Array) -> Result<Box<dyn TextValues + '_>, UnreadType> {
    Ok(match a.data_type() {
        DataType::Boolean => Box::new(Bools(a.as_boolean())),
        DataType::Int8 => Box::new(Integers(a.as_primitive::<Int8Type>())),
        DataType::Int16 => Box::new(Integers(a.as_primitive::<Int16Type>())),
        DataType::Int32 => Box::new(Integers(a.as_primitive::<Int32Type>())),
        DataType::Int64 => Box::new(Integers(a.as_primitive::<Int64Type>())),
        DataType::UInt8 => Box::new(Integers(a.as_primitive::<UInt8Type>())),
        DataType::UInt16 => Box::new(Integers(a.as_primitive::<UInt16Type>())),
        DataType::UInt32 => Box::new(Integers(a.as_primitive::<UInt32Type>())),
        DataType::UInt64 => Box::new(Integers(a.as_primitive::<UInt64Type>())),
        DataType::Float32 => Box::new(Floats(a.as_primitive::<Float32Type>())),
        DataType::Float64 => Box::new(Floats(a.as_primitive::<Float64Type>())),
        DataType::Utf8 => Box::new(Bytes(a.as_string::<i32>(), |s, i| s.value(i).as_bytes())),
        DataType::LargeUtf8 => Box::new(Bytes(a.as_string::<i64>(), |s, i| s.value(i).as_bytes())),
        DataType::Utf8View => Box::new(Bytes(a.as_string_view(), |s, i| s.value(i).as_bytes())),
        DataType::Binary => Box::new(Bytes(a.as_binary::<i32>(), |s, i| s.value(i))),
        DataType::LargeBinary => Box::new(Bytes(a.as_binary::<i64>(), |s, i| s.value(i))),
        DataType::BinaryView => Box::new(Bytes(a.as_binary_view(), |s, i| s.value(i))),
        DataType::Dictionary(_, v) if !matches!(**v, DataType::Dictionary(..)) => {
            let d = a.as_any_dictionary();
            Box::new(Dictionary {
                keys: d.keys(),
                index: d.normalized_keys(),
                values: scalar_values(d.values().as_ref())?,
            })
        }
        other => return Err(UnreadType(other.clone())),
    })
}
