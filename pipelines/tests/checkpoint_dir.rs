//! `dualgp serve` whose checkpoint directory fills up or turns read-only
//! while it runs (a small tmpfs, a read-only bind mount: the tests run as
//! root, so permissions would not bite). Serve stops with one line that
//! says why, leaves no checkpoint it cannot read, and once the directory is
//! mended a restart resumes from the last checkpoint: every record
//! predicted, every label learned once.

#[allow(dead_code)] // not every helper of the broker is used here
#[path = "../../connectors/tests/common/broker.rs"]
mod broker;

mod common;

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::thread::sleep;
use std::time::{Duration, Instant};

use broker::Broker;
use common::{
    dualgp, free_port, labelled_records, metric, output_within, produce, read_topic, serve_command, SpawnPiped,
};

/// A file system mounted for one test, unmounted when dropped.
struct Mount(PathBuf);

impl Mount {
    fn new(args: &[&str], at: &Path) -> Mount {
        mount(args, at);
        Mount(at.to_path_buf())
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

fn mount(args: &[&str], at: &Path) {
    let status = Command::new("mount").args(args).arg(at).status().unwrap();
    assert!(status.success(), "mount {args:?} {} failed", at.display());
}

/// An empty `checkpoints` directory to mount on, in a fresh temporary
/// one; `None` where mounting would need root (these tests then say so and
/// pass).
fn mount_point(mount: &str) -> Option<(tempfile::TempDir, PathBuf)> {
    let id = Command::new("id").arg("-u").output().unwrap();
    if String::from_utf8_lossy(&id.stdout).trim() != "0" {
        eprintln!("skipped: {mount} needs root");
        return None;
    }
    let base = tempfile::tempdir().unwrap();
    let dir = base.path().join("checkpoints");
    std::fs::create_dir(&dir).unwrap();
    Some((base, dir))
}

/// Serve on one worker, epochs of 50 records, checkpointing into `dir`.
fn spawn_serve(address: &str, dir: &Path, flags: &[&str]) -> Child {
    serve_command(address, "in", "out")
        .args(["--likelihood", "gaussian", "--inducing", "10", "--workers", "1"])
        .args(["--batch-size", "50", "--batch-timeout-ms", "300"])
        .args(["--checkpoint-dir", dir.to_str().unwrap()])
        .args(flags)
        .spawn_piped()
}

fn checkpoints_in(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

/// `dualgp inspect --json` of `dir`: the records its newest checkpoint learned.
fn records_learned(dir: &Path) -> u64 {
    let out = dualgp(&["inspect", dir.to_str().unwrap(), "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    summary["records_seen"].as_u64().unwrap()
}

/// Serves 200 records until one checkpoint is saved, breaks `dir` with
/// `break_dir`, serves 200 more: serve must stop with one line holding
/// `why`. Then `mend_dir`, and a restart must finish the job.
fn serve_through_a_broken_checkpoint_dir(dir: &Path, break_dir: impl FnOnce(), why: &str, mend_dir: impl FnOnce()) {
    let (_broker, address) = Broker::with_topics(1, &["in", "out", "in.dlq"]);
    produce(&address, "in", &labelled_records(0..200), 1);
    let port = free_port();
    let mut serve = spawn_serve(&address, dir, &["--metrics-port", &port.to_string()]);
    let deadline = Instant::now() + Duration::from_secs(60);
    while metric(port, "dualgp_predictions_out_total").unwrap_or(0) < 200
        || !checkpoints_in(dir).iter().any(|n| n.starts_with("checkpoint-"))
    {
        assert!(
            Instant::now() < deadline,
            "no checkpoint of 200 records within a minute"
        );
        assert!(serve.try_wait().unwrap().is_none(), "serve stopped early");
        sleep(Duration::from_millis(50));
    }

    break_dir();
    produce(&address, "in", &labelled_records(200..400), 1);
    let out = output_within(serve, Duration::from_secs(60));
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let last = stderr.trim_end().lines().last().unwrap_or_default();
    assert!(
        last.starts_with("dualgp: ") && last.contains("checkpoint") && last.contains(why),
        "{stderr}"
    );
    eprintln!("serve said: {last}");
    let names = checkpoints_in(dir);
    assert!(
        !names.iter().any(|n| n.ends_with(".partial")),
        "a partial write was left: {names:?}"
    );
    let learned_before = records_learned(dir);
    assert!((1..400).contains(&learned_before), "{learned_before}");

    mend_dir();
    let out = output_within(
        spawn_serve(&address, dir, &["--idle-exit", "3"]),
        Duration::from_secs(120),
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let ids: BTreeSet<i64> = read_topic(&address, "out", 400)
        .iter()
        .map(|t| {
            serde_json::from_str::<serde_json::Value>(t).unwrap()["id"]
                .as_i64()
                .unwrap()
        })
        .collect();
    assert_eq!(ids, (0..400).collect(), "a record was not predicted");
    assert_eq!(records_learned(dir), 400, "every label learned once");
}

#[test]
fn a_full_checkpoint_directory_stops_serve_with_one_line_and_a_restart_resumes() {
    let Some((_base, dir)) = mount_point("a small tmpfs") else {
        return;
    };
    let _tmpfs = Mount::new(&["-t", "tmpfs", "-o", "size=4m", "tmpfs"], &dir);
    let filler = dir.join("filler");
    let fill = || {
        // Zeros until the file system is full.
        let mut file = std::fs::File::create(&filler).unwrap();
        let block = vec![0u8; 4096];
        while file.write_all(&block).is_ok() {}
        let _ = file.sync_all();
    };
    let mend = || std::fs::remove_file(&filler).unwrap();
    serve_through_a_broken_checkpoint_dir(&dir, fill, "No space left on device", mend);
}

#[test]
fn a_read_only_checkpoint_directory_stops_serve_with_one_line_and_a_restart_resumes() {
    let Some((base, dir)) = mount_point("a read-only bind mount") else {
        return;
    };
    let source = base.path().join("source");
    std::fs::create_dir(&source).unwrap();
    let _bind = Mount::new(&["--bind", source.to_str().unwrap()], &dir);
    let read_only = || mount(&["-o", "remount,ro,bind"], &dir);
    let writable = || mount(&["-o", "remount,rw,bind"], &dir);
    serve_through_a_broken_checkpoint_dir(&dir, read_only, "Read-only file system", writable);
}
