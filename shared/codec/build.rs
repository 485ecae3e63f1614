//! Links libheif (HEIC/AVIF decoding, `src/heif.rs`) through pkg-config: Debian's
//! `libheif-dev`, which `scripts/image-libs.sh` installs.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if let Err(error) = pkg_config::Config::new().atleast_version("1.15").probe("libheif") {
        eprintln!("libheif >= 1.15 (with its pkg-config file) is needed to build imagepipe-codec: {error}");
        eprintln!("install it with `source scripts/image-libs.sh && ensure_image_libs` (Debian: libheif-dev)");
        std::process::exit(1);
    }
}
