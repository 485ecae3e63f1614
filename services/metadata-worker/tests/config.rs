//! The `metadata` section of the runtime settings: defaults, a config file, validation.

use imagepipe_runtime::config::{MetadataConfig, ThumbnailFormat, ThumbnailSpec};
use imagepipe_runtime::{ConfigArgs, ConfigError};

/// The settings from a config file holding `toml`, or the error's message.
fn load(toml: &str) -> Result<imagepipe_runtime::Settings, String> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("imagepipe.toml");
    std::fs::write(&path, toml).unwrap();
    ConfigArgs { config: Some(path) }.load().map_err(|e: ConfigError| e.to_string())
}

#[test]
fn defaults_are_a_hundred_megapixels_a_webp_thumbnail_and_a_jpeg_preview() {
    let defaults = MetadataConfig::default();
    assert_eq!(defaults.max_pixels, 100_000_000);
    let sizes: Vec<(&str, u32, ThumbnailFormat)> =
        defaults.thumbnails.iter().map(|t| (t.name.as_str(), t.size, t.format)).collect();
    assert_eq!(sizes, [("thumbnail", 256, ThumbnailFormat::Webp), ("preview", 1440, ThumbnailFormat::Jpeg)]);
    assert_eq!(defaults.ai_input, "preview");
    assert_eq!(defaults.memory_budget, imagepipe_runtime::budget::default_capacity());
    assert_eq!(load("").unwrap().metadata, defaults);
}

#[test]
fn the_section_is_read_from_the_config_file() {
    let settings = load(
        "[metadata]\nmax_pixels = 24000000\nmemory_budget = 2147483648\nai_input = \"small\"\n\
         [[metadata.thumbnails]]\nname = \"small\"\nsize = 512\nformat = \"jpeg\"\nquality = 70\n\
         [[metadata.thumbnails]]\nname = \"lossless\"\nsize = 100\nformat = \"png\"\n",
    )
    .unwrap();
    let expected = MetadataConfig {
        max_pixels: 24_000_000,
        thumbnails: vec![
            ThumbnailSpec { name: "small".into(), size: 512, format: ThumbnailFormat::Jpeg, quality: 70 },
            ThumbnailSpec { name: "lossless".into(), size: 100, format: ThumbnailFormat::Png, quality: 85 },
        ],
        ai_input: "small".into(),
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
        ("[metadata]\nthumbnails = []\n", "metadata.thumbnails"),
        ("[[metadata.thumbnails]]\nname = \"preview\"\nsize = 8\nformat = \"jpeg\"\n", "size 8"),
        ("[[metadata.thumbnails]]\nname = \"preview\"\nsize = 800\nformat = \"jpeg\"\nquality = 0\n", "quality 0"),
        ("[[metadata.thumbnails]]\nname = \"preview\"\nsize = 800\nformat = \"gif\"\n", "gif"),
        ("[[metadata.thumbnails]]\nname = \"Big One\"\nsize = 800\nformat = \"png\"\n", "Big One"),
        ("[[metadata.thumbnails]]\nname = \"small\"\nsize = 800\nformat = \"png\"\n", "metadata.ai_input"),
        (
            "[[metadata.thumbnails]]\nname = \"preview\"\nsize = 800\nformat = \"png\"\n\
             [[metadata.thumbnails]]\nname = \"preview\"\nsize = 80\nformat = \"png\"\n",
            "used twice",
        ),
        ("[metadata]\nmemory_budget = 16777215\n", "metadata.memory_budget"),
        ("[metadata]\nthumbnail_qualty = 80\n", "thumbnail_qualty"),
    ] {
        let error = load(toml).expect_err(toml);
        assert!(error.contains(key), "{toml:?}: {error}");
    }
}
