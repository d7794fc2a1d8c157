//! What a slot makes of its column's value: an id, a bag (weighted or not), a sequence of the
//! most recent items, or the bucket of a number.

use super::dense::bucket_id;
use super::parser::{SlotOp, SlotStep};
use super::values::{parse_number, parse_weight};
use super::{BadLine, LineParser};
use crate::batch::BatchBuilder;
use crate::ids::{feature_id, missing_id};

impl LineParser {
    /// Appends the ids (and weights) slot `s` makes of `value` to the current field of `out`
    /// (the caller ends the field), or says why the value is bad.
    #[inline]
    pub(super) fn push_slot(
        &self,
        s: &SlotStep,
        value: &[u8],
        out: &mut BatchBuilder,
    ) -> Result<(), BadLine> {
        let tag = s.tag;
        match &s.op {
            SlotOp::Id => out.push_id(if value.is_empty() {
                missing_id(tag)
            } else {
                feature_id(tag, value)
            }),
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
            SlotOp::Buckets { boundaries } => {
                let id = if value.is_empty() {
                    missing_id(tag)
                } else {
                    match parse_number(value) {
                        Some(x) => bucket_id(tag, boundaries, x),
                        None => return Err(self.bad_dense(s.column)),
                    }
                };
                out.push_id(id);
            }
        }
        Ok(())
    }
}
