//! tract: the pure-Rust runtime, the fallback when onnxruntime's library is not there. Loads
//! and optimises the graph once for the fixed input shape, with the outputs it is asked for as
//! the graph's outputs (so the features and the logits come from one run); runs on the caller's
//! thread.

use std::sync::Arc;

use tract_onnx::prelude::tract_ndarray::Array4;
use tract_onnx::prelude::*;

use super::{OutputNames, RawOutputs};
use crate::error::AnalyzeError;
use crate::preprocess::INPUT_SIZE;

/// The graph, optimised by tract for a `[1,3,224,224]` input.
#[derive(Debug)]
pub struct TractBackend {
    plan: Arc<TypedRunnableModel>,
    /// Whether the plan's second output is the features.
    features: bool,
}

impl TractBackend {
    /// Loads and optimises the ONNX graph `onnx_bytes` to give `outputs`, in that order; the
    /// error is tract's whole chain.
    pub fn load(onnx_bytes: &[u8], outputs: &OutputNames) -> Result<Self, String> {
        optimise(onnx_bytes, outputs)
            .map(|plan| Self { plan, features: outputs.features.is_some() })
            .map_err(|e| format!("{e:#}"))
    }

    /// One run on one input: the logits, and the features when they were asked for.
    pub(crate) fn run(&self, input: Array4<f32>) -> Result<RawOutputs, AnalyzeError> {
        let outputs = self.plan.run(tvec!(Tensor::from(input).into())).map_err(inference_error)?;
        let read = |ix: usize| -> Result<Vec<f32>, AnalyzeError> {
            let values = outputs[ix].to_plain_array_view::<f32>().map_err(inference_error)?;
            Ok(values.iter().copied().collect())
        };
        Ok(RawOutputs { logits: read(0)?, features: if self.features { Some(read(1)?) } else { None } })
    }
}

fn optimise(onnx_bytes: &[u8], outputs: &OutputNames) -> TractResult<Arc<TypedRunnableModel>> {
    let size = INPUT_SIZE as usize;
    let names: Vec<&str> = std::iter::once(&outputs.logits).chain(&outputs.features).map(String::as_str).collect();
    tract_onnx::onnx()
        .model_for_read(&mut &onnx_bytes[..])?
        .with_outputs_by_name(names)?
        .with_input_fact(0, f32::fact([1, 3, size, size]).into())?
        .into_optimized()?
        .into_runnable()
}

fn inference_error(error: TractError) -> AnalyzeError {
    AnalyzeError::Inference(format!("tract: {error:#}"))
}
