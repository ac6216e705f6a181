//! Predictions and dead letters to Parquet: the replay contract's columns,
//! and a file that appears under its name only when complete.

mod common;

use std::fs::File;

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::{DataType, Int64Type, UInt64Type};
use common::{f64s, read_parquet};
use dualgp_connectors::{
    partial_path, DeadLetter, DeadLetterWriter, Origin, PredictionColumns, PredictionLayout, PredictionWriter, Reason,
    SinkError,
};
use dualgp_operators::dataflow::Prediction;
use dualgp_operators::model::{Likelihood, Link, Predictive};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

fn names(batch: &RecordBatch) -> Vec<String> {
    batch.schema().fields().iter().map(|f| f.name().clone()).collect()
}

fn moments(id: i64, epoch: u64) -> Prediction {
    Prediction {
        id,
        epoch,
        model_epoch: epoch.checked_sub(1),
        predictive: Predictive::Moments {
            mean: id as f64 * 0.5,
            var: 1.0 + id as f64,
        },
        log_density: None,
        output: None,
        all_outputs: Vec::new(),
    }
}

#[test]
fn moments_are_written_as_id_epoch_mean_var() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("predictions.parquet");
    let mut w = PredictionWriter::create(&path, PredictionLayout::Moments).unwrap();
    w.write(&(0..1000).map(|i| moments(i, i as u64 / 300)).collect::<Vec<_>>())
        .unwrap();
    w.write(&[]).unwrap();
    w.write(&[moments(1000, 3)]).unwrap();
    // Until finished, only the partial file exists.
    assert!(!path.exists());
    assert!(partial_path(&path).exists());
    assert_eq!(w.finish().unwrap(), 1001);
    assert!(path.exists() && !partial_path(&path).exists());

    let batch = read_parquet(&path);
    assert_eq!(names(&batch), ["id", "epoch", "mean", "var", "model_epoch"]);
    assert_eq!(batch.column(0).data_type(), &DataType::Int64);
    assert_eq!(batch.column(1).data_type(), &DataType::UInt64);
    let ids = batch.column(0).as_primitive::<Int64Type>().values().to_vec();
    assert_eq!(ids, (0..=1000).collect::<Vec<i64>>());
    let epochs = batch.column(1).as_primitive::<UInt64Type>();
    assert_eq!((epochs.value(299), epochs.value(300), epochs.value(1000)), (0, 1, 3));
    assert_eq!(f64s(&batch, "mean")[10], 5.0);
    assert_eq!(f64s(&batch, "var")[10], 11.0);
    let model_epochs = batch.column(4).as_primitive::<UInt64Type>();
    assert!(model_epochs.is_null(299));
    assert_eq!((model_epochs.value(300), model_epochs.value(1000)), (0, 2));
}

#[test]
fn bernoulli_writes_p1_and_softmax_every_class() {
    let dir = tempfile::tempdir().unwrap();
    let classes = |id, probs: Vec<f64>| Prediction {
        id,
        epoch: 0,
        model_epoch: None,
        predictive: Predictive::Classes(probs),
        log_density: None,
        output: None,
        all_outputs: Vec::new(),
    };
    let bernoulli = Likelihood::Bernoulli { link: Link::Probit };
    let layout = PredictionLayout::for_likelihood(&bernoulli);
    assert_eq!(layout, PredictionLayout::Bernoulli);
    let path = dir.path().join("bernoulli.parquet");
    let mut w = PredictionWriter::create(&path, layout).unwrap();
    w.write(&[classes(7, vec![0.25, 0.75]), classes(8, vec![0.9, 0.1])])
        .unwrap();
    w.finish().unwrap();
    let batch = read_parquet(&path);
    assert_eq!(names(&batch), ["id", "epoch", "p1", "model_epoch"]);
    assert_eq!(f64s(&batch, "p1"), [0.75, 0.1]);

    let path = dir.path().join("softmax.parquet");
    let mut w = PredictionWriter::create(&path, PredictionLayout::Classes(3)).unwrap();
    w.write(&[classes(1, vec![0.2, 0.3, 0.5])]).unwrap();
    w.finish().unwrap();
    let batch = read_parquet(&path);
    assert_eq!(names(&batch), ["id", "epoch", "p0", "p1", "p2", "model_epoch"]);
    assert_eq!(f64s(&batch, "p2"), [0.5]);
}

