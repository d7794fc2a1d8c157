//! One row from its column values: the labels, the sample weight, the dense inputs, then
//! the slots in plan order. The line path and serving requests share this code.

use super::values::parse_sample_weight;
use super::{BadLine, Cell, LineParser};
use crate::batch::BatchBuilder;

impl LineParser {
    /// Appends the row whose column `c` holds `value_of(c)` (`None`: missing, as an empty
    /// value) and returns `Ok`, or appends nothing and says why the row is bad. The label
    /// columns are read (each must be 0 or 1) and the sample weight (a finite number `>= 0`,
    /// empty is 1), then the dense inputs and the slots in plan order; columns no feature
    /// reads are not asked for. `out` must be this parser's [`LineParser::builder`] (or
    /// shaped like it). The line path and serving requests share
    /// this code.
    pub fn parse_values<'v>(
        &self,
        mut value_of: impl FnMut(usize) -> Option<&'v [u8]>,
        out: &mut BatchBuilder,
    ) -> Result<(), BadLine> {
        self.parse_cells(|c| value_of(c).map(Cell::Text), out)
    }

    /// [`LineParser::parse_values`] with the values as [`Cell`]s: a decoded number or a
    /// pre-hashed text gives what its text would (a columnar reader's path).
    pub fn parse_cells<'v>(
        &self,
        mut cell_of: impl FnMut(usize) -> Option<Cell<'v>>,
        out: &mut BatchBuilder,
    ) -> Result<(), BadLine> {
        out.begin_row();
        let r = self.fill_row(&mut cell_of, out);
        match r {
            Ok(()) => out.end_row(),
            Err(_) => out.rollback(),
        }
        r
    }

    #[inline]
    fn fill_row<'v>(
        &self,
        cell_of: &mut impl FnMut(usize) -> Option<Cell<'v>>,
        out: &mut BatchBuilder,
    ) -> Result<(), BadLine> {
        let mut cell = |c| cell_of(c).unwrap_or(Cell::MISSING);
        for &c in &self.labels {
            match cell(c).label() {
                Some(l) => out.push_label(l),
                None => {
                    return Err(BadLine::BadLabel {
                        column: self.names[c].clone(),
                    })
                }
            }
        }
        if let Some(c) = self.weight {
            match cell(c).with_text(parse_sample_weight) {
                Some(w) => out.push_sample_weight(w),
                None => {
                    return Err(BadLine::BadSampleWeight {
                        column: self.names[c].clone(),
                    })
                }
            }
        }
        for d in &self.dense {
            let value = cell(d.column);
            let x = if value.is_empty() {
                0.0
            } else {
                match value
                    .number()
                    .and_then(|x| self.log1p.dense_value(d.transform, x))
                {
                    Some(x) => x,
                    None => return Err(self.bad_dense(d.column)),
                }
            };
            out.push_dense(x);
        }
        for s in &self.slots {
            self.push_slot(s, cell(s.column), out)?;
            out.end_field();
        }
        Ok(())
    }

    #[cold]
    pub(super) fn bad_dense(&self, column: usize) -> BadLine {
        BadLine::BadDense {
            column: self.names[column].clone(),
        }
    }
}
