//! What a slot makes of its column's value: an id, a bag (weighted or not), a sequence of the
//! most recent items, or the bucket of a number.

use super::dense::bucket_id;
use super::parser::{SlotOp, SlotStep};
use super::values::parse_weight;
use super::{BadLine, Cell, LineParser};
use crate::batch::BatchBuilder;
use crate::ids::{feature_id, missing_id};

impl LineParser {
    /// Appends the ids (and weights) slot `s` makes of `value` to the current field of `out`
    /// (the caller ends the field), or says why the value is bad.
    #[inline]
    pub(super) fn push_slot(
        &self,
        s: &SlotStep,
        cell: Cell<'_>,
        out: &mut BatchBuilder,
    ) -> Result<(), BadLine> {
        let tag = s.tag;
        match &s.op {
            SlotOp::Id => out.push_id(cell.id(tag)),
            SlotOp::Buckets { boundaries } => {
                let id = if cell.is_empty() {
                    missing_id(tag)
                } else {
                    match cell.number() {
                        Some(x) => bucket_id(tag, boundaries, x),
                        None => return Err(self.bad_dense(s.column)),
                    }
                };
                out.push_id(id);
            }
            _ => cell.with_text(|value| self.push_items(s, value, out))?,
        }
        Ok(())
    }

    /// The ids (and weights) of a slot of several items: a bag, a weighted bag, a sequence.
    #[inline]
    fn push_items(
        &self,
        s: &SlotStep,
        value: &[u8],
        out: &mut BatchBuilder,
    ) -> Result<(), BadLine> {
        let tag = s.tag;
        match &s.op {
            SlotOp::Id | SlotOp::Buckets { .. } => unreachable!("a slot of one value"),
            SlotOp::Bag { sep } => {
                let before = out.num_ids();
                for v in value.split(|b| b == sep) {
                    if !v.is_empty() {
                        out.push_id(feature_id(tag, v));
                    }
                }
                if out.num_ids() == before {
                    out.push_id(missing_id(tag));
                }
            }
            SlotOp::WeightedBag { sep, weight_sep } => {
                let before = out.num_ids();
                for item in value.split(|b| b == sep) {
                    let (v, w) = match memchr::memrchr(*weight_sep, item) {
                        Some(p) => match parse_weight(&item[p + 1..]) {
                            Some(w) => (&item[..p], w),
                            None => {
                                return Err(BadLine::BadWeight {
                                    column: self.names[s.column].clone(),
                                })
                            }
                        },
                        None => (item, 1.0),
                    };
                    if !v.is_empty() {
                        out.push_weighted_id(feature_id(tag, v), w);
                    }
                }
                if out.num_ids() == before {
                    out.push_id(missing_id(tag));
                }
            }
            SlotOp::Sequence { sep, max_len } => {
                // Newest first (from the end), then reversed: oldest first.
                let before = out.num_ids();
                for v in value
                    .rsplit(|b| b == sep)
                    .filter(|v| !v.is_empty())
                    .take(*max_len)
                {
                    out.push_id(feature_id(tag, v));
                }
                if out.num_ids() == before {
                    out.push_id(missing_id(tag));
                } else {
                    out.reverse_ids_from(before);
                }
            }
        }
        Ok(())
    }
}
