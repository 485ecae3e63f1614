//! tract: the pure-Rust runtime, the fallback when onnxruntime's library is not there. Loads
//! and optimises the graph once for the fixed input shape; runs on the caller's thread.

use std::sync::Arc;

use tract_onnx::prelude::tract_ndarray::Array4;
use tract_onnx::prelude::*;

use crate::error::AnalyzeError;
use crate::preprocess::INPUT_SIZE;

/// The graph, optimised by tract for a `[1,3,224,224]` input.
#[derive(Debug)]
pub struct TractBackend {
    plan: Arc<TypedRunnableModel>,
}

impl TractBackend {
    /// Loads and optimises the ONNX graph `onnx_bytes`; the error is tract's whole chain.
    pub fn load(onnx_bytes: &[u8]) -> Result<Self, String> {
        optimise(onnx_bytes).map(|plan| Self { plan }).map_err(|e| format!("{e:#}"))
    }

    /// The graph's first output (the logits) for one input.
    pub fn logits(&self, input: Array4<f32>) -> Result<Vec<f32>, AnalyzeError> {
        let outputs = self.plan.run(tvec!(Tensor::from(input).into())).map_err(inference_error)?;
        let logits = outputs[0].to_plain_array_view::<f32>().map_err(inference_error)?;
        Ok(logits.iter().copied().collect())
    }
}

fn optimise(onnx_bytes: &[u8]) -> TractResult<Arc<TypedRunnableModel>> {
    let size = INPUT_SIZE as usize;
    tract_onnx::onnx()
        .model_for_read(&mut &onnx_bytes[..])?
        .with_input_fact(0, f32::fact([1, 3, size, size]).into())?
        .into_optimized()?
        .into_runnable()
}

fn inference_error(error: TractError) -> AnalyzeError {
    AnalyzeError::Inference(format!("tract: {error:#}"))
}
