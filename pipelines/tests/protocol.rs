//! The "paper-uci" protocol's data preparation on the project's data sets.

use std::collections::BTreeMap;
use std::path::PathBuf;

use dualgp_connectors::{shared_data, ColumnSpec, Table};
use dualgp_pipelines::protocol::{batches, fold_split, order_rows, prepare, Order, ProtocolError, Split, Standardizer};
use nalgebra::{DMatrix, DVector};

/// A data file in `shared/data`; fails the test (never skips it) when `shared/` is missing.
fn data(name: &str) -> PathBuf {
    shared_data(name).unwrap_or_else(|e| panic!("{e}"))
}

fn read(name: &str) -> Table {
    Table::read(data(name), &ColumnSpec::default()).expect("read data file")
}

/// Column means and population standard deviations.
fn moments(x: &DMatrix<f64>) -> Vec<(f64, f64)> {
    x.column_iter()
        .map(|c| {
            let n = c.len() as f64;
            let m = c.sum() / n;
            let v = c.iter().map(|v| (v - m) * (v - m)).sum::<f64>() / n;
            (m, v.sqrt())
        })
        .collect()
}

/// A small hand-made table with ties in x0.
fn toy() -> Table {
    let x0 = [3.0, 1.0, 2.0, 1.0, 3.0, 0.5];
    let x1 = [10.0, 20.0, 30.0, 40.0, 50.0, 60.0];
    Table {
        ids: (100..106).collect(),
        folds: Some(vec![0, 1, 0, 1, 2, 2]),
        tasks: None,
        outputs: None,
        features: DMatrix::from_fn(6, 2, |i, j| if j == 0 { x0[i] } else { x1[i] }),
        feature_names: vec!["x0".into(), "x1".into()],
        labels: Some(vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]),
        metadata: BTreeMap::new(),
    }
}

#[test]
fn order_parses_and_round_trips() {
    assert_eq!("id".parse::<Order>().unwrap(), Order::Id);
    assert_eq!("shuffle:42".parse::<Order>().unwrap(), Order::Shuffle(42));
    assert_eq!("sorted:x0".parse::<Order>().unwrap(), Order::Sorted("x0".into()));
    for s in ["id", "shuffle:0", "shuffle:18446744073709551615", "sorted:x10"] {
        assert_eq!(s.parse::<Order>().unwrap().to_string(), s);
    }
    assert_eq!(Order::default(), Order::Id);
}

#[test]
fn order_parse_errors() {
    for (bad, hint) in [
        ("", "empty"),
        ("random", "unknown kind"),
        ("ID", "unknown kind"),
        ("id:3", "no argument"),
        ("shuffle", "needs a seed"),
        ("shuffle:", "needs a seed"),
        ("shuffle:abc", "non-negative integer"),
        ("shuffle:-1", "non-negative integer"),
        ("sorted", "needs a column"),
        ("sorted:", "needs a column"),
    ] {
        let err = bad.parse::<Order>().unwrap_err();
        assert!(matches!(err, ProtocolError::BadOrder { .. }), "{bad}: {err:?}");
        let msg = err.to_string();
        assert!(msg.contains(&format!("`{bad}`")), "{msg}");
        assert!(msg.contains(hint), "{bad}: {msg}");
        assert!(msg.contains("id, shuffle:SEED or sorted:COLUMN"), "{msg}");
    }
}

#[test]
fn fold_split_elevators() {
    let t = read("elevators.parquet");
    let folds = t.folds.clone().unwrap();
    for k in 0..10i8 {
        let s = fold_split(&t, k).unwrap();
        assert_eq!(s.train.n() + s.test.n(), t.n(), "fold {k}");
        assert!(s.test.n() >= 1659 && s.test.n() <= 1660);
        assert!(s.test.folds.as_ref().unwrap().iter().all(|&f| f == k));
        assert!(s.train.folds.as_ref().unwrap().iter().all(|&f| f != k));
        // Test rows are exactly fold k, in table order, with their features.
        let expected: Vec<i64> = (0..t.n()).filter(|&i| folds[i] == k).map(|i| t.ids[i]).collect();
        assert_eq!(s.test.ids, expected);
        let r = expected[0] as usize; // ids are row numbers in these files
        assert_eq!(s.test.features.row(0), t.features.row(r));
        assert_eq!(s.test.d(), 18);
    }
}

