//! The Parquet source streams: its heap stays at about one row group plus one
//! epoch, however large the file. Measured with a counting allocator (this
//! binary holds this one test, so nothing else allocates alongside).

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use arrow::array::{ArrayRef, Float64Array, Int64Array};
use common::write_parquet;
use dualgp_connectors::{EpochRule, ParquetSource, ParquetSourceConfig, WorkerShare};

struct Counting;

static NOW: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let now = NOW.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        NOW.fetch_sub(layout.size(), Ordering::Relaxed);
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const D: usize = 18;
const GROUP: usize = 5_000;
const EPOCH: u64 = 2_000;

/// A file of `rows` rows, id, x0..x17, y, in row groups of `GROUP` rows.
fn write_file(path: &std::path::Path, rows: usize) {
    let mut columns: Vec<(String, ArrayRef)> = vec![(
        "id".into(),
        Arc::new(Int64Array::from_iter_values(0..rows as i64)) as ArrayRef,
    )];
    for j in 0..D {
        // Distinct values so that dictionary encoding does not shrink the pages.
        let values = (0..rows).map(|i| (i * (j + 1)) as f64 * 1e-3 + (i as f64).sin());
        columns.push((format!("x{j}"), Arc::new(Float64Array::from_iter_values(values))));
    }
    let y = (0..rows).map(|i| (i as f64 * 0.01).cos());
    columns.push(("y".into(), Arc::new(Float64Array::from_iter_values(y))));
    let named = columns.iter().map(|(n, a)| (n.as_str(), a.clone())).collect();
    write_parquet(path, named, GROUP);
}

/// Peak heap (bytes above what was live before) while streaming `path` whole.
fn streaming_peak(path: &std::path::Path, rows: usize) -> usize {
    let config = ParquetSourceConfig {
        epochs: EpochRule::Rows(EPOCH),
        ..Default::default()
    };
    let baseline = NOW.load(Ordering::Relaxed);
    PEAK.store(baseline, Ordering::Relaxed);
    let mut source = ParquetSource::open(path, &config, WorkerShare::ALONE, None).unwrap();
    let mut records = 0;
    while let Some(part) = source.next_epoch().unwrap() {
        records += part.records.len();
        // `part` is dropped here, as a caller hands it on.
    }
    assert_eq!(records, rows);
    drop(source);
    PEAK.load(Ordering::Relaxed) - baseline
}

#[test]
fn streaming_holds_about_one_row_group_and_one_epoch() {
    let dir = tempfile::tempdir().unwrap();
    let (small, large) = (dir.path().join("small.parquet"), dir.path().join("large.parquet"));
    write_file(&small, 40_000);
    write_file(&large, 200_000);

    let small_peak = streaming_peak(&small, 40_000);
    let large_peak = streaming_peak(&large, 200_000);

    // One row group as read and as decoded (a batch is at most a group),
    // and one epoch of `Record`s (a Vec<f64> each, header and rounding).
    let group_bytes = GROUP * (D + 2) * 8;
    let epoch_bytes = EPOCH as usize * (D * 8 + 64);
    let whole_file_decoded = 200_000 * (D + 2) * 8;
    println!(
        "peak {:.2} MB (40k rows) and {:.2} MB (200k rows); one group {:.2} MB, one epoch {:.2} MB; \
         200k rows decoded {:.1} MB",
        small_peak as f64 / 1e6,
        large_peak as f64 / 1e6,
        group_bytes as f64 / 1e6,
        epoch_bytes as f64 / 1e6,
        whole_file_decoded as f64 / 1e6
    );
    let bound = 3 * (group_bytes + epoch_bytes);
    assert!(large_peak < bound, "peak heap {large_peak} B is over {bound} B");
    assert!(
        large_peak < small_peak + small_peak / 5,
        "the peak does not grow with the file: {small_peak} B for 40k rows, {large_peak} B for 200k"
    );
    assert!(large_peak * 8 < whole_file_decoded, "the file is never held whole");
}