/// A Gaussian output and a Bernoulli one: each row's own output's columns,
/// and with every output asked for, each output's columns by name.
#[test]
fn a_multi_output_file_fills_each_rows_own_outputs_columns_and_every_outputs_on_request() {
    let dir = tempfile::tempdir().unwrap();
    let two = Likelihood::parse_outputs("gaussian,bernoulli", None).unwrap();
    let gaussian = Predictive::Moments { mean: 2.0, var: 0.5 };
    let bernoulli = Predictive::Classes(vec![0.3, 0.7]);
    let of = |id: i64, output: usize| Prediction {
        id,
        epoch: 1,
        model_epoch: Some(0),
        predictive: [&gaussian, &bernoulli][output].clone(),
        log_density: None,
        output: Some(output),
        all_outputs: vec![gaussian.clone(), bernoulli.clone()],
    };

    let path = dir.path().join("own.parquet");
    let mut w = PredictionWriter::create(&path, PredictionColumns::for_likelihood(&two, false)).unwrap();
    w.write(&[of(0, 0), of(1, 1)]).unwrap();
    w.finish().unwrap();
    let batch = read_parquet(&path);
    assert_eq!(
        names(&batch),
        ["id", "epoch", "output", "mean", "var", "p1", "model_epoch"]
    );
    let outputs = batch.column(2).as_primitive::<Int64Type>().values().to_vec();
    assert_eq!(outputs, [0, 1]);
    let column = |name: &str| {
        let c = batch
            .column_by_name(name)
            .unwrap()
            .as_primitive::<arrow::datatypes::Float64Type>();
        (0..c.len())
            .map(|i| c.is_valid(i).then(|| c.value(i)))
            .collect::<Vec<_>>()
    };
    assert_eq!(column("mean"), [Some(2.0), None]);
    assert_eq!(column("var"), [Some(0.5), None]);
    assert_eq!(column("p1"), [None, Some(0.7)]);

    let path = dir.path().join("every.parquet");
    let mut w = PredictionWriter::create(&path, PredictionColumns::for_likelihood(&two, true)).unwrap();
    w.write(&[of(0, 1)]).unwrap();
    w.finish().unwrap();
    let batch = read_parquet(&path);
    assert_eq!(
        names(&batch),
        [
            "id",
            "epoch",
            "output",
            "mean",
            "var",
            "p1",
            "output0_mean",
            "output0_var",
            "output1_p1",
            "model_epoch"
        ]
    );
    assert_eq!(f64s(&batch, "output0_mean"), [2.0]);
    assert_eq!(f64s(&batch, "output0_var"), [0.5]);
    assert_eq!(f64s(&batch, "output1_p1"), [0.7]);

    // A prediction without its output, or without every output's predictive, is an error.
    let mut w = PredictionWriter::create(
        dir.path().join("bad.parquet"),
        PredictionColumns::for_likelihood(&two, true),
    )
    .unwrap();
    let unnamed = Prediction {
        output: None,
        ..of(3, 0)
    };
    assert!(matches!(w.write(&[unnamed]), Err(SinkError::Layout { id: 3, .. })));
    let beyond = Prediction {
        output: Some(2),
        ..of(4, 0)
    };
    assert!(matches!(w.write(&[beyond]), Err(SinkError::Layout { id: 4, .. })));
    let partial = Prediction {
        all_outputs: vec![gaussian.clone()],
        ..of(5, 0)
    };
    assert!(matches!(w.write(&[partial]), Err(SinkError::Layout { id: 5, .. })));
    let wrong_shape = Prediction {
        predictive: bernoulli.clone(),
        ..of(6, 0)
    };
    assert!(matches!(w.write(&[wrong_shape]), Err(SinkError::Layout { id: 6, .. })));
}

#[test]
fn a_prediction_of_the_wrong_shape_is_an_error_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p.parquet");
    let mut w = PredictionWriter::create(&path, PredictionLayout::Classes(3)).unwrap();
    let err = w.write(&[moments(4, 0)]).unwrap_err();
    assert!(matches!(err, SinkError::Layout { id: 4, .. }), "{err}");
    assert!(err.to_string().contains("3 class probabilities"), "{err}");
    let two = Prediction {
        id: 5,
        epoch: 0,
        model_epoch: None,
        predictive: Predictive::Classes(vec![0.5, 0.5]),
        log_density: None,
        output: None,
        all_outputs: Vec::new(),
    };
    assert!(w.write(&[two]).is_err());
    // Nothing of a refused call was written.
    assert_eq!(w.finish().unwrap(), 0);
    assert_eq!(read_parquet(&path).num_rows(), 0);
}

#[test]
fn an_unfinished_file_never_appears_under_its_name() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("crashed.parquet");
    let mut w = PredictionWriter::create(&path, PredictionLayout::Moments).unwrap();
    w.write(&(0..100_000).map(|i| moments(i, 0)).collect::<Vec<_>>())
        .unwrap();
    drop(w); // a crash before finish
    assert!(!path.exists(), "no file under the final name");
    let partial = partial_path(&path);
    assert!(partial.exists());
    assert!(
        ParquetRecordBatchReaderBuilder::try_new(File::open(&partial).unwrap()).is_err(),
        "the partial file has no footer"
    );

    // A writer into a missing directory says where.
    let err = PredictionWriter::create(dir.path().join("no/such/dir/p.parquet"), PredictionLayout::Moments)
        .err()
        .unwrap();
    assert!(err.to_string().contains("no/such/dir"), "{err}");
}

#[test]
fn dead_letters_are_written_with_origin_reason_and_payload() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dead.parquet");
    let mut w = DeadLetterWriter::create(&path).unwrap();
    w.write(&[
        DeadLetter {
            origin: Origin::File {
                path: "in.parquet".into(),
                row: 3,
            },
            payload: r#"{"id":3,"x0":null}"#.into(),
            reason: Reason::Null { field: "x0".into() },
        },
        DeadLetter {
            origin: Origin::Kafka {
                topic: "in".into(),
                partition: 1,
                offset: 42,
                row: None,
            },
            payload: "not json".into(),
            reason: Reason::Undecodable {
                detail: "expected value at line 1 column 1".into(),
            },
        },
    ])
    .unwrap();
    assert_eq!(w.finish().unwrap(), 2);
    let batch = read_parquet(&path);
    assert_eq!(names(&batch), ["origin", "reason_kind", "reason", "payload"]);
    let text = |c: &str| -> Vec<String> {
        let a = batch.column_by_name(c).unwrap().as_string::<i32>();
        (0..a.len()).map(|i| a.value(i).to_owned()).collect()
    };
    assert_eq!(text("origin"), ["in.parquet row 3", "in/1@42"]);
    assert_eq!(text("reason_kind"), ["null", "undecodable"]);
    assert_eq!(text("reason")[0], "`x0` is null");
    assert_eq!(text("payload")[1], "not json");
}
