//! HEIC and AVIF through libheif: the few functions of its C API (`heif.h`, stable since
//! libheif 1.x; Debian 12 ships 1.15.1) the metadata worker calls, and owning wrappers that
//! release what libheif allocates. Every call's contract is stated beside it, and nothing unsafe
//! leaves this file.
//!
//! Written by hand instead of taking `libheif-rs`/`libheif-sys` from crates.io: their current
//! releases (libheif-rs 3, libheif-sys 5) need libheif 1.17 or newer (Debian 12 has 1.15); the
//! older ones (libheif-rs 1.0, libheif-sys 2) run bindgen (libclang) at build time by default and
//! do not expose the image size limit.
//! Every function here exists in libheif 1.15 (`heif_init` since 1.13) and keeps its C ABI in
//! later 1.x releases; `build.rs` checks for ≥ 1.15. The decoders are libheif's plugins (its
//! built-in ones in 1.15, shared objects loaded by `heif_init` from 1.17 on): [`decoders`] lists
//! them, and [`HeifHandle::decode_interleaved`] can ask for one by its id (`decoder_id` of the
//! decoding options; a profile shows libavcodec decoding with libheif 1.19), e.g. the FFmpeg HEVC decoder of Debian's
//! `libheif-plugin-ffmpegdec`, which libheif otherwise ranks below libde265.

use std::ffi::{CStr, c_char, c_int, c_void};
use std::marker::PhantomData;
use std::ptr::{self, NonNull};
use std::sync::OnceLock;

/// `enum heif_error_code`: the main category of an error.
#[allow(non_camel_case_types)]
type heif_error_code = c_int;
/// `heif_item_id`.
#[allow(non_camel_case_types)]
type heif_item_id = u32;

/// `struct heif_error`, returned by value.
#[repr(C)]
#[derive(Clone, Copy)]
struct RawError {
    code: heif_error_code,
    subcode: c_int,
    /// Always a valid C string (static or owned by the context until its next call).
    message: *const c_char,
}

/// `struct heif_decoding_options` up to version 4 (libheif 1.15; 1.19 has version 6, whose
/// fields follow these). Only ever allocated by
/// `heif_decoding_options_alloc`, which fills the fields of the version the library has; the
/// fields written here exist from version 2 and 3, and are written only when `version` says
/// they do.
#[repr(C)]
struct DecodingOptions {
    version: u8,
    ignore_transformations: u8,
    start_progress: *const c_void,
    on_progress: *const c_void,
    end_progress: *const c_void,
    progress_user_data: *mut c_void,
    convert_hdr_to_8bit: u8,
    strict_decoding: u8,
    decoder_id: *const c_char,
}

#[repr(C)]
struct Context {
    _private: [u8; 0],
}
#[repr(C)]
struct Handle {
    _private: [u8; 0],
}
#[repr(C)]
struct Image {
    _private: [u8; 0],
}
#[repr(C)]
struct DecoderDescriptor {
    _private: [u8; 0],
}

const HEIF_ERROR_OK: heif_error_code = 0;
/// `heif_error_Memory_allocation_error`.
const HEIF_ERROR_MEMORY_ALLOCATION: heif_error_code = 6;
/// `heif_suberror_Security_limit_exceeded`.
const SUBERROR_SECURITY_LIMIT: c_int = 1000;
const COLORSPACE_RGB: c_int = 1;
const CHROMA_INTERLEAVED_RGB: c_int = 10;
const CHROMA_INTERLEAVED_RGBA: c_int = 11;
const CHANNEL_INTERLEAVED: c_int = 10;
/// `heif_compression_HEVC`.
const COMPRESSION_HEVC: c_int = 1;
/// `heif_compression_AV1`.
const COMPRESSION_AV1: c_int = 4;
const fn fourcc(code: &[u8; 4]) -> u32 {
    u32::from_be_bytes(*code)
}

