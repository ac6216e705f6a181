//! CSV files beside Parquet: a header row names the columns, each column's
//! type is inferred from all its values (integers, floats, text, …; an
//! empty cell is a null), and arrow's CSV reader turns the rows into the
//! same Arrow batches a Parquet file gives, for the same column reader
//! ([`columns`](crate::columns)). A path ending in `.csv` (any case) is CSV;
//! every other path is Parquet.

use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::csv::reader::Format;
use arrow::csv::{Reader, ReaderBuilder};
use arrow::datatypes::SchemaRef;
use arrow::error::ArrowError;

/// Whether `path` is read as CSV (its extension is `csv`, in any case).
pub fn is_csv(path: &Path) -> bool {
    path.extension().is_some_and(|e| e.eq_ignore_ascii_case("csv"))
}

/// A CSV file whose schema has been inferred, ready to be read in batches.
#[derive(Clone, Debug)]
pub struct CsvInput {
    path: PathBuf,
    schema: SchemaRef,
    rows: u64,
}

impl CsvInput {
    /// Reads the whole file once to infer its schema and count its rows: a
    /// row with another number of fields than the header (a truncated or
    /// malformed file) is an error here, before any row is used.
    pub fn open(path: &Path, file: &File) -> Result<CsvInput, ArrowError> {
        let (schema, rows) = Format::default()
            .with_header(true)
            .infer_schema(BufReader::new(file), None)?;
        Ok(CsvInput {
            path: path.to_owned(),
            schema: Arc::new(schema),
            rows: rows as u64,
        })
    }

    /// The inferred schema: every column, in file order.
    pub fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Rows below the header.
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// A reader of `columns` (the others are not parsed) from the first row
    /// on, in batches of `batch_rows` rows (the last may be shorter).
    pub fn batches(&self, columns: &[&str], batch_rows: usize) -> Result<Reader<File>, ArrowError> {
        let projection: Vec<usize> = (0..self.schema.fields().len())
            .filter(|&i| columns.contains(&self.schema.field(i).name().as_str()))
            .collect();
        let file = File::open(&self.path)?;
        ReaderBuilder::new(self.schema.clone())
            .with_header(true)
            .with_batch_size(batch_rows.max(1))
            .with_projection(projection)
            .build(file)
    }
}

#[cfg(test)]
mod tests {
    use arrow::datatypes::DataType;

    use super::*;

    fn written(text: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.csv");
        std::fs::write(&path, text).unwrap();
        (dir, path)
    }

    #[test]
    fn types_are_inferred_and_rows_counted_as_the_reader_reads_them() {
        let (_dir, path) = written("key,a,b,name\n1,0.5,2,x\n2,1e-7,,y\n\n3,-1.25,4,\"z\"\n");
        let csv = CsvInput::open(&path, &File::open(&path).unwrap()).unwrap();
        let types: Vec<DataType> = csv.schema().fields().iter().map(|f| f.data_type().clone()).collect();
        assert_eq!(
            types,
            [DataType::Int64, DataType::Float64, DataType::Int64, DataType::Utf8]
        );
        let read: usize = csv
            .batches(&["key", "b"], 2)
            .unwrap()
            .map(|b| b.unwrap().num_rows())
            .sum();
        assert_eq!((csv.rows(), read), (3, 3), "a blank line is no row for either");
        assert!(is_csv(Path::new("a/B.CSV")) && !is_csv(Path::new("a.parquet")));
    }

    #[test]
    fn a_row_cut_short_is_an_error_naming_its_line() {
        let (_dir, path) = written("key,a,b\n1,0.5,2\n2,0.");
        let err = CsvInput::open(&path, &File::open(&path).unwrap())
            .unwrap_err()
            .to_string();
        assert!(err.contains("line 3"), "{err}");
    }
}
