//! The similarity indexer's in-memory indexes.
//!
//! - [`VectorIndex`] holds the embeddings of one model version as int8 vectors in one contiguous
//!   buffer; it answers by an exact scan up to its `exact_limit` images and through an HNSW graph
//!   (its own: it links the index's slots without copying their vectors) beyond.
//! - [`PhashIndex`] holds 64-bit perceptual hashes and finds those within a Hamming distance.
//! - [`groups`] joins near-duplicate pairs into groups.
//! - [`mod@bench`] measures all of it at a given scale (the `scale` example and
//!   `imagepipe bench --scenario similarity`).

pub mod bench;
mod dot;
mod groups;
mod hnsw;
mod phash;
mod store;
mod synthetic;
mod vector;

pub use groups::groups;
pub use phash::{PhashIndex, hamming, parse_phash};
pub use vector::{Hit, IndexError, VectorIndex};
