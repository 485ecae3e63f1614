//! Image codecs the workers share, through the system's C libraries (installed by
//! `scripts/image-libs.sh`):
//!
//! - [`jpeg`]: libjpeg-turbo. Decoding at a reduced DCT scale, so a 12 MP photo needed at
//!   1440 px (the metadata worker) or at 224 px (the AI worker) is never held at full size;
//!   JPEG encoding for derivatives.
//! - [`heif`]: libheif (with libde265 and dav1d). HEIC and AVIF, decoded upright.

#[allow(unsafe_code)]
pub mod heif;
#[allow(unsafe_code)]
pub mod jpeg;
