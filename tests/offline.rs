//! Offline (t-SVGP) training on real data against the figures the project
//! promises: banana (classification) and elevators (regression, paper-uci).

use dualgp::connectors::{shared_data, ColumnSpec, Table};
use dualgp::model::{evaluate, fit_offline, Data, Family, Kernel, Likelihood, Link, OfflineConfig};
use dualgp::pipelines::protocol::{fold_split, prepare, Order, Prepared, Split};
use nalgebra::DVector;

fn table(name: &str) -> Table {
    let path = shared_data(&format!("{name}.parquet")).unwrap_or_else(|e| panic!("{e}"));
    Table::read(path, &ColumnSpec::default()).unwrap()
}

fn train_test(p: &Prepared) -> (Data, Data) {
    let train = Data::new(p.x_train.clone(), p.y_train.clone()).unwrap();
    let test = Data::new(p.x_test.clone(), p.y_test.clone()).unwrap();
    (train, test)
}

#[test]
fn banana_offline_classifier_reaches_the_promised_accuracy_and_nlpd() {
    let split = Split::new(table("banana_train"), table("banana_test")).unwrap();
    let (train, test) = train_test(&prepare(&split, &Order::Id, 1, false).unwrap());
    let kernel = Kernel::stationary(Family::Matern52, 1.0, vec![1.0]);
    let lik = Likelihood::Bernoulli { link: Link::Probit };
    let model = fit_offline(kernel, lik, &train, 50, &OfflineConfig::default()).unwrap();
    let metrics = evaluate(&model.posterior, &model.likelihood, &test).unwrap();
    eprintln!("banana: {metrics:?}, objective {:?}", model.objective);
    assert!(metrics.accuracy.unwrap() >= 0.88, "{metrics:?}");
    assert!(metrics.nlpd <= 0.30, "{metrics:?}");
}

#[test]
fn elevators_offline_regression_reaches_the_paper_nlpd_on_three_folds() {
    let table = table("elevators");
    let mut nlpds = Vec::new();
    for fold in 0..3 {
        let split = fold_split(&table, fold).unwrap();
        let (train, test) = train_test(&prepare(&split, &Order::Id, 1, true).unwrap());
        let kernel = Kernel::stationary(Family::Matern52, 1.0, vec![1.0; train.d()]);
        let lik = Likelihood::Gaussian { variance: 0.1 };
        let config = OfflineConfig {
            rounds: 1,
            m_steps: 30,
            ..OfflineConfig::default()
        };
        let model = fit_offline(kernel, lik, &train, 100, &config).unwrap();
        let metrics = evaluate(&model.posterior, &model.likelihood, &test).unwrap();
        eprintln!("elevators fold {fold}: {metrics:?}");
        nlpds.push(metrics.nlpd);
    }
    let mean = DVector::from_vec(nlpds.clone()).mean();
    assert!(mean <= 0.53, "mean test NLPD {mean} over folds 0–2: {nlpds:?}");
}
