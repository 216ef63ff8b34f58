//! A nonblocking operation in flight: its completion event and what must outlive it (the
//! Python buffers it reads and writes, held through the buffer protocol).

use ampccl::Event;
use pyo3::buffer::PyUntypedBuffer;
use pyo3::prelude::*;

use crate::py_err;

/// Completion of a nonblocking call (`wait`, `test`). The buffers stay exported (and so
/// alive, and for numpy not resizable) until the operation is complete; dropping an
/// unfinished request waits for it, since peers may still write into its buffers.
#[pyclass(module = "ampccl._native")]
pub struct Request {
    event: Option<Event>,
    bufs: Vec<PyUntypedBuffer>,
}

impl Request {
    pub(crate) fn new(event: Event, bufs: Vec<PyUntypedBuffer>) -> Request {
        Request {
            event: Some(event),
            bufs,
        }
    }
}

#[pymethods]
impl Request {
    /// Blocks (without the GIL) until the operation completes; raises its error if it failed.
    fn wait(&mut self, py: Python<'_>) -> PyResult<()> {
        let Some(ev) = self.event.take() else {
            return Ok(());
        };
        let r = py.detach(|| ev.wait());
        self.bufs.clear();
        r.map_err(py_err)
    }

    /// True once the operation completed (raises its error if it failed).
    fn test(&mut self) -> PyResult<bool> {
        let Some(ev) = &self.event else {
            return Ok(true);
        };
        match ev.status() {
            None => Ok(false),
            Some(r) => {
                self.event = None;
                self.bufs.clear();
                r.map(|()| true).map_err(py_err)
            }
        }
    }
}

impl Drop for Request {
    fn drop(&mut self) {
        if let Some(ev) = self.event.take() {
            // Peers may still write into the buffers; the error, if any, has nobody to go to.
            // The GIL is released meanwhile: the matching call may come from another thread
            // of this interpreter.
            let _ = Python::attach(|py| py.detach(|| ev.wait()));
        }
    }
}
