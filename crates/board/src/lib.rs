//! TensorBoard's own event file format, written directly (no TensorFlow, no Python):
//! `events.out.tfevents.<unix secs>.<hostname>` in a run directory, a TFRecord stream of
//! `Event` protos whose first record names the file version and whose others carry scalars.
//! `tensorboard --logdir DIR` reads every run directory under `DIR`.
//!
//! * [`record`]: the TFRecord framing (length, masked CRC-32C of the length, data, masked
//!   CRC-32C of the data).
//! * [`proto`]: the `Event` / `Summary` messages (the fields TensorBoard reads for scalars,
//!   with the field numbers of `tensorflow/core/util/event.proto` and `summary.proto`).
//! * [`read`]: reading records, events and scalars back, every CRC checked.
//! * [`writer`]: [`EventWriter`], buffered, flushed on [`EventWriter::flush`] and on drop.

pub mod error;
pub mod proto;
pub mod read;
pub mod record;
pub mod writer;

pub use error::BoardError;
pub use writer::EventWriter;
