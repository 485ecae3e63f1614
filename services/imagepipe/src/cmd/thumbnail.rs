//! `imagepipe thumbnail ID [--name preview] [-o FILE]`: a derivative the metadata step wrote
//! (by default the smallest thumbnail; `GET /v1/blobs/{key}`), saved to a file.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;

use super::show::size;
use crate::ApiArgs;

/// Options of `imagepipe thumbnail`.
#[derive(Debug, Args)]
pub struct ThumbnailArgs {
    /// The task id.
    id: String,
    /// Which derivative of `metadata.thumbnails` (`thumbnail`, `preview`, ...); default: the
    /// smallest.
    #[arg(long)]
    name: Option<String>,
    /// Where to write it: a file, or `-` for standard output (refused on a terminal). Default:
    /// `<id>-<name>.<webp|jpg|png>` in the current directory. A file whose extension names
    /// another format than the derivative's (a preview of a transparent image is a PNG) is
    /// refused.
    #[arg(short, long)]
    output: Option<PathBuf>,
}

/// Fetches the task's thumbnail and writes it out, then names the file.
pub async fn run(api: &ApiArgs, args: ThumbnailArgs) -> anyhow::Result<ExitCode> {
    let client = api.client()?;
    let view = client.task(&args.id).await?;
    let Some(metadata) = &view.task.outputs.metadata else {
        anyhow::bail!(
            "task {} has no thumbnail: its metadata step has not succeeded (it is {})",
            args.id,
            view.task.state
        );
    };
    let to_stdout = args.output.as_deref().is_some_and(|o| o.as_os_str() == "-");
    if to_stdout && std::io::stdout().is_terminal() {
        anyhow::bail!("standard output is a terminal: give -o FILE, or redirect it (-o - > thumb.jpg)");
    }
    let (name, key) = match &args.name {
        None => ("thumbnail", metadata.thumbnail_key.as_str()),
        Some(name) => match metadata.thumbnails.iter().find(|t| &t.name == name) {
            Some(found) => (found.name.as_str(), found.key.as_str()),
            None => {
                let names: Vec<&str> = metadata.thumbnails.iter().map(|t| t.name.as_str()).collect();
                anyhow::bail!("task {} has no derivative named {name:?} (it has: {})", args.id, names.join(", "))
            }
        },
    };
    let (content_type, bytes) = client.blob(key).await?;
    if to_stdout {
        super::output::write_bytes(&bytes);
        return Ok(ExitCode::SUCCESS);
    }
    let format = extension(content_type.as_deref());
    let path = args.output.unwrap_or_else(|| PathBuf::from(format!("{}-{name}.{format}", args.id)));
    if let Some(given) = path.extension().and_then(|e| e.to_str())
        && format != "bin"
        && !same_format(given, format)
    {
        anyhow::bail!(
            "the {name} of task {} is {} ({}), not the .{given} {} says: name it {}, or give -o -",
            args.id,
            format.to_uppercase(),
            content_type.as_deref().unwrap_or("?"),
            path.display(),
            path.with_extension(format).display()
        );
    }
    tokio::fs::write(&path, &bytes).await.with_context(|| format!("writing {}", path.display()))?;
    outln!("{} ({}, {})", path.display(), format.to_uppercase(), size(bytes.len() as u64));
    Ok(ExitCode::SUCCESS)
}

/// The file extension of an image content type: `image/jpeg` → `jpg`, `image/png` → `png`.
fn extension(content_type: Option<&str>) -> &str {
    match content_type.and_then(|c| c.split(';').next()?.trim().strip_prefix("image/")) {
        Some("jpeg") => "jpg",
        Some(subtype) if !subtype.is_empty() && subtype.bytes().all(|b| b.is_ascii_alphanumeric()) => subtype,
        _ => "bin",
    }
}

/// Whether a file extension names the image format `format` (an [`extension`]).
fn same_format(given: &str, format: &str) -> bool {
    let given = given.to_ascii_lowercase();
    given == format || (format == "jpg" && given == "jpeg")
}

#[cfg(test)]
mod tests {
    use super::{extension, same_format};

    #[test]
    fn a_file_name_matches_the_format_whatever_its_case_or_jpeg_spelling() {
        assert!(same_format("JPG", "jpg") && same_format("jpeg", "jpg") && same_format("webp", "webp"));
        assert!(!same_format("jpg", "png") && !same_format("png", "webp"));
    }

    #[test]
    fn the_extension_follows_the_content_type() {
        assert_eq!(extension(Some("image/jpeg")), "jpg");
        assert_eq!(extension(Some("image/png; charset=binary")), "png");
        assert_eq!(extension(Some("application/octet-stream")), "bin");
        assert_eq!(extension(None), "bin");
    }
}
