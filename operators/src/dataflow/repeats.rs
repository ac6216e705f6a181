//! Ids that come more than once in an epoch. Within an epoch an id names one
//! observation: copies of a record (the same features and label, bit for
//! bit, as an at-least-once producer resends them) count once, and records
//! that share an id but differ are refused, all of them, because which came
//! first depends on timing and the outcome must not. Across epochs an id
//! that comes again is a new observation: scored and learned again. Every
//! record of an id meets the others at the worker that owns the id.

use std::collections::{HashMap, HashSet};

use super::record::{Record, Rejected};

fn same(a: &Record, b: &Record) -> bool {
    let bits = |r: &Record| {
        (
            r.label.map(f64::to_bits),
            r.features.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        )
    };
    bits(a) == bits(b)
}

fn copy(epoch: u64, record: Record) -> Rejected {
    let reason = format!("a copy of record {} already in epoch {epoch}: counted once", record.id);
    Rejected { epoch, record, reason }
}

fn conflicting(epoch: u64, record: Record, times: usize) -> Rejected {
    let reason = format!(
        "id {} came {times} times in epoch {epoch} with different features or labels: none of them is used",
        record.id
    );
    Rejected { epoch, record, reason }
}

/// One epoch's records, all of them at once (prequential scoring): the ones
/// to use, in their order, and the ones refused. The same whatever order
/// they came in.
pub(super) fn once_per_id(records: Vec<Record>, epoch: u64) -> (Vec<Record>, Vec<Rejected>) {
    let mut by_id: HashMap<i64, Vec<usize>> = HashMap::new();
    for (i, r) in records.iter().enumerate() {
        by_id.entry(r.id).or_default().push(i);
    }
    if by_id.len() == records.len() {
        return (records, Vec::new());
    }
    // Per record: used, a copy, or one of several that differ.
    let mut verdict = vec![Verdict::Used; records.len()];
    for rows in by_id.values().filter(|rows| rows.len() > 1) {
        let first = &records[rows[0]];
        let copies = rows[1..].iter().all(|&i| same(first, &records[i]));
        for (k, &i) in rows.iter().enumerate() {
            verdict[i] = match (copies, k) {
                (true, 0) => Verdict::Used,
                (true, _) => Verdict::Copy,
                (false, _) => Verdict::Conflicting(rows.len()),
            };
        }
    }
    let (mut used, mut refused) = (Vec::new(), Vec::new());
    for (record, verdict) in records.into_iter().zip(verdict) {
        match verdict {
            Verdict::Used => used.push(record),
            Verdict::Copy => refused.push(copy(epoch, record)),
            Verdict::Conflicting(times) => refused.push(conflicting(epoch, record, times)),
        }
    }
    (used, refused)
}

#[derive(Clone, Copy)]
enum Verdict {
    Used,
    Copy,
    Conflicting(usize),
}

/// Scoring on arrival: an epoch's records as they come. The first record of
/// an id is scored; a later one is refused at once (it has no prediction),
/// and if it differs from the first, the first is not learned from either.
#[derive(Default)]
pub(super) struct ArrivedIds {
    first: HashMap<i64, Record>,
    differing: HashSet<i64>,
}

impl ArrivedIds {
    /// `record` may be scored, or why not.
    pub fn admit(&mut self, record: Record, epoch: u64) -> Result<Record, Rejected> {
        match self.first.get(&record.id) {
            None => {
                self.first.insert(record.id, record.clone());
                Ok(record)
            }
            Some(first) if same(first, &record) => Err(copy(epoch, record)),
            Some(_) => {
                self.differing.insert(record.id);
                let reason = format!(
                    "id {} came again in epoch {epoch} with different features or label: neither is learned from",
                    record.id
                );
                Err(Rejected { epoch, record, reason })
            }
        }
    }

    /// Whether a record scored on arrival may be learned from at the epoch's end.
    pub fn learnable(&self, record: &Record) -> bool {
        !self.differing.contains(&record.id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(id: i64, x: f64, y: Option<f64>) -> Record {
        Record::new(id, vec![x], y)
    }

    #[test]
    fn copies_count_once_and_differing_records_are_all_refused_whatever_their_order() {
        let records = vec![
            r(1, 0.5, Some(1.0)),
            r(2, 0.1, None),
            r(1, 0.5, Some(1.0)),
            r(3, 0.0, Some(0.0)),
            r(3, 0.0, Some(1.0)),
        ];
        let mut reversed = records.clone();
        reversed.reverse();
        for input in [records, reversed] {
            let (used, refused) = once_per_id(input, 4);
            let mut ids: Vec<i64> = used.iter().map(|r| r.id).collect();
            ids.sort();
            assert_eq!(ids, [1, 2]);
            let mut why: Vec<(i64, bool)> = refused
                .iter()
                .map(|r| (r.record.id, r.reason.contains("copy")))
                .collect();
            why.sort();
            assert_eq!(why, [(1, true), (3, false), (3, false)]);
            assert!(refused.iter().all(|r| r.epoch == 4));
        }
    }

    #[test]
    fn on_arrival_the_first_is_scored_and_a_differing_repeat_stops_it_being_learned() {
        let mut ids = ArrivedIds::default();
        let first = ids.admit(r(1, 0.5, Some(1.0)), 0).unwrap();
        assert!(ids.admit(r(1, 0.5, Some(1.0)), 0).unwrap_err().reason.contains("copy"));
        assert!(ids.learnable(&first));
        ids.admit(r(1, 0.7, Some(1.0)), 0).unwrap_err();
        assert!(!ids.learnable(&first));
        assert!(ids.admit(r(2, 0.7, None), 0).is_ok());
    }
}
