//! Damaged Parquet files that the parquet crate (60) reads with a panic
//! rather than an error: a footer whose column chunks start at a negative
//! offset (`ColumnChunkMetaData::byte_range`) is refused before any row is
//! read, as not valid Parquet; a page that names a dictionary it lacks
//! panics in the middle of decoding, and that panic is a read error.

use std::panic::{catch_unwind, AssertUnwindSafe};

use arrow::error::ArrowError;
use arrow::record_batch::RecordBatch;
use dualgp_operators::dataflow::panic_message;
use parquet::errors::ParquetError;
use parquet::file::metadata::ParquetMetaData;

/// Why the footer's column chunks cannot be where it says, if they cannot:
/// every chunk starts at a non-negative offset and ends within the file.
pub(crate) fn check_chunks(metadata: &ParquetMetaData, file_len: u64) -> Result<(), ParquetError> {
    for (g, group) in metadata.row_groups().iter().enumerate() {
        if group.num_rows() < 0 {
            return Err(ParquetError::General(format!(
                "row group {g} has {} rows",
                group.num_rows()
            )));
        }
        for (c, chunk) in group.columns().iter().enumerate() {
            let start = chunk.dictionary_page_offset().unwrap_or(chunk.data_page_offset());
            let len = chunk.compressed_size();
            let end = u64::try_from(start)
                .ok()
                .zip(u64::try_from(len).ok())
                .and_then(|(s, l)| s.checked_add(l));
            if end.is_none_or(|end| end > file_len) {
                return Err(ParquetError::General(format!(
                    "row group {g}, column {c}: a chunk of {len} bytes at offset {start} in a file of {file_len} bytes"
                )));
            }
        }
    }
    Ok(())
}

/// The reader's next batch; a panic while decoding is a read error (the
/// reader is not asked again).
pub(crate) fn next_batch(
    reader: &mut impl Iterator<Item = Result<RecordBatch, ArrowError>>,
) -> Option<Result<RecordBatch, ArrowError>> {
    catch_unwind(AssertUnwindSafe(|| reader.next())).unwrap_or_else(|panic| {
        let said = panic_message(&*panic);
        Some(Err(ArrowError::ParquetError(format!("damaged data: {said}"))))
    })
}