#[test]
fn fold_split_errors() {
    let t = toy();
    let err = fold_split(&t, 7).unwrap_err();
    assert_eq!(
        err,
        ProtocolError::EmptyFold {
            fold: 7,
            available: vec![0, 1, 2]
        }
    );
    assert!(err.to_string().contains("folds are 0, 1, 2"), "{err}");

    let mut one = toy();
    one.folds = Some(vec![4; 6]);
    assert_eq!(fold_split(&one, 4).unwrap_err(), ProtocolError::NoTrainRows { fold: 4 });

    let mut none = toy();
    none.folds = None;
    let err = fold_split(&none, 0).unwrap_err();
    assert_eq!(err, ProtocolError::NoFolds);
    assert!(err.to_string().contains("separate test file"));
}

#[test]
fn split_from_two_tables() {
    let train = read("banana_train.parquet");
    let test = read("banana_test.parquet");
    let s = Split::new(train.clone(), test).unwrap();
    assert_eq!((s.train.n(), s.test.n()), (400, 4900));

    let mut other = toy();
    other.feature_names = vec!["x0".into(), "x2".into()];
    let err = Split::new(train, other).unwrap_err();
    assert!(matches!(err, ProtocolError::FeatureMismatch { .. }));
    assert!(err.to_string().contains("x0,x1 vs x0,x2"), "{err}");
}

#[test]
fn standardised_with_train_statistics() {
    let t = read("elevators.parquet");
    let split = fold_split(&t, 3).unwrap();
    let p = prepare(&split, &Order::Shuffle(1), 10, true).unwrap();
    assert_eq!(p.n_train(), split.train.n());
    assert_eq!(p.n_test(), split.test.n());
    assert_eq!((p.x_train.ncols(), p.x_test.ncols()), (18, 18));
    for (j, (m, s)) in moments(&p.x_train).into_iter().enumerate() {
        assert!(m.abs() < 1e-12, "feature {j}: mean {m}");
        assert!((s - 1.0).abs() < 1e-12, "feature {j}: std {s}");
    }
    let (m, s) = moments(&DMatrix::from_column_slice(p.n_train(), 1, p.y_train.as_slice()))[0];
    assert!(m.abs() < 1e-12 && (s - 1.0).abs() < 1e-12, "y: {m} {s}");

    // The test set is scaled with the train statistics, not its own.
    let st = &p.standardizer;
    for j in 0..18 {
        for i in [0, 100, p.n_test() - 1] {
            let back = p.x_test[(i, j)] * st.x_std[j] + st.x_mean[j];
            let orig = split.test.features[(i, j)];
            assert!((back - orig).abs() <= 1e-12 * orig.abs().max(1.0));
        }
    }
    let y_test_orig = DVector::from_vec(split.test.labels.clone().unwrap());
    let back = st.inverse_y(&p.y_test);
    assert!((back - &y_test_orig).amax() <= 1e-12 * y_test_orig.amax().max(1.0));
    let var = st.inverse_y_var(&DVector::from_element(2, 1.0));
    assert_eq!(var[0], st.y_std * st.y_std);
    assert_ne!(moments(&p.x_test)[0].0, 0.0);

    // Rows stay paired with their targets: the train rows are the ordered table rows.
    let rows = order_rows(&split.train, &Order::Shuffle(1)).unwrap();
    assert_eq!(
        p.train_ids,
        rows.iter().map(|&r| split.train.ids[r]).collect::<Vec<_>>()
    );
    let y_orig = split.train.labels.as_ref().unwrap();
    for (i, &r) in rows.iter().enumerate().step_by(997) {
        let y = p.y_train[i] * st.y_std + st.y_mean;
        assert!((y - y_orig[r]).abs() <= 1e-12 * y_orig[r].abs().max(1.0));
    }
    assert_eq!(p.test_ids, split.test.ids);
}

#[test]
fn classification_labels_are_left_alone() {
    let split = Split::new(read("banana_train.parquet"), read("banana_test.parquet")).unwrap();
    let p = prepare(&split, &Order::Sorted("x0".into()), 10, false).unwrap();
    assert!(p.y_train.iter().all(|&y| y == 0.0 || y == 1.0));
    assert!(p.y_test.iter().all(|&y| y == 0.0 || y == 1.0));
    assert_eq!(p.standardizer.y_mean, 0.0);
    assert_eq!(p.standardizer.y_std, 1.0);
    assert_eq!(p.batches.len(), 10);
    assert!(p.batches.iter().all(|b| b.len() == 40));
    assert!(p.x_train.column(0).as_slice().is_sorted());
    let (xb, yb) = p.batch(9);
    assert_eq!((xb.nrows(), xb.ncols(), yb.len()), (40, 2, 40));
    assert_eq!(xb.row(0), p.x_train.row(360));
}

