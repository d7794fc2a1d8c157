//! Frames handed in from Python: each item of a Python iterator is an Arrow record batch
//! exported through the Arrow C Data Interface (`__arrow_c_array__`: pyarrow RecordBatches;
//! the Python side turns DataFrames and Tables into them). The buffers are read in place.

use std::sync::Arc;

use arrow_array::ffi::{from_ffi, FFI_ArrowArray, FFI_ArrowSchema};
use arrow_array::{RecordBatch, StructArray};
use pyo3::exceptions::{PyStopIteration, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyCapsuleMethods};
use sparta_data::DataError;

/// The first Python exception of a frame iterator (or progress callback), raised again once
/// training has stopped.
pub type Raised = Arc<std::sync::Mutex<Option<PyErr>>>;

/// Keeps the first exception in `slot`.
pub fn keep(slot: &Raised, e: PyErr) {
    let mut s = slot.lock().unwrap_or_else(|p| p.into_inner());
    if s.is_none() {
        *s = Some(e);
    }
}

/// Takes the kept exception.
pub fn take(slot: &Raised) -> Option<PyErr> {
    slot.lock().unwrap_or_else(|p| p.into_inner()).take()
}

/// The record batch a Python object exports through `__arrow_c_array__` (a struct array).
pub fn record_batch(obj: &Bound<'_, PyAny>) -> PyResult<RecordBatch> {
    if !obj.hasattr("__arrow_c_array__")? {
        return Err(PyTypeError::new_err(format!(
            "expected an Arrow record batch (an object with __arrow_c_array__), got {}",
            obj.get_type().name()?
        )));
    }
    let (schema, array): (Bound<'_, PyCapsule>, Bound<'_, PyCapsule>) =
        obj.call_method0("__arrow_c_array__")?.extract()?;
    let named = |c: &Bound<'_, PyCapsule>, want: &str| -> PyResult<()> {
        let name = c.name()?.map(|n| n.to_string_lossy().into_owned());
        if name.as_deref() == Some(want) {
            Ok(())
        } else {
            Err(PyValueError::new_err(format!(
                "__arrow_c_array__ returned a capsule named {name:?}, expected {want:?}"
            )))
        }
    };
    named(&schema, "arrow_schema")?;
    named(&array, "arrow_array")?;
    // SAFETY: a capsule named "arrow_schema" holds a valid `ArrowSchema` (the Arrow PyCapsule
    // Interface); it is only borrowed here, the capsule keeps owning (and releases) it.
    let schema = unsafe { &*(schema.pointer() as *const FFI_ArrowSchema) };
    // SAFETY: a capsule named "arrow_array" holds a valid `ArrowArray`; `from_raw` moves it out
    // and marks the capsule's copy released, so its destructor does not release it again.
    let array = unsafe { FFI_ArrowArray::from_raw(array.pointer() as *mut FFI_ArrowArray) };
    // SAFETY: the array and schema come from the same `__arrow_c_array__` call: they match.
    let data = unsafe { from_ffi(array, schema) }
        .map_err(|e| PyValueError::new_err(format!("importing an Arrow array: {e}")))?;
    let is_struct = matches!(data.data_type(), arrow_schema::DataType::Struct(_));
    if !is_struct {
        return Err(PyValueError::new_err(format!(
            "expected a record batch (a struct array), got an array of {}",
            data.data_type()
        )));
    }
    Ok(RecordBatch::from(StructArray::from(data)))
}

/// A Python iterator of record batches, pulled with the GIL taken per item.
pub struct PyFrames {
    iter: Py<PyAny>,
    raised: Raised,
}

impl PyFrames {
    /// Frames of the Python iterator `iter`; an exception it raises is kept in `raised`.
    pub fn new(iter: Py<PyAny>, raised: Raised) -> Self {
        PyFrames { iter, raised }
    }
}

impl Iterator for PyFrames {
    type Item = Result<RecordBatch, DataError>;

    fn next(&mut self) -> Option<Self::Item> {
        Python::attach(|py| {
            let item = match self.iter.bind(py).call_method0("__next__") {
                Ok(item) => item,
                Err(e) if e.is_instance_of::<PyStopIteration>(py) => return None,
                Err(e) => {
                    keep(&self.raised, e);
                    return Some(Err(DataError::Frame(
                        "the frame iterator raised an exception".into(),
                    )));
                }
            };
            Some(record_batch(&item).map_err(|e| {
                let msg = e.to_string();
                keep(&self.raised, e);
                DataError::Frame(msg)
            }))
        })
    }
}
