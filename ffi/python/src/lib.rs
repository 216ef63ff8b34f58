//! `ampccl._native`: the Python package's native module. It binds ampccl's Rust API directly
//! (no C ABI in between): a [`comm::Comm`] wraps a `Communicator`, its calls take Python
//! buffers ([`buffer`]) or, for the torch backend, tensor addresses with their byte lengths,
//! and wait with the GIL released; nonblocking calls return a [`request::Request`].
//!
//! The Python side (`python/ampccl`) builds the mpi4py-shaped API and the `torch.distributed`
//! backend on these few entry points.

use pyo3::create_exception;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

mod buffer;
mod comm;
mod request;

create_exception!(
    _native,
    AmpcclError,
    PyRuntimeError,
    "An error of the ampccl library; the message is the library's."
);

/// The library's error as a Python exception.
pub(crate) fn py_err(e: ampccl::Error) -> PyErr {
    AmpcclError::new_err(e.to_string())
}

/// A new unique id (`ncclGetUniqueId`): binds the rendezvous root of one communicator on this
/// process; hand the bytes to every rank's `Comm.init`.
#[pyfunction]
fn unique_id(py: Python<'_>) -> PyResult<Py<PyBytes>> {
    let id = ampccl::UniqueId::generate().map_err(py_err)?;
    Ok(PyBytes::new(py, id.as_bytes()).unbind())
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("AmpcclError", m.py().get_type::<AmpcclError>())?;
    m.add_function(wrap_pyfunction!(unique_id, m)?)?;
    m.add_class::<comm::Comm>()?;
    m.add_class::<request::Request>()?;
    Ok(())
}
