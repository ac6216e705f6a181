//! The fuzz targets' bodies, one function a target, each taking libFuzzer's
//! bytes. The targets in `fuzz_targets/` (nightly, cargo fuzz) call them,
//! and so does the corpus replay test `pipelines/tests/fuzz_corpus.rs`
//! (stable, CI), which compiles this file as a module of its own: the corpus
//! is replayed through exactly the code that was fuzzed.
//!
//! A body panics (a crash, for libFuzzer) when an entry point panics or when
//! what it returns breaks its contract: a decoded record with a non-finite
//! value or of the wrong dimension, an error of more than one line.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::Path;

use dualgp_connectors::kafka::{KafkaPosition, MessageDecoder, MessageFormat, MessageOrigin, MAX_RECORD_BYTES};
use dualgp_connectors::{ColumnMapping, DeadLetter, Features};
use dualgp_operators::dataflow::{checkpoint_from_bytes, with_checksum, Checkpoint, CheckpointError, Record};
use dualgp_operators::model::{Likelihood, StreamingLearner};
use dualgp_pipelines::cli::{one_line_for, parse_from, subcommand_of, Command};
use dualgp_pipelines::cluster::host_lines;

const AT: MessageOrigin<'static> = MessageOrigin {
    topic: "in",
    partition: 0,
    offset: 0,
};

/// A message every mapping below decodes to a record (features `x0, x1`):
/// a decoder that has read it holds the stream's feature names, against
/// which the fuzzed message is then checked.
const GOOD_JSON: &[u8] = br#"{"id": 1, "key": 1, "x0": 0.5, "x1": -1.5, "f1": 2, "y": 1, "output": 0}"#;

/// The mappings `serve` may read a topic with: by prefix, classes, counts,
/// named features, no label, globbed fields of its own names, two outputs.
pub fn mapping(which: u8) -> ColumnMapping {
    match which % 7 {
        0 => ColumnMapping::default(),
        1 => ColumnMapping::default().with_classes(3),
        2 => ColumnMapping::for_likelihood(&Likelihood::Poisson),
        3 => ColumnMapping::default().with_features(["x1", "x0"]),
        4 => ColumnMapping::default().without_label(),
        5 => ColumnMapping {
            id: "key".into(),
            features: Features::Glob(vec!["f*".into(), "x?".into()]),
            ..ColumnMapping::default()
        },
        _ => {
            let two = Likelihood::parse_outputs("gaussian,bernoulli", None).expect("two outputs parse");
            ColumnMapping::for_likelihood(&two)
        }
    }
}

/// `json_record`: the first byte picks the mapping, the rest is one Kafka
/// message read as JSON, as `serve --format json` reads it.
pub fn json_record(data: &[u8]) {
    decode_message(data, MessageFormat::Json);
}

/// `arrow_record`: the first byte picks the mapping, the rest is one Kafka
/// message read as an Arrow IPC stream, as `serve --format arrow-ipc` reads it.
pub fn arrow_record(data: &[u8]) {
    decode_message(data, MessageFormat::ArrowIpc);
}

/// The message decoded by a fresh decoder (whose features it may fix), by
/// one that already holds the stream's features, and by one that tells the
/// format from the bytes (`--format auto`, the default).
fn decode_message(data: &[u8], format: MessageFormat) {
    let Some((&which, payload)) = data.split_first() else {
        return;
    };
    let mapping = mapping(which);
    let fresh = || MessageDecoder::new(&mapping, format).with_max_bytes(MAX_RECORD_BYTES);
    decode_checked(&mut fresh(), payload, format);

    let mut auto = MessageDecoder::new(&mapping, MessageFormat::Auto).with_max_bytes(MAX_RECORD_BYTES);
    let (mut records, mut dead) = (Vec::new(), Vec::new());
    auto.decode(Some(GOOD_JSON), AT, &mut records, &mut dead);
    assert_eq!(
        (records.len(), dead.len()),
        (1, 0),
        "the good message decodes: {dead:?}"
    );
    decode_checked(&mut auto, payload, MessageFormat::Auto);
}

/// Decodes `payload` and checks what came out: every record usable under
/// the mapping, every dead letter's reason one line; a JSON message is
/// exactly one record or one dead letter.
fn decode_checked(decoder: &mut MessageDecoder, payload: &[u8], format: MessageFormat) {
    let (mut records, mut dead) = (Vec::new(), Vec::new());
    decoder.decode(Some(payload), AT, &mut records, &mut dead);
    let ipc = format == MessageFormat::ArrowIpc || (format == MessageFormat::Auto && payload.starts_with(&[0xFF; 4]));
    if !ipc {
        assert_eq!(
            records.len() + dead.len(),
            1,
            "a JSON message is one record or one dead letter"
        );
    }
    let dimension = decoder.feature_names().map(<[String]>::len);
    for record in &records {
        check_record(record, dimension);
    }
    dead.iter().for_each(check_dead_letter);
}

