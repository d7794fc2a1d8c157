//! Line parser: one text line -> one row appended to a
//! [`BatchBuilder`](crate::batch::BatchBuilder), following an
//! [`InputPlan`](crate::features::InputPlan) (which columns become which slots and dense
//! inputs).
//!
//! A line is cut into its columns, then [`LineParser::parse_values`] makes the row from the
//! per-column values; serving requests call that too, with values taken from JSON, so a request
//! scores exactly as the same line would have trained.
//!
//! Hot path: no allocation per line or field (up to [`STACK_COLUMNS`] columns), `memchr` for
//! separators, integers parsed by hand, values hashed in place.
//!
//! Files, one job each:
//! * `bad_line` - [`BadLine`], why a line is rejected.
//! * `parser` - [`LineParser`]: built from a schema and a plan, and what it tells of its rows.
//! * `line` - cutting a line into its columns ([`LineParser::parse_line`]).
//! * `row` - one row from its column values ([`LineParser::parse_values`], or
//!   [`LineParser::parse_cells`] with [`Cell`]s): labels, sample weight, dense inputs, then
//!   the slots.
//! * `cell` - [`Cell`]: a value as its text or as a decoded number or pre-hashed text that
//!   stands for exactly that text (a columnar reader's values).
//! * `slots` - what a slot makes of its value: an id, a (weighted) bag, a sequence, buckets.
//! * `values` - scalar values: labels, sample weights, item weights, raw numbers.
//! * `dense` - dense transforms and buckets of a raw number.

mod bad_line;
mod cell;
mod dense;
mod line;
mod parser;
mod row;
mod slots;
mod values;

#[cfg(test)]
mod tests;

pub use bad_line::BadLine;
pub use cell::Cell;
pub use dense::{bucket_id, parse_dense};
pub use parser::LineParser;
pub use values::{parse_label, parse_number, parse_sample_weight};

/// Longest accepted line in bytes (without the line end).
pub const MAX_LINE_BYTES: usize = 1 << 20;

/// Largest accepted magnitude of a raw dense value (2^50 ~ 1.1e15: above any count or price;
/// a larger value is a unit error or garbage). A dense value beyond it, or one whose
/// transformed value is not a finite f32, makes its line malformed (`BadDense`, counted in
/// `bad_lines`) rather than training the model towards saturation.
pub const MAX_ABS_DENSE: f64 = (1u64 << 50) as f64;

/// Columns a line may have before splitting it needs a heap buffer.
pub const STACK_COLUMNS: usize = 64;
