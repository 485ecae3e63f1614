//! [`Embedding`]: an image's visual embedding as it travels in `image.analyzed` — L2-normalised,
//! quantised to one signed byte per component with one scale, base64 — so the event stays small
//! (1,280 components take 1,708 characters) while cosines computed from it stay within about
//! 0.005 of the float vector's.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// An image's visual embedding, quantised (see the module docs). Component `i` of the unit
/// vector is `scale * q[i]`, `q` being the signed bytes `i8` holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Embedding {
    /// Which model and layer made it (the model manifest's `embedding.version`); vectors of
    /// different versions are never compared.
    pub version: String,
    /// Number of components.
    pub dim: u32,
    /// The factor turning a quantised component back into the unit vector's.
    pub scale: f32,
    /// The quantised components, one signed byte each, base64 (standard alphabet, padded).
    pub i8: String,
}

/// An [`Embedding`] that cannot be read back.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EmbeddingError {
    /// `i8` is not base64.
    #[error("embedding components are not base64: {0}")]
    Base64(String),
    /// `i8` holds another number of components than `dim` says.
    #[error("embedding has {actual} components, its dim says {dim}")]
    Dim {
        /// What `dim` says.
        dim: u32,
        /// What `i8` holds.
        actual: usize,
    },
    /// The vector is all zeros, or not finite, so it has no direction.
    #[error("embedding has no direction (zero or not finite)")]
    Degenerate,
}

impl Embedding {
    /// `features` L2-normalised and quantised, labelled `version`.
    pub fn from_features(version: impl Into<String>, features: &[f32]) -> Result<Self, EmbeddingError> {
        let unit = normalize(features)?;
        let max = unit.iter().fold(0f32, |m, v| m.max(v.abs()));
        let scale = max / 127.0;
        let bytes: Vec<u8> = unit.iter().map(|v| ((v / scale).round().clamp(-127.0, 127.0) as i8) as u8).collect();
        Ok(Self { version: version.into(), dim: unit.len() as u32, scale, i8: STANDARD.encode(bytes) })
    }

    /// The quantised components.
    pub fn components(&self) -> Result<Vec<i8>, EmbeddingError> {
        let bytes = STANDARD.decode(&self.i8).map_err(|e| EmbeddingError::Base64(e.to_string()))?;
        if bytes.len() != self.dim as usize {
            return Err(EmbeddingError::Dim { dim: self.dim, actual: bytes.len() });
        }
        Ok(bytes.into_iter().map(|b| b as i8).collect())
    }

    /// The unit vector, as well as the quantisation keeps it.
    pub fn to_unit(&self) -> Result<Vec<f32>, EmbeddingError> {
        let values: Vec<f32> = self.components()?.into_iter().map(|q| f32::from(q) * self.scale).collect();
        normalize(&values)
    }
}

/// `features` scaled to length 1.
pub fn normalize(features: &[f32]) -> Result<Vec<f32>, EmbeddingError> {
    let norm = features.iter().map(|v| v * v).sum::<f32>().sqrt();
    if !norm.is_finite() || norm == 0.0 {
        return Err(EmbeddingError::Degenerate);
    }
    Ok(features.iter().map(|v| v / norm).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cosine(a: &[f32], b: &[f32]) -> f32 {
        a.iter().zip(b).map(|(x, y)| x * y).sum()
    }

    #[test]
    fn a_quantised_vector_keeps_its_direction() {
        let features: Vec<f32> = (0..1280).map(|i| ((i * 7919) % 1000) as f32 / 997.0).collect();
        let embedding = Embedding::from_features("m@1/pool", &features).unwrap();
        assert_eq!(embedding.dim, 1280);
        assert_eq!(embedding.i8.len(), 1708);
        let back = embedding.to_unit().unwrap();
        let unit = normalize(&features).unwrap();
        assert!(cosine(&back, &unit) > 0.999, "cosine {}", cosine(&back, &unit));
    }

    #[test]
    fn a_broken_embedding_is_an_error_naming_what_is_wrong() {
        let mut embedding = Embedding::from_features("m", &[1.0, 2.0, 3.0]).unwrap();
        embedding.dim = 4;
        assert_eq!(embedding.components(), Err(EmbeddingError::Dim { dim: 4, actual: 3 }));
        embedding.i8 = "***".into();
        assert!(matches!(embedding.components(), Err(EmbeddingError::Base64(_))));
        assert_eq!(Embedding::from_features("m", &[0.0, 0.0]), Err(EmbeddingError::Degenerate));
    }
}
