//! The `metadata` section of the runtime settings: defaults, a config file, validation.

use imagepipe_runtime::config::MetadataConfig;
use imagepipe_runtime::{ConfigArgs, ConfigError};

/// The settings from a config file holding `toml`, or the error's message.
fn load(toml: &str) -> Result<imagepipe_runtime::Settings, String> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("imagepipe.toml");
    std::fs::write(&path, toml).unwrap();
    ConfigArgs { config: Some(path) }.load().map_err(|e: ConfigError| e.to_string())
}

#[test]
fn defaults_are_a_hundred_megapixels_and_256_px_thumbnails() {
    let defaults = MetadataConfig::default();
    assert_eq!((defaults.max_pixels, defaults.thumbnail_size), (100_000_000, 256));
    assert_eq!(defaults.memory_budget, imagepipe_runtime::budget::default_capacity());
    assert_eq!(load("").unwrap().metadata, defaults);
}

#[test]
fn the_section_is_read_from_the_config_file() {
    let settings = load(
        "[metadata]\nmax_pixels = 24000000\nthumbnail_size = 512\nthumbnail_quality = 70\nmemory_budget = 2147483648\n",
    )
    .unwrap();
    let expected = MetadataConfig {
        max_pixels: 24_000_000,
        thumbnail_size: 512,
        thumbnail_quality: 70,
        memory_budget: 2 << 30,
        ..Default::default()
    };
    assert_eq!(settings.metadata, expected);
}

#[test]
fn unusable_values_and_unknown_keys_are_refused_by_name() {
    for (toml, key) in [
        ("[metadata]\nmax_pixels = 0\n", "metadata.max_pixels"),
        ("[metadata]\nmax_alloc_bytes = 0\n", "metadata.max_alloc_bytes"),
        ("[metadata]\nthumbnail_size = 8\n", "metadata.thumbnail_size"),
        ("[metadata]\nthumbnail_quality = 0\n", "metadata.thumbnail_quality"),
        ("[metadata]\nmemory_budget = 16777215\n", "metadata.memory_budget"),
        ("[metadata]\nthumbnail_qualty = 80\n", "thumbnail_qualty"),
    ] {
        let error = load(toml).expect_err(toml);
        assert!(error.contains(key), "{toml:?}: {error}");
    }
}
