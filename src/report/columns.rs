//! A table as typed columns, written as CSV or as Parquet (one row group, uncompressed, no
//! statistics that depend on anything but the values), so fleets can aggregate outputs with
//! DuckDB, Polars or Spark (docs/fleet.md).

use std::sync::Arc;

use parquet::basic::{ConvertedType, Repetition, Type as PhysicalType};
use parquet::data_type::{BoolType, ByteArray, ByteArrayType, DoubleType, Int64Type};
use parquet::file::properties::WriterProperties;
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::types::Type;

/// One column's values.
#[derive(Debug, Clone, PartialEq)]
pub enum Values {
    Str(Vec<String>),
    Int(Vec<i64>),
    /// Printed in CSV with this many decimals, or as Rust prints them (`None`).
    Float(Vec<f64>, Option<usize>),
    Bool(Vec<bool>),
}

impl Values {
    fn len(&self) -> usize {
        match self {
            Values::Str(v) => v.len(),
            Values::Int(v) => v.len(),
            Values::Float(v, _) => v.len(),
            Values::Bool(v) => v.len(),
        }
    }

    fn cell(&self, row: usize) -> String {
        match self {
            Values::Str(v) => v[row].clone(),
            Values::Int(v) => v[row].to_string(),
            Values::Float(v, Some(digits)) => format!("{:.*}", digits, v[row]),
            Values::Float(v, None) => v[row].to_string(),
            Values::Bool(v) => v[row].to_string(),
        }
    }
}

/// Named columns of equal length.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Columns {
    pub columns: Vec<(String, Values)>,
}

impl Columns {
    pub fn push(&mut self, name: impl Into<String>, values: Values) {
        self.columns.push((name.into(), values));
    }

    pub fn rows(&self) -> usize {
        self.columns.first().map_or(0, |(_, v)| v.len())
    }

    /// RFC 4180 CSV with a header line.
    pub fn to_csv(&self) -> Vec<u8> {
        let mut writer = csv::Writer::from_writer(Vec::new());
        writer.write_record(self.columns.iter().map(|(n, _)| n.as_str())).expect("csv to memory");
        for row in 0..self.rows() {
            writer.write_record(self.columns.iter().map(|(_, v)| v.cell(row))).expect("csv to memory");
        }
        writer.into_inner().expect("csv to memory")
    }

    /// The columns as one Parquet file (every column required, strings UTF-8).
    pub fn to_parquet(&self) -> Result<Vec<u8>, parquet::errors::ParquetError> {
        let fields = self
            .columns
            .iter()
            .map(|(name, values)| {
                let (physical, converted) = match values {
                    Values::Str(_) => (PhysicalType::BYTE_ARRAY, ConvertedType::UTF8),
                    Values::Int(_) => (PhysicalType::INT64, ConvertedType::INT_64),
                    Values::Float(..) => (PhysicalType::DOUBLE, ConvertedType::NONE),
                    Values::Bool(_) => (PhysicalType::BOOLEAN, ConvertedType::NONE),
                };
                Type::primitive_type_builder(name, physical).with_repetition(Repetition::REQUIRED).with_converted_type(converted).build().map(Arc::new)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let schema = Arc::new(Type::group_type_builder("schema").with_fields(fields).build()?);
        // No `created_by` with a version in it: the same table gives the same bytes.
        let props = Arc::new(WriterProperties::builder().set_created_by("ctxsim".to_owned()).build());
        let mut out = Vec::new();
        let mut writer = SerializedFileWriter::new(&mut out, schema, props)?;
        let mut group = writer.next_row_group()?;
        for (_, values) in &self.columns {
            let mut column = group.next_column()?.expect("one writer per schema column");
            match values {
                Values::Str(v) => {
                    let bytes: Vec<ByteArray> = v.iter().map(|s| ByteArray::from(s.as_str())).collect();
                    column.typed::<ByteArrayType>().write_batch(&bytes, None, None)?;
                }
                Values::Int(v) => {
                    column.typed::<Int64Type>().write_batch(v, None, None)?;
                }
                Values::Float(v, _) => {
                    column.typed::<DoubleType>().write_batch(v, None, None)?;
                }
                Values::Bool(v) => {
                    column.typed::<BoolType>().write_batch(v, None, None)?;
                }
            }
            column.close()?;
        }
        group.close()?;
        writer.close()?;
        Ok(out)
    }
}
