//! The columns of a Parquet file that are read, from its schema: a root field found by name,
//! its shape (a value or a list of values) and how its values become text.
//!
//! Read (see [`crate::parquet`]): BOOLEAN; INT32 and INT64, plain or with a signed or unsigned
//! INT logical type (`UINT_8`..`UINT_64` print unsigned); FLOAT; DOUBLE; BYTE_ARRAY (strings,
//! enums, JSON, binary); FIXED_LEN_BYTE_ARRAY without a logical type (or a UUID): its bytes;
//! dictionary-encoded or not (that is a page encoding, not a type). Lists: a 3-level `LIST`
//! (`group (LIST) { repeated group list { T element } }`), the legacy 2-level one
//! (`group (LIST) { repeated T element }`) and a bare `repeated T`. Not read: decimals,
//! dates, times, timestamps, INT96, FLOAT16, intervals, structs, maps, nested lists.

use parquet::basic::{ConvertedType, LogicalType, Repetition, Type as Physical};
use parquet::schema::types::{SchemaDescriptor, Type};

/// How the values of a leaf column become text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ValueText {
    Bool,
    /// INT32 narrowed to the logical type's width and sign.
    Int32(Int32As),
    /// INT64, unsigned for `UINT_64` / `INT(64, false)`.
    Int64 {
        unsigned: bool,
    },
    Float,
    Double,
    /// BYTE_ARRAY: its bytes.
    Bytes,
    /// FIXED_LEN_BYTE_ARRAY: its bytes.
    Fixed,
}

/// The integer type an INT32 column holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Int32As {
    I8,
    I16,
    I32,
    U8,
    U16,
    U32,
}

/// Where a row's value sits in the definition (and repetition) levels of its leaf.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Shape {
    /// One value per row: present at definition level `max_def` (always when 0).
    Value { max_def: i16 },
    /// A list per row (repetition level 1 continues it): an item exists from definition
    /// level `item_at` on (below it the list is null or empty), and has a value at `max_def`
    /// (a null item below it).
    List { item_at: i16, max_def: i16 },
}

/// A root field that is read: its leaf column, shape and value type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Leaf {
    /// Index of the leaf column in the file's schema (and in each row group's columns).
    pub index: usize,
    pub shape: Shape,
    pub text: ValueText,
}

/// The root field `name` of `schema` (the first of that name), read as a [`Leaf`].
/// `Ok(None)`: no such field; `Err(type)`: it is of a type that is not read (`type` says which).
pub(crate) fn find(schema: &SchemaDescriptor, name: &str) -> Result<Option<Leaf>, String> {
    let roots = schema.root_schema().get_fields();
    let Some(root) = roots.iter().position(|f| f.name() == name) else {
        return Ok(None);
    };
    let field = &roots[root];
    let (element, list) = layout(field).ok_or_else(|| describe(field))?;
    let text = value_text(element).ok_or_else(|| describe(field))?;
    // The one leaf of a readable root.
    let index = (0..schema.num_columns())
        .find(|&i| schema.get_column_root_idx(i) == root)
        .ok_or_else(|| describe(field))?;
    let column = schema.column(index);
    let max_def = column.max_def_level();
    let shape = match list {
        false if column.max_rep_level() == 0 => Shape::Value { max_def },
        true if column.max_rep_level() == 1 => {
            let null_item = repetition(element) == Repetition::OPTIONAL;
            Shape::List {
                item_at: max_def - i16::from(null_item),
                max_def,
            }
        }
        _ => return Err(describe(field)),
    };
    Ok(Some(Leaf { index, shape, text }))
}

/// The primitive element of a root field and whether it is a list of them; `None` for a
/// field that is neither (a struct, a map, a list of structs or lists).
fn layout(field: &Type) -> Option<(&Type, bool)> {
    let info = field.get_basic_info();
    if field.is_primitive() {
        // A bare `repeated T` is a list of required items.
        return Some((field, repetition(field) == Repetition::REPEATED));
    }
    let is_list = info.converted_type() == ConvertedType::LIST
        || matches!(info.logical_type_ref(), Some(LogicalType::List));
    if !is_list || repetition(field) == Repetition::REPEATED {
        return None;
    }
    let [repeated] = field.get_fields() else {
        return None;
    };
    if repetition(repeated) != Repetition::REPEATED {
        return None;
    }
    if repeated.is_primitive() {
        // 2-level: `group (LIST) { repeated T element }`.
        return Some((repeated, true));
    }
    // 3-level: `group (LIST) { repeated group list { T element } }`; a repeated group of
    // several fields, or named `array` / `<name>_tuple`, is a struct item (not read).
    let [element] = repeated.get_fields() else {
        return None;
    };
    let tuple = repeated.name() == "array" || repeated.name() == format!("{}_tuple", field.name());
    let element_repetition = repetition(element);
    (element.is_primitive() && !tuple && element_repetition != Repetition::REPEATED)
        .then_some((element, true))
}

