//! Forgetting raw feature values (`sparta forget`, right to erasure): a raw value of a feature
//! mapped to the (physical table, key) pairs training gives it rows under, through the
//! readers' own id function ([`sparta_data::feature_id`]) and the job's feature plan.

use sparta_data::features::SlotKind;

use crate::error::CoreError;
use crate::features::Features;

/// The (physical table, key) pairs of raw value `value` of sparse feature `feature` (an `id`,
/// `bag` or `sequence` feature: a `[[features]]` name, or the column name of a job without
/// `[[features]]`); `None`: of every such feature. A bag or sequence value is one item, without
/// separator or weight. A key of a table with a `wide` feature is in the wide table too.
/// Features sharing a table give the same pairs once. Refused: an empty value (the missing
/// id, shared by every row without a value), an unknown feature, a `buckets` feature (a bucket
/// is shared by every number in its range, not one person's id).
pub fn keys_of(
    features: &Features,
    feature: Option<&str>,
    value: &str,
) -> Result<Vec<(usize, u64)>, CoreError> {
    if value.is_empty() {
        return Err(CoreError::Config(
            "an empty value (the missing id of a feature, not anyone's id)".into(),
        ));
    }
    let slots: Vec<usize> = match feature {
        Some(name) => {
            let j = features
                .plan
                .slots
                .iter()
                .position(|s| s.name == name)
                .ok_or_else(|| {
                    CoreError::Config(format!(
                        "unknown feature {name:?} (sparse features: {})",
                        features
                            .plan
                            .slots
                            .iter()
                            .map(|s| s.name.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ))
                })?;
            if let SlotKind::Buckets { .. } = features.plan.slots[j].kind {
                return Err(CoreError::Config(format!(
                    "feature {name:?} is a numeric feature cut into buckets: a bucket's row is \
                     shared by every value in its range, not one id's"
                )));
            }
            vec![j]
        }
        None => (0..features.plan.slots.len())
            .filter(|&j| !matches!(features.plan.slots[j].kind, SlotKind::Buckets { .. }))
            .collect(),
    };
    let mut out = Vec::new();
    for j in slots {
        let (slot, layout) = (&features.plan.slots[j], &features.slots[j]);
        let key = sparta_data::feature_id(slot.tag, value.as_bytes());
        out.push((layout.physical, key));
        if let (Some(w), true) = (features.wide_table, features.tables[layout.table].wide) {
            out.push((w, key));
        }
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::JobConfig;

    #[test]
    fn a_value_maps_to_the_keys_the_readers_give_it_in_every_table_holding_it() {
        let job = JobConfig::default().validate().unwrap();
        let f = &job.features;
        let c3 = f.plan.slots.iter().position(|s| s.name == "C3").unwrap();
        let tag = f.plan.slots[c3].tag;
        let key = sparta_data::feature_id(tag, b"68fd1e64");
        // The parser's id of the same value in the same column.
        let mut want = vec![(f.slots[c3].physical, key)];
        if let Some(w) = f.wide_table {
            want.push((w, key));
        }
        want.sort_unstable();
        assert_eq!(keys_of(f, Some("C3"), "68fd1e64").unwrap(), want);
        // A bare value: one key per sparse feature (each its own key space).
        let all = keys_of(f, None, "68fd1e64").unwrap();
        let per = want.len();
        assert_eq!(all.len(), f.plan.slots.len() * per);
        assert!(all.contains(&want[0]));
        let e = keys_of(f, Some("C99"), "x").unwrap_err().to_string();
        assert!(
            e.contains("unknown feature \"C99\"") && e.contains("C26"),
            "{e}"
        );
        assert!(keys_of(f, Some("C3"), "").is_err());
    }
}
