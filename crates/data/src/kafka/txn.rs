//! Read committed, decided by the client from the transaction markers of one partition.
//!
//! The records of a transactional batch are held until their producer's next control batch
//! on the partition: COMMIT releases them, ABORT drops them. Records are released strictly in
//! offset order: a record after an undecided transactional record (of any producer, or of no
//! transaction) waits behind it. So the partition's position (the next offset to read on a
//! restart) never passes an undecided record: a restart reads it and its marker again. A
//! marker with nothing held (a restart after its records) changes nothing. Control records
//! are never released.
//!
//! This works whatever the broker does with `isolation_level = read_committed`: Apache Kafka
//! stops fetches at the last stable offset (every record below it is decided, its marker
//! below it too); Tansu 0.6 returns every record and lists no aborted transactions.

use std::collections::VecDeque;

/// The fate of a held record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fate {
    /// Its transaction is open.
    Open,
    Keep,
    Drop,
}

#[derive(Debug)]
struct Held<V> {
    offset: i64,
    value: V,
    /// The producer whose transaction it is in (`None`: not transactional).
    producer: Option<i64>,
    fate: Fate,
}

/// One partition's filter: records and markers go in in offset order, committed and plain
/// records come out in offset order.
#[derive(Debug)]
pub(crate) struct Committed<V> {
    held: VecDeque<Held<V>>,
    /// Released and not taken yet.
    out: Vec<(i64, V)>,
    /// The offset after everything seen so far.
    seen: i64,
}

impl<V> Committed<V> {
    /// A partition read from `start`.
    pub fn new(start: i64) -> Self {
        Committed {
            held: VecDeque::new(),
            out: Vec::new(),
            seen: start,
        }
    }

    /// A data record; `producer` is its producer id when its batch is transactional.
    pub fn record(&mut self, offset: i64, value: V, producer: Option<i64>) {
        self.saw(offset + 1);
        match producer {
            None if self.held.is_empty() => self.out.push((offset, value)),
            None => self.held.push_back(Held {
                offset,
                value,
                producer,
                fate: Fate::Keep,
            }),
            Some(_) => self.held.push_back(Held {
                offset,
                value,
                producer,
                fate: Fate::Open,
            }),
        }
    }

    /// `producer`'s marker at `offset`: its held records are committed or aborted.
    pub fn marker(&mut self, offset: i64, producer: i64, commit: bool) {
        self.saw(offset + 1);
        let fate = if commit { Fate::Keep } else { Fate::Drop };
        for h in &mut self.held {
            if h.fate == Fate::Open && h.producer == Some(producer) {
                h.fate = fate;
            }
        }
        while let Some(h) = self.held.front().filter(|h| h.fate != Fate::Open) {
            let keep = h.fate == Fate::Keep;
            let Some(h) = self.held.pop_front() else {
                break;
            };
            if keep {
                self.out.push((h.offset, h.value));
            }
        }
    }

    /// Every offset below `next` was read (a batch's end: past compacted or control records).
    pub fn saw(&mut self, next: i64) {
        self.seen = self.seen.max(next);
    }

    /// The next offset to read on a restart: the first undecided record, else past
    /// everything seen.
    pub fn position(&self) -> i64 {
        self.held.front().map_or(self.seen, |h| h.offset)
    }

    /// Records held (waiting for a marker, or behind a record that does).
    pub fn held(&self) -> usize {
        self.held.len()
    }