/// The repetition of `t` (a field without one, as a malformed file may have, is required).
fn repetition(t: &Type) -> Repetition {
    let info = t.get_basic_info();
    if info.has_repetition() {
        info.repetition()
    } else {
        Repetition::REQUIRED
    }
}

/// How the values of the primitive `t` become text; `None` for a type that is not read.
fn value_text(t: &Type) -> Option<ValueText> {
    let info = t.get_basic_info();
    let (logical, converted) = (info.logical_type_ref(), info.converted_type());
    Some(match t.get_physical_type() {
        Physical::BOOLEAN if logical.is_none() => ValueText::Bool,
        Physical::INT32 => ValueText::Int32(match (logical, converted) {
            (None, ConvertedType::NONE | ConvertedType::INT_32) => Int32As::I32,
            (None, ConvertedType::INT_8) => Int32As::I8,
            (None, ConvertedType::INT_16) => Int32As::I16,
            (None, ConvertedType::UINT_8) => Int32As::U8,
            (None, ConvertedType::UINT_16) => Int32As::U16,
            (None, ConvertedType::UINT_32) => Int32As::U32,
            (
                Some(LogicalType::Integer {
                    bit_width,
                    is_signed,
                }),
                _,
            ) => match (bit_width, is_signed) {
                (8, true) => Int32As::I8,
                (16, true) => Int32As::I16,
                (32, true) => Int32As::I32,
                (8, false) => Int32As::U8,
                (16, false) => Int32As::U16,
                (32, false) => Int32As::U32,
                _ => return None,
            },
            _ => return None,
        }),
        Physical::INT64 => match (logical, converted) {
            (None, ConvertedType::NONE | ConvertedType::INT_64) => {
                ValueText::Int64 { unsigned: false }
            }
            (None, ConvertedType::UINT_64) => ValueText::Int64 { unsigned: true },
            (
                Some(LogicalType::Integer {
                    bit_width: 64,
                    is_signed,
                }),
                _,
            ) => ValueText::Int64 {
                unsigned: !is_signed,
            },
            _ => return None,
        },
        Physical::FLOAT if logical.is_none() => ValueText::Float,
        Physical::DOUBLE if logical.is_none() => ValueText::Double,
        Physical::BYTE_ARRAY => match (logical, converted) {
            (
                Some(
                    LogicalType::String
                    | LogicalType::Enum
                    | LogicalType::Json
                    | LogicalType::Bson
                    | LogicalType::Geometry { .. }
                    | LogicalType::Geography { .. }
                    | LogicalType::_Unknown { .. },
                ),
                _,
            ) => ValueText::Bytes,
            (
                None,
                ConvertedType::NONE
                | ConvertedType::UTF8
                | ConvertedType::ENUM
                | ConvertedType::JSON
                | ConvertedType::BSON,
            ) => ValueText::Bytes,
            _ => return None,
        },
        Physical::FIXED_LEN_BYTE_ARRAY => match (logical, converted) {
            (None | Some(LogicalType::Uuid), ConvertedType::NONE) => ValueText::Fixed,
            _ => return None,
        },
        _ => return None,
    })
}

/// The type of a root field as the Parquet schema says it (for an error).
fn describe(field: &Type) -> String {
    let info = field.get_basic_info();
    let annotation = match (info.logical_type_ref(), info.converted_type()) {
        (Some(l), _) => format!(" ({})", logical_name(l)),
        (None, ConvertedType::NONE) => String::new(),
        (None, c) => format!(" ({c})"),
    };
    let repeated = if repetition(field) == Repetition::REPEATED {
        "repeated "
    } else {
        ""
    };
    if field.is_primitive() {
        return format!("{repeated}{}{annotation}", field.get_physical_type());
    }
    let inner: Vec<String> = field.get_fields().iter().map(|f| describe(f)).collect();
    format!("{repeated}group{annotation} {{ {} }}", inner.join(", "))
}