// Linked by `build.rs` (pkg-config `libheif`, at least 1.15).
unsafe extern "C" {
    fn heif_init(params: *mut c_void) -> RawError;
    fn heif_get_version() -> *const c_char;
    fn heif_get_decoder_descriptors(
        format_filter: c_int,
        out_decoders: *mut *const DecoderDescriptor,
        count: c_int,
    ) -> c_int;
    fn heif_decoder_descriptor_get_name(descriptor: *const DecoderDescriptor) -> *const c_char;
    fn heif_decoder_descriptor_get_id_name(descriptor: *const DecoderDescriptor) -> *const c_char;
    fn heif_context_set_max_decoding_threads(ctx: *mut Context, max_threads: c_int);
    fn heif_context_alloc() -> *mut Context;
    fn heif_context_free(ctx: *mut Context);
    fn heif_context_set_maximum_image_size_limit(ctx: *mut Context, maximum_width: c_int);
    fn heif_context_read_from_memory_without_copy(
        ctx: *mut Context,
        mem: *const c_void,
        size: usize,
        options: *const c_void,
    ) -> RawError;
    fn heif_context_get_number_of_top_level_images(ctx: *mut Context) -> c_int;
    fn heif_context_get_primary_image_handle(ctx: *mut Context, handle: *mut *mut Handle) -> RawError;
    fn heif_image_handle_release(handle: *const Handle);
    fn heif_image_handle_get_width(handle: *const Handle) -> c_int;
    fn heif_image_handle_get_height(handle: *const Handle) -> c_int;
    fn heif_image_handle_get_ispe_width(handle: *const Handle) -> c_int;
    fn heif_image_handle_get_ispe_height(handle: *const Handle) -> c_int;
    fn heif_image_handle_has_alpha_channel(handle: *const Handle) -> c_int;
    fn heif_image_handle_get_luma_bits_per_pixel(handle: *const Handle) -> c_int;
    fn heif_image_handle_get_chroma_bits_per_pixel(handle: *const Handle) -> c_int;
    fn heif_image_handle_get_color_profile_type(handle: *const Handle) -> u32;
    fn heif_image_handle_get_number_of_metadata_blocks(handle: *const Handle, type_filter: *const c_char) -> c_int;
    fn heif_image_handle_get_list_of_metadata_block_IDs(
        handle: *const Handle,
        type_filter: *const c_char,
        ids: *mut heif_item_id,
        count: c_int,
    ) -> c_int;
    fn heif_image_handle_get_metadata_size(handle: *const Handle, id: heif_item_id) -> usize;
    fn heif_image_handle_get_metadata(handle: *const Handle, id: heif_item_id, out: *mut c_void) -> RawError;
    fn heif_decoding_options_alloc() -> *mut DecodingOptions;
    fn heif_decoding_options_free(options: *mut DecodingOptions);
    fn heif_decode_image(
        handle: *const Handle,
        out_img: *mut *mut Image,
        colorspace: c_int,
        chroma: c_int,
        options: *const DecodingOptions,
    ) -> RawError;
    fn heif_image_release(image: *const Image);
    fn heif_image_get_width(image: *const Image, channel: c_int) -> c_int;
    fn heif_image_get_height(image: *const Image, channel: c_int) -> c_int;
    fn heif_image_get_bits_per_pixel_range(image: *const Image, channel: c_int) -> c_int;
    fn heif_image_get_plane_readonly(image: *const Image, channel: c_int, out_stride: *mut c_int) -> *const u8;
}

/// An error libheif reported: its category, sub-category and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeifError {
    /// `enum heif_error_code`.
    pub code: c_int,
    /// `enum heif_suberror_code`.
    pub subcode: c_int,
    /// libheif's message.
    pub message: String,
}

impl HeifError {
    /// A security limit of libheif refused the file (an image larger than the context allows).
    pub fn is_security_limit(&self) -> bool {
        self.subcode == SUBERROR_SECURITY_LIMIT
    }

    fn usage(message: &str) -> Self {
        Self { code: 5, subcode: 0, message: message.to_owned() }
    }
}

