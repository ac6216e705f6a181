//! Labels that arrive after the features: a differential-dataflow join by id.
//!
//! Features and labels are collections keyed by record id, each entry
//! retracted `ttl` epochs after it arrived; their join holds a labelled record
//! from the epoch both halves are present (the later of the two arrivals) until
//! either half expires. What the learner needs is the join's insertions: each
//! labelled record once, at the epoch its label completed it. Expiry bounds the
//! state: a record whose label never comes (or comes too late) is forgotten.

use differential_dataflow::AsCollection;
use timely::dataflow::channels::pact::Pipeline;
use timely::dataflow::operators::generic::Operator;
use timely::dataflow::StreamVec;

use super::record::Record;

/// Features of records that carry no label, and labels `(id, y)` as they come:
/// the labelled records, each at the epoch it became complete. Either half
/// waits at most `ttl` epochs for the other.
pub fn delayed_labels<'scope>(
    features: StreamVec<'scope, u64, Record>,
    labels: StreamVec<'scope, u64, (i64, f64)>,
    ttl: u64,
) -> StreamVec<'scope, u64, Record> {
    // Arrangements need ordered values: f64s travel as their bits.
    let features = expiring(features, ttl, |r: Record| {
        (r.label.is_none()).then(|| (r.id, r.features.iter().map(|v| v.to_bits()).collect::<Vec<u64>>()))
    });
    let labels = expiring(labels, ttl, |(id, y): (i64, f64)| Some((id, y.to_bits())));
    let joined = features.as_collection().join(labels.as_collection()).consolidate();
    joined.inner.unary(Pipeline, "GpCompleted", |_, _| {
        move |input, output| {
            input.for_each_stamp(|cap, data| {
                for ((id, (x, y)), time, diff) in data.flat_map(|d| d.drain(..)) {
                    if diff > 0 {
                        let features = x.into_iter().map(f64::from_bits).collect();
                        let record = Record::new(id, features, Some(f64::from_bits(y)));
                        output.session(&cap.delayed(&time, output.output_index())).give(record);
                    }
                }
            });
        }
    })
}

/// The updates of a collection whose entries leave `ttl` epochs after they came.
fn expiring<'scope, D, V>(
    stream: StreamVec<'scope, u64, D>,
    ttl: u64,
    mut keep: impl FnMut(D) -> Option<(i64, V)> + 'static,
) -> StreamVec<'scope, u64, ((i64, V), u64, isize)>
where
    D: Clone + 'static,
    V: Clone + 'static,
{
    stream.unary(Pipeline, "GpExpiring", move |_, _| {
        move |input, output| {
            input.for_each_stamp(|cap, data| {
                let Some(cap) = cap.retain_least(output.output_index()) else {
                    return;
                };
                let time = *cap.time();
                let mut session = output.session(&cap);
                for entry in data.flat_map(|d| d.drain(..)).filter_map(&mut keep) {
                    session.give((entry.clone(), time, 1));
                    session.give((entry, time.saturating_add(ttl.max(1)), -1));
                }
            });
        }
    })
}
