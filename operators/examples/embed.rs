//! A sequential GP inside your own timely program: `cargo run --example embed -- -w 2`.
use dualgp_operators::dataflow::{LearnGp, Record};
use dualgp_operators::model::{Family, Kernel, Likelihood, SequentialConfig, SequentialLearner};
use dualgp_operators::timely::dataflow::operators::vec::Filter;
use dualgp_operators::timely::dataflow::operators::{Input, Inspect, Probe};
use dualgp_operators::timely::dataflow::{InputHandleVec, ProbeHandle};
use dualgp_operators::timely::execute_from_args;

fn main() {
    execute_from_args(std::env::args(), |worker| {
        let kernel = Kernel::stationary(Family::Matern52, 1.0, vec![0.5]);
        let likelihood = Likelihood::Gaussian { variance: 0.1 };
        let learner = SequentialLearner::new(kernel, likelihood, SequentialConfig::default()).unwrap();
        let (mut input, probe) = (InputHandleVec::new(), ProbeHandle::new());
        worker.dataflow::<u64, _, _>(|scope| {
            let gp = scope.input_from(&mut input).learn_gp(learner, 1);
            let sample = gp.predictions.filter(|p| p.id % 100 == 0);
            sample.inspect(|p| println!("{p:?}")).probe_with(&probe);
            gp.updates
                .inspect(|u| println!("epoch {}: {:?}", u.epoch, u.outcome))
                .probe_with(&probe);
        });
        for epoch in 0..5u64 {
            if worker.index() == 0 {
                for i in 0..200 {
                    let x = (i as f64 * 0.7 + epoch as f64).sin() * 3.0;
                    input.send(Record::new((epoch * 200 + i) as i64, vec![x], Some(x.sin())));
                }
            }
            input.advance_to(epoch + 1);
            while probe.less_than(input.time()) {
                worker.step_or_park(None);
            }
        }
    })
    .unwrap();
}