/// `Ok` or the error, with its message copied before the next libheif call can overwrite it.
fn check(error: RawError) -> Result<(), HeifError> {
    if error.code == HEIF_ERROR_OK {
        return Ok(());
    }
    let message = if error.message.is_null() {
        String::new()
    } else {
        // SAFETY: libheif documents `message` as always defined: a NUL-terminated string that
        // stays valid at least until the next call on the same context, and we copy it now.
        unsafe { CStr::from_ptr(error.message) }.to_string_lossy().into_owned()
    };
    Err(HeifError { code: error.code, subcode: error.subcode, message })
}

/// Calls `heif_init` once per process (it is reference counted; we never deinit, so the
/// built-in decoders stay registered for the process's life).
fn init() -> Result<(), HeifError> {
    static INIT: OnceLock<Result<(), HeifError>> = OnceLock::new();
    // SAFETY: `heif_init` accepts a null parameter block and is safe to call from any thread.
    INIT.get_or_init(|| check(unsafe { heif_init(ptr::null_mut()) })).clone()
}

/// libheif's version, e.g. `1.19.7`.
pub fn version() -> String {
    // SAFETY: no preconditions; a static NUL-terminated string.
    let version = unsafe { heif_get_version() };
    if version.is_null() {
        return String::new();
    }
    // SAFETY: non-null, static and NUL-terminated (see above).
    unsafe { CStr::from_ptr(version) }.to_string_lossy().into_owned()
}

/// A coding libheif decodes through one of its decoder plugins.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    /// HEVC (HEIC).
    Hevc,
    /// AV1 (AVIF).
    Av1,
}

/// A decoder libheif has for a [`Compression`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decoder {
    /// Its short, stable id, what [`HeifHandle::decode_interleaved`] takes (`ffmpeg`,
    /// `libde265`, `dav1d`, ...); empty for a plugin too old to have one.
    pub id: String,
    /// Its descriptive name, with the codec library's version.
    pub name: String,
}

/// The decoders libheif has for `compression`, highest priority first (the one it uses unless
/// told otherwise). Calls `heif_init` first, which loads the plugins.
pub fn decoders(compression: Compression) -> Result<Vec<Decoder>, HeifError> {
    init()?;
    let format = match compression {
        Compression::Hevc => COMPRESSION_HEVC,
        Compression::Av1 => COMPRESSION_AV1,
    };
    // SAFETY: a null list asks for the count alone.
    let count = unsafe { heif_get_decoder_descriptors(format, ptr::null_mut(), 0) };
    let mut descriptors = vec![ptr::null::<DecoderDescriptor>(); usize::try_from(count).unwrap_or(0)];
    let capacity = c_int::try_from(descriptors.len()).unwrap_or(0);
    // SAFETY: `descriptors` has room for `capacity` pointers; libheif writes at most that many.
    let written = unsafe { heif_get_decoder_descriptors(format, descriptors.as_mut_ptr(), capacity) };
    descriptors.truncate(usize::try_from(written).unwrap_or(0));
    let text = |s: *const c_char| {
        // SAFETY: null or a NUL-terminated string of the plugin, which stays loaded for the
        // process's life (we never deinit).
        if s.is_null() { String::new() } else { unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned() }
    };
    Ok(descriptors
        .into_iter()
        .filter(|d| !d.is_null())
        .map(|d| Decoder {
            // SAFETY: a descriptor libheif listed, static for the process's life.
            id: text(unsafe { heif_decoder_descriptor_get_id_name(d) }),
            // SAFETY: as above.
            name: text(unsafe { heif_decoder_descriptor_get_name(d) }),
        })
        .collect())
}

/// A libheif context reading `bytes` in place (no copy), freed on drop. Borrowing `bytes` keeps
/// them alive as long as the context, as `heif_context_read_from_memory_without_copy` requires.
pub struct HeifContext<'a> {
    ctx: NonNull<Context>,
    _bytes: PhantomData<&'a [u8]>,
}