#[test]
fn shuffle_is_a_seeded_permutation() {
    let t = read("elevators.parquet");
    let a = order_rows(&t, &Order::Shuffle(7)).unwrap();
    let b = order_rows(&t, &Order::Shuffle(7)).unwrap();
    let c = order_rows(&t, &Order::Shuffle(8)).unwrap();
    assert_eq!(a, b, "same seed, same order");
    assert_ne!(a, c, "different seeds, different orders");
    let identity: Vec<usize> = (0..t.n()).collect();
    assert_ne!(a, identity);
    let mut sorted = a.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, identity, "a permutation");
    assert_eq!(order_rows(&t, &Order::Id).unwrap(), identity);
}

#[test]
fn sorted_is_non_decreasing_and_stable() {
    let t = read("elevators.parquet");
    let rows = order_rows(&t, &"sorted:x0".parse().unwrap()).unwrap();
    let x0 = t.features.column(0);
    for w in rows.windows(2) {
        assert!(x0[w[0]] <= x0[w[1]]);
        if x0[w[0]] == x0[w[1]] {
            assert!(w[0] < w[1], "ties keep file order");
        }
    }
    let mut sorted = rows.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (0..t.n()).collect::<Vec<_>>());

    assert_eq!(
        order_rows(&toy(), &Order::Sorted("x0".into())).unwrap(),
        [5, 1, 3, 2, 0, 4]
    );
    let err = order_rows(&toy(), &Order::Sorted("y".into())).unwrap_err();
    assert!(matches!(err, ProtocolError::UnknownColumn { .. }));
    assert!(err.to_string().contains("the features are x0, x1"), "{err}");
}

#[test]
fn batches_cover_rows_evenly() {
    for (n, k) in [(1, 1), (10, 10), (10, 3), (14939, 10), (400, 10), (7, 2), (1000, 999)] {
        let bs = batches(n, k).unwrap();
        assert_eq!(bs.len(), k);
        assert_eq!(bs[0].start, 0);
        assert_eq!(bs[k - 1].end, n);
        for w in bs.windows(2) {
            assert_eq!(w[0].end, w[1].start, "consecutive");
        }
        let sizes: Vec<usize> = bs.iter().map(|b| b.len()).collect();
        let (lo, hi) = (sizes.iter().min().unwrap(), sizes.iter().max().unwrap());
        assert!(*lo >= 1 && hi - lo <= 1, "{n}/{k}: {sizes:?}");
        assert_eq!(sizes.iter().sum::<usize>(), n);
    }
    assert_eq!(batches(10, 3).unwrap(), [0..4, 4..7, 7..10]);
    assert_eq!(batches(5, 0).unwrap_err(), ProtocolError::BadBatches { n: 5, k: 0 });
    assert_eq!(batches(5, 6).unwrap_err(), ProtocolError::BadBatches { n: 5, k: 6 });
    assert!(batches(0, 1).is_err());
    assert!(batches(5, 6).unwrap_err().to_string().contains("between 1 and 5"));
}

#[test]
fn prepare_errors() {
    let split = fold_split(&toy(), 2).unwrap();
    assert_eq!(split.train.n(), 4);
    assert!(matches!(
        prepare(&split, &Order::Id, 5, true),
        Err(ProtocolError::BadBatches { n: 4, k: 5 })
    ));
    assert!(matches!(
        prepare(&split, &Order::Sorted("x9".into()), 2, true),
        Err(ProtocolError::UnknownColumn { .. })
    ));
    let mut unlabelled = split.clone();
    unlabelled.test.labels = None;
    assert_eq!(
        prepare(&unlabelled, &Order::Id, 2, true).unwrap_err(),
        ProtocolError::NoLabels { side: "test" }
    );
    let p = prepare(&split, &Order::Sorted("x0".into()), 2, true).unwrap();
    assert_eq!(p.train_ids, [101, 103, 102, 100]);
    assert_eq!(p.batches, [0..2, 2..4]);
}

#[test]
fn standardizer_fit_matches_moments() {
    let t = read("banana_train.parquet");
    let s = Standardizer::fit(&t.features, t.labels.as_deref());
    let mo = moments(&t.features);
    assert_eq!(mo.len(), 2);
    for (j, (m, sd)) in mo.into_iter().enumerate() {
        assert!((s.x_mean[j] - m).abs() < 1e-14);
        assert!((s.x_std[j] - sd).abs() < 1e-14);
    }
    assert!((s.y_mean - 0.5).abs() < 0.2);
}