    /// The records released since the last call, in offset order, and the position after them.
    pub fn take(&mut self) -> (Vec<(i64, V)>, i64) {
        (std::mem::take(&mut self.out), self.position())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    #[test]
    fn a_commit_releases_and_an_abort_drops_its_producers_records() {
        let mut c = Committed::new(0);
        c.record(0, "a0", Some(1));
        c.record(1, "b1", Some(2));
        c.record(2, "a2", Some(1));
        assert_eq!(c.take(), (vec![], 0));
        c.marker(3, 2, false);
        // b's records are dropped, but a's first record still blocks the rest.
        assert_eq!(c.take(), (vec![], 0));
        c.marker(4, 1, true);
        assert_eq!(c.take(), (vec![(0, "a0"), (2, "a2")], 5));
        assert_eq!(c.held(), 0);
    }

    #[test]
    fn a_plain_record_behind_an_open_transaction_waits() {
        let mut c = Committed::new(10);
        c.record(10, "p10", None);
        c.record(11, "t11", Some(7));
        c.record(12, "p12", None);
        assert_eq!(c.take(), (vec![(10, "p10")], 11));
        c.marker(13, 7, false);
        assert_eq!(c.take(), (vec![(12, "p12")], 14));
    }

    #[test]
    fn a_marker_with_nothing_held_is_ignored() {
        // A restart after the transaction's records: only its marker is read again.
        let mut c = Committed::new(20);
        c.marker(20, 3, false);
        c.record(21, "p21", None);
        assert_eq!(c.take(), (vec![(21, "p21")], 22));
    }

    #[test]
    fn the_position_passes_gaps_after_released_records() {
        let mut c: Committed<&str> = Committed::new(0);
        c.record(0, "p0", None);
        c.saw(5); // a batch ending at 4, records 1..4 compacted away
        assert_eq!(c.take(), (vec![(0, "p0")], 5));
    }

    /// A batch of the generated topic.
    #[derive(Clone, Debug)]
    enum Step {
        /// `n` records of `producer`'s transaction (`None`: plain records).
        Records(Option<u8>, u8),
        /// `producer`'s marker.
        Marker(u8, bool),
    }

    fn steps() -> impl Strategy<Value = Vec<Step>> {
        let step = prop_oneof![
            (prop::option::of(0u8..4), 1u8..4).prop_map(|(p, n)| Step::Records(p, n)),
            (0u8..4, any::<bool>()).prop_map(|(p, c)| Step::Marker(p, c)),
        ];
        prop::collection::vec(step, 0..40)
    }

    /// The topic the steps write: per offset, the record's producer (None: plain) or a marker.
    fn layout(steps: &[Step]) -> Vec<Result<Option<u8>, (u8, bool)>> {
        let mut out = Vec::new();
        for s in steps {
            match *s {
                Step::Records(p, n) => out.extend((0..n).map(|_| Ok(p))),
                Step::Marker(p, c) => out.push(Err((p, c))),
            }
        }
        out
    }

    /// The truth: the fate of each data record (Some(true): committed or plain; Some(false):
    /// aborted; None: undecided at the end).
    fn truth(topic: &[Result<Option<u8>, (u8, bool)>]) -> BTreeMap<i64, Option<bool>> {
        let mut fate = BTreeMap::new();
        for (o, e) in topic.iter().enumerate() {
            let o = o as i64;
            match *e {
                Ok(None) => {
                    fate.insert(o, Some(true));
                }
                Ok(Some(_)) => {
                    fate.insert(o, None);
                }
                Err((p, commit)) => {
                    for (&at, f) in fate.iter_mut() {
                        if f.is_none() && topic[at as usize] == Ok(Some(p)) {
                            *f = Some(commit);
                        }
                    }
                }
            }
        }
        fate
    }

    fn feed(c: &mut Committed<i64>, topic: &[Result<Option<u8>, (u8, bool)>], from: i64) {
        for (o, e) in topic.iter().enumerate().skip(from as usize) {
            let o = o as i64;
            match *e {
                Ok(p) => c.record(o, o, p.map(i64::from)),
                Err((p, commit)) => c.marker(o, i64::from(p), commit),
            }
        }
    }

    proptest! {
        /// Any interleaving of committed, aborted, open and plain batches of several producers:
        /// the output is exactly the committed and plain records before the first undecided
        /// one, in offset order, and every position taken is at or before the first undecided
        /// record (and past every record released).
        #[test]
        fn only_committed_and_plain_records_come_out_in_offset_order(
            steps in steps(),
            take_every in 1usize..6,
        ) {
            let topic = layout(&steps);
            let fate = truth(&topic);
            let first_open = fate.iter().find(|(_, f)| f.is_none()).map(|(&o, _)| o);
            let want: Vec<i64> = fate
                .iter()
                .filter(|(&o, f)| **f == Some(true) && first_open.is_none_or(|u| o < u))
                .map(|(&o, _)| o)
                .collect();
            let mut c = Committed::new(0);
            let mut got = Vec::new();
            for (o, e) in topic.iter().enumerate() {
                feed_one(&mut c, o as i64, *e);
                if o % take_every == 0 {
                    let (recs, pos) = c.take();
                    got.extend(recs.iter().map(|r| r.0));
                    prop_assert!(first_open.is_none_or(|u| pos <= u), "position {} passes {:?}", pos, first_open);
                    prop_assert!(got.last().is_none_or(|&l| pos > l));
                }
            }
            let (recs, pos) = c.take();
            got.extend(recs.iter().map(|r| r.0));
            prop_assert_eq!(&got, &want);
            prop_assert_eq!(pos, first_open.unwrap_or(topic.len() as i64));
        }

        /// A restart at any position taken reads the rest: the records released before it and
        /// after it are together exactly the committed and plain ones, each once.
        #[test]
        fn a_restart_at_any_position_releases_each_record_once(
            steps in steps(),
            cut in 0usize..200,
        ) {
            let topic = layout(&steps);
            let mut c = Committed::new(0);
            let mut positions = vec![(0i64, 0usize)];
            let mut out: Vec<i64> = Vec::new();
            for (o, e) in topic.iter().enumerate() {
                feed_one(&mut c, o as i64, *e);
                let (recs, pos) = c.take();
                out.extend(recs.iter().map(|r| r.0));
                positions.push((pos, out.len()));
            }
            let (at, before) = positions[cut % positions.len()];
            let mut again = Committed::new(at);
            feed(&mut again, &topic, at);
            let (rest, _) = again.take();
            let mut got: Vec<i64> = out[..before].to_vec();
            got.extend(rest.iter().map(|r| r.0));
            prop_assert_eq!(got, out);
        }
    }

    fn feed_one(c: &mut Committed<i64>, o: i64, e: Result<Option<u8>, (u8, bool)>) {
        match e {
            Ok(p) => c.record(o, o, p.map(i64::from)),
            Err((p, commit)) => c.marker(o, i64::from(p), commit),
        }
    }
}