// SAFETY: a context is used by one thread at a time (it is not `Sync`), which libheif allows:
// it keeps no thread-local state, and contexts are independent of each other.
unsafe impl Send for HeifContext<'_> {}

impl<'a> HeifContext<'a> {
    /// Parses the container of `bytes` (no pixels are decoded), refusing any image whose width
    /// or height in the file is `max_edge` or more before anything is allocated for it.
    pub fn read(bytes: &'a [u8], max_edge: u32) -> Result<Self, HeifError> {
        init()?;
        // SAFETY: no preconditions; null means out of memory.
        let ctx = NonNull::new(unsafe { heif_context_alloc() })
            .ok_or_else(|| HeifError::usage("libheif could not allocate a context"))?;
        let context = Self { ctx, _bytes: PhantomData };
        let limit = c_int::try_from(max_edge).unwrap_or(c_int::MAX);
        // SAFETY: `ctx` is a live context; the limit must be set before reading to apply to it.
        unsafe { heif_context_set_maximum_image_size_limit(context.ctx.as_ptr(), limit) };
        // SAFETY: `bytes` outlives the context (the lifetime `'a`); null reading options are
        // the documented default.
        check(unsafe {
            heif_context_read_from_memory_without_copy(
                context.ctx.as_ptr(),
                bytes.as_ptr().cast(),
                bytes.len(),
                ptr::null(),
            )
        })?;
        Ok(context)
    }

    /// How many threads of its own libheif decodes the tiles of a grid image on: 0 decodes them
    /// one after the other on the calling thread (libheif's default is 4 threads). The codec
    /// may still use threads of its own.
    pub fn set_decoding_threads(&mut self, threads: u32) {
        let threads = c_int::try_from(threads).unwrap_or(c_int::MAX);
        // SAFETY: live context, not decoding (decoding borrows it).
        unsafe { heif_context_set_max_decoding_threads(self.ctx.as_ptr(), threads) }
    }

    /// The number of top-level images (thumbnails, alpha and depth images are not counted).
    pub fn top_level_images(&self) -> u32 {
        // SAFETY: live context.
        let count = unsafe { heif_context_get_number_of_top_level_images(self.ctx.as_ptr()) };
        u32::try_from(count).unwrap_or(0)
    }

    /// The primary image.
    pub fn primary(&self) -> Result<HeifHandle<'_>, HeifError> {
        let mut handle = ptr::null_mut();
        // SAFETY: live context; `handle` is written on success.
        check(unsafe { heif_context_get_primary_image_handle(self.ctx.as_ptr(), &mut handle) })?;
        let handle = NonNull::new(handle).ok_or_else(|| HeifError::usage("libheif returned no primary image"))?;
        Ok(HeifHandle { handle, _context: PhantomData })
    }
}

impl Drop for HeifContext<'_> {
    fn drop(&mut self) {
        // SAFETY: allocated by `heif_context_alloc`, freed once; handles borrow the context, so
        // none outlives it.
        unsafe { heif_context_free(self.ctx.as_ptr()) }
    }
}

/// The colour profile attached to an image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProfileType {
    /// An ICC profile (`rICC` restricted or `prof` unrestricted).
    Icc,
    /// An `nclx` box: colour primaries, transfer and matrix by number (H.273).
    Nclx,
}

/// An image of a context, released on drop.
pub struct HeifHandle<'c> {
    handle: NonNull<Handle>,
    _context: PhantomData<&'c Context>,
}

