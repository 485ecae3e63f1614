//! The behaviours every backend must show, one public function each. Each takes the backend's
//! [`Harness`](super::Harness), builds its own fresh bus, and panics on the first deviation.

mod dead_letters;
mod events;
mod partitions;
mod queues;
mod stress;

pub use dead_letters::*;
pub use events::*;
pub use partitions::*;
pub use queues::*;
pub use stress::*;
