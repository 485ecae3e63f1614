//! Decoding JSON messages with errors that name the offending field.

use serde::de::DeserializeOwned;

/// A message body that is not valid JSON for its type. `path` names the field
/// (`payload.width`, `timestamp`); it is empty when the body itself is malformed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {type_name}{}: {message}", if path.is_empty() { String::new() } else { format!(" at `{path}`") })]
pub struct DecodeError {
    /// The Rust type that was expected.
    pub type_name: &'static str,
    /// Dotted path of the field that failed, empty for top-level errors.
    pub path: String,
    /// What was wrong, from the JSON parser (a missing field names itself here).
    pub message: String,
}

/// Decodes `bytes` as `T`; unknown fields are tolerated, a missing or ill-typed field is
/// rejected with a [`DecodeError`] naming it.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, DecodeError> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|err| {
        let path = err.path().to_string();
        DecodeError {
            type_name: short_type_name::<T>(),
            path: if path == "." { String::new() } else { path },
            message: err.into_inner().to_string(),
        }
    })?;
    de.end().map_err(|err| DecodeError {
        type_name: short_type_name::<T>(),
        path: String::new(),
        message: err.to_string(),
    })?;
    Ok(value)
}

fn short_type_name<T>() -> &'static str {
    let full = std::any::type_name::<T>();
    let base = full.split('<').next().unwrap_or(full);
    base.rsplit("::").next().unwrap_or(base)
}