impl HeifHandle<'_> {
    fn raw(&self) -> *const Handle {
        self.handle.as_ptr()
    }

    /// Width and height as displayed: after the `clap`, `irot` and `imir` transformations.
    pub fn size(&self) -> (i64, i64) {
        // SAFETY: live handle (it borrows its context).
        unsafe { (heif_image_handle_get_width(self.raw()).into(), heif_image_handle_get_height(self.raw()).into()) }
    }

    /// Width and height as stored (the `ispe` property, before transformations).
    pub fn stored_size(&self) -> (i64, i64) {
        // SAFETY: live handle.
        unsafe {
            (heif_image_handle_get_ispe_width(self.raw()).into(), heif_image_handle_get_ispe_height(self.raw()).into())
        }
    }

    /// Whether an alpha image is attached.
    pub fn has_alpha(&self) -> bool {
        // SAFETY: live handle.
        unsafe { heif_image_handle_has_alpha_channel(self.raw()) != 0 }
    }

    /// Bits per sample of luma and chroma (-1 when unknown).
    pub fn bits_per_pixel(&self) -> (i32, i32) {
        // SAFETY: live handle.
        unsafe {
            (
                heif_image_handle_get_luma_bits_per_pixel(self.raw()),
                heif_image_handle_get_chroma_bits_per_pixel(self.raw()),
            )
        }
    }

    /// The colour profile of the image, if it has one.
    pub fn profile(&self) -> Option<ProfileType> {
        // SAFETY: live handle.
        match unsafe { heif_image_handle_get_color_profile_type(self.raw()) } {
            t if t == fourcc(b"nclx") => Some(ProfileType::Nclx),
            t if t == fourcc(b"rICC") || t == fourcc(b"prof") => Some(ProfileType::Icc),
            _ => None,
        }
    }

    /// The raw metadata blocks of type `kind` (e.g. `c"Exif"`), as stored in the file; a block
    /// over `max_bytes` is a security-limit error, refused before anything is allocated for it.
    pub fn metadata(&self, kind: &CStr, max_bytes: usize) -> Result<Vec<Vec<u8>>, HeifError> {
        // SAFETY: live handle; `kind` is NUL-terminated.
        let count = unsafe { heif_image_handle_get_number_of_metadata_blocks(self.raw(), kind.as_ptr()) };
        let mut ids = vec![0; usize::try_from(count).unwrap_or(0)];
        // SAFETY: `ids` has room for `count` ids; libheif writes at most that many.
        let written = unsafe {
            heif_image_handle_get_list_of_metadata_block_IDs(self.raw(), kind.as_ptr(), ids.as_mut_ptr(), count.max(0))
        };
        ids.truncate(usize::try_from(written).unwrap_or(0));
        let mut blocks = Vec::with_capacity(ids.len());
        for id in ids {
            // SAFETY: live handle and an id libheif listed. The size is that of the item's
            // extents, which lie inside the file (libheif checks them against the input).
            let size = unsafe { heif_image_handle_get_metadata_size(self.raw(), id) };
            if size > max_bytes {
                return Err(HeifError {
                    code: HEIF_ERROR_MEMORY_ALLOCATION,
                    subcode: SUBERROR_SECURITY_LIMIT,
                    message: format!("metadata block {id} has {size} bytes, over the limit of {max_bytes}"),
                });
            }
            let mut block = vec![0u8; size];
            if size > 0 {
                // SAFETY: `block` has exactly the size libheif reported for this id.
                check(unsafe { heif_image_handle_get_metadata(self.raw(), id, block.as_mut_ptr().cast()) })?;
            }
            blocks.push(block);
        }
        Ok(blocks)
    }

    /// Decodes the image to 8-bit interleaved RGB (or RGBA when `alpha`), with the file's
    /// transformations applied, strictly (a decoder warning is an error), by the decoder whose
    /// id is `decoder` (one [`decoders`] lists for the image's coding), or libheif's first.
    pub fn decode_interleaved(&self, alpha: bool, decoder: Option<&'static CStr>) -> Result<HeifImage, HeifError> {
        let chroma = if alpha { CHROMA_INTERLEAVED_RGBA } else { CHROMA_INTERLEAVED_RGB };
        let options = DecodingOptionsBox::new(decoder)?;
        let mut image = ptr::null_mut();
        // SAFETY: live handle and options; `image` is written on success and owned by us.
        check(unsafe { heif_decode_image(self.raw(), &mut image, COLORSPACE_RGB, chroma, options.0.as_ptr()) })?;
        let image = NonNull::new(image).ok_or_else(|| HeifError::usage("libheif returned no image"))?;
        Ok(HeifImage { image })
    }
}

