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

/// Decodes `bytes`, which must hold one JSON object (every imagepipe message is one), as `T`;
/// a missing or ill-typed field is rejected with a [`DecodeError`] naming it (unknown fields
/// are tolerated unless `T` denies them). An array or a scalar is refused before serde sees it:
/// serde alone would read an array as a struct's fields in order.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, DecodeError> {
    if bytes.trim_ascii_start().first() != Some(&b'{') {
        return Err(DecodeError {
            type_name: short_type_name::<T>(),
            path: String::new(),
            message: NOT_AN_OBJECT.to_owned(),
        });
    }
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

/// The message of a body that is not a JSON object.
pub const NOT_AN_OBJECT: &str = "the body must be a JSON object";

fn short_type_name<T>() -> &'static str {
    let full = std::any::type_name::<T>();
    let base = full.split('<').next().unwrap_or(full);
    base.rsplit("::").next().unwrap_or(base)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    #[allow(dead_code)]
    struct Pair {
        a: Option<u32>,
        b: String,
    }

    #[test]
    fn only_an_object_is_decoded() {
        assert!(decode::<Pair>(br#" {"a": 1, "b": "x"}"#).is_ok());
        for not_an_object in [&br#"[null, "x"]"#[..], b"\"x\"", b"1", b"", b"  "] {
            let err = decode::<Pair>(not_an_object).unwrap_err();
            assert_eq!((err.type_name, err.message.as_str()), ("Pair", NOT_AN_OBJECT), "{not_an_object:?}");
        }
    }
}
