//! Python buffers as operation operands: the buffer protocol gives the address, the length and
//! the element format, from which the ampccl data type follows (or a caller's override, for
//! types Python's `struct` formats cannot name, such as bfloat16 held as 16-bit words).

use std::ffi::CStr;

use ampccl::DataType;
use pyo3::buffer::{ElementType, PyUntypedBuffer};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;

/// The types a buffer's format may name, for messages.
const NAMED: &str = "int8 uint8 int32 uint32 int64 uint64 float16 float32 float64 \
                     (bfloat16: pass dtype='bfloat16')";

/// One operand: its exported buffer (held until the operation completes), address, length in
/// bytes and data type.
pub(crate) struct Operand {
    pub(crate) buf: PyUntypedBuffer,
    pub(crate) ptr: *mut u8,
    pub(crate) bytes: usize,
    pub(crate) dtype: DataType,
}

impl Operand {
    /// Exports `obj`'s buffer as the `what` operand (`input`, `output`): C-contiguous,
    /// writable when `write`, of `dtype` when given (then any element format whose byte length
    /// is a multiple of the type's size), else of the type its format names.
    pub(crate) fn get(
        obj: &Bound<'_, PyAny>,
        what: &str,
        write: bool,
        dtype: Option<DataType>,
    ) -> PyResult<Operand> {
        let buf = PyUntypedBuffer::get(obj).map_err(|e| {
            PyTypeError::new_err(format!(
                "{what} buffer: {} object does not export a buffer ({e})",
                obj.get_type().name().map_or("?".into(), |n| n.to_string())
            ))
        })?;
        if !buf.is_c_contiguous() {
            return Err(PyValueError::new_err(format!(
                "{what} buffer is not C-contiguous"
            )));
        }
        if write && buf.readonly() {
            return Err(PyValueError::new_err(format!("{what} buffer is read-only")));
        }
        let bytes = buf.len_bytes();
        let dtype = match dtype {
            Some(t) if !bytes.is_multiple_of(t.size()) => {
                return Err(PyValueError::new_err(format!(
                    "{what} buffer of {bytes} bytes does not hold whole {} elements",
                    t.name()
                )));
            }
            Some(t) => t,
            None => from_format(buf.format(), buf.item_size()).ok_or_else(|| {
                PyTypeError::new_err(format!(
                    "{what} buffer's elements (format {:?}) are not of a type ampccl reduces: {NAMED}",
                    buf.format().to_string_lossy()
                ))
            })?,
        };
        let ptr = buf.buf_ptr().cast();
        Ok(Operand {
            buf,
            ptr,
            bytes,
            dtype,
        })
    }

    /// Number of elements.
    pub(crate) fn count(&self) -> usize {
        self.bytes / self.dtype.size()
    }
}

/// The data type a `struct` format names, in native byte order (a big-endian buffer is
/// refused: the library reduces native values).
fn from_format(format: &CStr, item_size: usize) -> Option<DataType> {
    if matches!(format.to_bytes().first(), Some(b'>' | b'!')) && cfg!(target_endian = "little") {
        return None;
    }
    let t = match (ElementType::from_format(format), item_size) {
        (ElementType::SignedInteger { bytes: 1 }, 1) => DataType::I8,
        (ElementType::UnsignedInteger { bytes: 1 }, 1) => DataType::U8,
        (ElementType::SignedInteger { bytes: 4 }, 4) => DataType::I32,
        (ElementType::UnsignedInteger { bytes: 4 }, 4) => DataType::U32,
        (ElementType::SignedInteger { bytes: 8 }, 8) => DataType::I64,
        (ElementType::UnsignedInteger { bytes: 8 }, 8) => DataType::U64,
        (ElementType::Float { bytes: 2 }, 2) => DataType::F16,
        (ElementType::Float { bytes: 4 }, 4) => DataType::F32,
        (ElementType::Float { bytes: 8 }, 8) => DataType::F64,
        _ => return None,
    };
    Some(t)
}