impl Drop for HeifHandle<'_> {
    fn drop(&mut self) {
        // SAFETY: obtained from `heif_context_get_primary_image_handle`, released once.
        unsafe { heif_image_handle_release(self.raw()) }
    }
}

/// Decoding options, freed on drop.
struct DecodingOptionsBox(NonNull<DecodingOptions>);

impl DecodingOptionsBox {
    /// libheif's defaults, transformations applied, HDR converted to 8 bits, strict, and the
    /// decoder `decoder` (a static string: libheif keeps the pointer while it decodes).
    fn new(decoder: Option<&'static CStr>) -> Result<Self, HeifError> {
        // SAFETY: no preconditions; null means out of memory.
        let options = NonNull::new(unsafe { heif_decoding_options_alloc() })
            .ok_or_else(|| HeifError::usage("libheif could not allocate decoding options"))?;
        let mut options = Self(options);
        // SAFETY: the structure came from `heif_decoding_options_alloc`, which allocates and
        // fills the fields of its `version`; only fields that version has are written.
        let fields = unsafe { options.0.as_mut() };
        fields.ignore_transformations = 0;
        if fields.version >= 2 {
            fields.convert_hdr_to_8bit = 1;
        }
        if fields.version >= 3 {
            fields.strict_decoding = 1;
        }
        if let Some(decoder) = decoder
            && fields.version >= 4
        {
            fields.decoder_id = decoder.as_ptr();
        }
        Ok(options)
    }
}

impl Drop for DecodingOptionsBox {
    fn drop(&mut self) {
        // SAFETY: allocated by `heif_decoding_options_alloc`, freed once.
        unsafe { heif_decoding_options_free(self.0.as_ptr()) }
    }
}

/// A decoded image, released on drop.
pub struct HeifImage {
    image: NonNull<Image>,
}

// SAFETY: a decoded image is plain memory owned by this value; libheif does not share it.
unsafe impl Send for HeifImage {}

impl HeifImage {
    /// Width and height of the interleaved plane.
    pub fn size(&self) -> (i64, i64) {
        let image = self.image.as_ptr();
        // SAFETY: live image.
        unsafe {
            (
                heif_image_get_width(image, CHANNEL_INTERLEAVED).into(),
                heif_image_get_height(image, CHANNEL_INTERLEAVED).into(),
            )
        }
    }

    /// Bits per sample of the interleaved plane.
    pub fn bits_per_sample(&self) -> i32 {
        // SAFETY: live image.
        unsafe { heif_image_get_bits_per_pixel_range(self.image.as_ptr(), CHANNEL_INTERLEAVED) }
    }

    /// The interleaved plane: its rows are `stride` bytes apart, and it holds `height` of them
    /// (the last row may end right after its pixels). `None` when the image has no interleaved
    /// plane or the plane does not fit `row_bytes` per row.
    pub fn plane(&self, row_bytes: usize, height: usize) -> Option<(&[u8], usize)> {
        let mut stride: c_int = 0;
        // SAFETY: live image; `stride` is written when the plane exists.
        let data = unsafe { heif_image_get_plane_readonly(self.image.as_ptr(), CHANNEL_INTERLEAVED, &mut stride) };
        let stride = usize::try_from(stride).ok()?;
        if data.is_null() || stride < row_bytes || height == 0 {
            return None;
        }
        let len = stride.checked_mul(height - 1)?.checked_add(row_bytes)?;
        // SAFETY: libheif allocated the plane as `height` rows of `stride` bytes, each holding
        // at least `row_bytes` (checked above against the plane's width in the caller), and it
        // lives as long as `self`, which the slice borrows.
        Some((unsafe { std::slice::from_raw_parts(data, len) }, stride))
    }
}

impl Drop for HeifImage {
    fn drop(&mut self) {
        // SAFETY: obtained from `heif_decode_image`, released once.
        unsafe { heif_image_release(self.image.as_ptr()) }
    }
}