/// A logical type's name as Parquet's docs spell it.
fn logical_name(l: &LogicalType) -> String {
    match l {
        LogicalType::String => "STRING".into(),
        LogicalType::Map => "MAP".into(),
        LogicalType::List => "LIST".into(),
        LogicalType::Enum => "ENUM".into(),
        LogicalType::Decimal { scale, precision } => format!("DECIMAL({precision},{scale})"),
        LogicalType::Date => "DATE".into(),
        LogicalType::Time { unit, .. } => format!("TIME({unit:?})"),
        LogicalType::Timestamp { unit, .. } => format!("TIMESTAMP({unit:?})"),
        LogicalType::Integer {
            bit_width,
            is_signed,
        } => format!("INT({bit_width},{is_signed})"),
        LogicalType::Unknown => "UNKNOWN".into(),
        LogicalType::Json => "JSON".into(),
        LogicalType::Bson => "BSON".into(),
        LogicalType::Uuid => "UUID".into(),
        LogicalType::Float16 => "FLOAT16".into(),
        other => format!("{other:?}"),
    }
}

/// What a column must be to be read (the end of the error for one that is not).
pub(crate) const READ_TYPES: &str = "expected BOOLEAN, INT32 or INT64 (plain or a signed or \
     unsigned INT), FLOAT, DOUBLE, BYTE_ARRAY (strings or binary) or FIXED_LEN_BYTE_ARRAY \
     (binary), dictionary-encoded or not, or a LIST of them";

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use parquet::schema::parser::parse_message_type;

    use super::*;

    fn schema(message: &str) -> SchemaDescriptor {
        SchemaDescriptor::new(Arc::new(parse_message_type(message).unwrap()))
    }

    #[test]
    fn values_lists_and_legacy_lists_are_found_by_name_with_their_levels() {
        let s = schema(
            "message m {
                required int32 a (INTEGER(8, true));
                optional int64 b (INTEGER(64, false));
                optional int32 c (UINT_16);
                optional group tags (LIST) { repeated group list { optional binary element (STRING); } }
                required group two (LIST) { repeated int32 element; }
                repeated double bare;
                optional group strict (LIST) { repeated group list { required float element; } }
                optional fixed_len_byte_array(4) f;
                optional boolean yes;
            }",
        );
        let leaf = |name| find(&s, name).unwrap().unwrap();
        assert_eq!(
            leaf("a"),
            Leaf {
                index: 0,
                shape: Shape::Value { max_def: 0 },
                text: ValueText::Int32(Int32As::I8)
            }
        );
        assert_eq!(leaf("b").text, ValueText::Int64 { unsigned: true });
        assert_eq!(leaf("b").shape, Shape::Value { max_def: 1 });
        assert_eq!(leaf("c").text, ValueText::Int32(Int32As::U16));
        let tags = leaf("tags");
        assert_eq!((tags.index, tags.text), (3, ValueText::Bytes));
        assert_eq!(
            tags.shape,
            Shape::List {
                item_at: 2,
                max_def: 3
            }
        );
        assert_eq!(
            leaf("two").shape,
            Shape::List {
                item_at: 1,
                max_def: 1
            }
        );
        assert_eq!(
            leaf("bare").shape,
            Shape::List {
                item_at: 1,
                max_def: 1
            }
        );
        assert_eq!(
            leaf("strict").shape,
            Shape::List {
                item_at: 2,
                max_def: 2
            }
        );
        assert_eq!(leaf("f").text, ValueText::Fixed);
        assert_eq!(leaf("yes").text, ValueText::Bool);
        assert_eq!(find(&s, "nope").unwrap(), None);
    }

    #[test]
    fn types_that_are_not_read_are_described() {
        let s = schema(
            "message m {
                optional int32 d (DATE);
                optional int64 t (TIMESTAMP(MICROS, true));
                optional int96 old;
                optional binary money (DECIMAL(10, 2));
                optional group point { required double x; required double y; }
                optional group m (MAP) { repeated group key_value { required binary key (STRING); optional int32 value; } }
                optional group nested (LIST) { repeated group list { optional group element (LIST) { repeated int32 element; } } }
                optional group pairs (LIST) { repeated group array { required int32 x; } }
            }",
        );
        let why = |name| find(&s, name).unwrap_err();
        assert_eq!(why("d"), "INT32 (DATE)");
        assert_eq!(why("t"), "INT64 (TIMESTAMP(MICROS))");
        assert_eq!(why("old"), "INT96");
        assert_eq!(why("money"), "BYTE_ARRAY (DECIMAL(10,2))");
        assert_eq!(why("point"), "group { DOUBLE, DOUBLE }");
        assert!(why("m").starts_with("group (MAP) {"), "{}", why("m"));
        assert!(
            why("nested").starts_with("group (LIST) {"),
            "{}",
            why("nested")
        );
        assert_eq!(why("pairs"), "group (LIST) { repeated group { INT32 } }");
    }
}