fn check_record(record: &Record, dimension: Option<usize>) {
    assert!(record.features.iter().all(|v| v.is_finite()), "{record:?}");
    assert!(record.label.is_none_or(f64::is_finite), "{record:?}");
    assert_eq!(Some(record.features.len()), dimension, "{record:?}");
    assert!(!record.features.is_empty(), "{record:?}");
}

fn check_dead_letter(letter: &DeadLetter) {
    let reason = letter.reason_text();
    assert!(!reason.contains('\n'), "{reason}");
}

/// Where the checkpoint under test is said to be: the errors must name it.
const CHECKPOINT_PATH: &str = "/checkpoints/checkpoint-00000000000000000007.json";

/// `checkpoint`: the bytes as a checkpoint file, as they are (a checksum
/// line, if any, must match) and sealed with a matching checksum (so that
/// the JSON, the learner's shapes and its factorisation are reached), read
/// as `inspect` reads any positions and as `serve` reads Kafka positions.
pub fn checkpoint(data: &[u8]) {
    for bytes in [data.to_vec(), with_checksum(data.to_vec())] {
        check_checkpoint(checkpoint_from_bytes::<serde_json::Value>(
            &bytes,
            Path::new(CHECKPOINT_PATH),
        ));
        check_checkpoint(checkpoint_from_bytes::<KafkaPosition>(
            &bytes,
            Path::new(CHECKPOINT_PATH),
        ));
    }
}

/// An error is one line naming the file; a checkpoint that reads predicts
/// (with an error or numbers, never a panic) at inputs of its dimension.
fn check_checkpoint<P>(read: Result<Checkpoint<P>, CheckpointError>) {
    let checkpoint = match read {
        Ok(checkpoint) => checkpoint,
        Err(e) => return check_one_line_naming(&e.to_string(), CHECKPOINT_PATH),
    };
    let learner = checkpoint.learner;
    let Some(posterior) = learner.posterior() else { return };
    let features = learner.likelihood().features(posterior.d());
    let x = nalgebra::DMatrix::from_fn(2, features, |i, j| (i as f64) - 0.5 * j as f64);
    let _ = learner.predict(&x);
}

fn check_one_line_naming(error: &str, name: &str) {
    assert!(!error.contains('\n'), "{error}");
    assert!(error.contains(name), "{error} does not name {name}");
}

/// Where the hostfile under test is said to be.
const HOSTFILE_PATH: &str = "/etc/dualgp/hosts";

/// `hostfile`: the bytes as a hostfile (text; a file that is not UTF-8 is
/// refused before parsing). Every address is `host:port` with a port and a
/// host without spaces; an error is one line naming the file.
pub fn hostfile(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    match host_lines(text, Path::new(HOSTFILE_PATH)) {
        Ok(addresses) => {
            assert!(addresses.len() <= text.lines().count());
            for address in &addresses {
                let (host, port) = address.rsplit_once(':').expect("host:port");
                assert!(port.parse::<u16>().is_ok(), "{address}");
                assert!(!host.is_empty() && !host.contains(char::is_whitespace), "{address}");
            }
        }
        Err(e) => check_one_line_naming(&format!("{e:#}"), HOSTFILE_PATH),
    }
}

/// `cli_flags`: the bytes as the arguments after `dualgp`, separated by NUL
/// bytes (arguments need not be UTF-8). A parse error becomes the one line
/// `dualgp` prints; flags that parse are checked as the subcommand checks
/// them before it reads any file (model, likelihood and column flags).
pub fn cli_flags(data: &[u8]) {
    let mut args = vec![OsString::from("dualgp")];
    args.extend(data.split(|&b| b == 0).map(|arg| OsString::from_vec(arg.to_vec())));
    match parse_from(&args) {
        Ok(cli) => check_flags(&cli.command),
        Err(e) => {
            let said = one_line_for(&e.to_string(), subcommand_of(&args).as_deref());
            if e.use_stderr() {
                assert!(!said.contains('\n'), "{said}");
            }
        }
    }
}

/// The flags' own checks: each an error of one line, or settings.
fn check_flags(command: &Command) {
    let (model, likelihood, columns) = match command {
        Command::Eval(a) => (Some(&a.model), Some(&a.likelihood), Some(&a.columns)),
        Command::Replay(a) => (Some(&a.model), Some(&a.likelihood), Some(&a.columns)),
        Command::Serve(a) => (Some(&a.model), Some(&a.likelihood), Some(&a.columns)),
        Command::Run { model, columns, .. } => (Some(&**model), None, Some(columns)),
        _ => (None, None, None),
    };
    let one_line = |e: anyhow::Error| {
        let said = format!("{e:#}");
        assert!(!said.contains('\n'), "{said}");
    };
    if let Some(Err(e)) = model.map(|m| m.settings()) {
        one_line(e);
    }
    let Some(likelihood) = likelihood.map(|l| l.parse()) else {
        return;
    };
    match likelihood {
        Ok(likelihood) => {
            if let Some(Err(e)) = columns.map(|c| c.mapping(&likelihood)) {
                one_line(e);
            }
        }
        Err(e) => one_line(e),
    }
}
