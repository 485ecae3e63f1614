//! tract: the pure-Rust runtime, the fallback when onnxruntime's library is not there. Loads
//! and optimises the graph once for the fixed input shape the manifest gives (its one input, by
//! the manifest's name), with the outputs it is asked for as
//! the graph's outputs (so the features and the logits come from one run); runs on the caller's
//! thread.

use std::sync::Arc;

use tract_onnx::prelude::tract_ndarray::Array4;
use tract_onnx::prelude::*;

use super::{OutputNames, RawOutputs};
use crate::error::AnalyzeError;
use crate::preprocess::ModelInput;

/// The graph, optimised by tract for its `[1,3,size,size]` input.
#[derive(Debug)]
pub struct TractBackend {
    plan: Arc<TypedRunnableModel>,
    /// Whether the plan's second output is the features.
    features: bool,
    /// The number of logits, when the optimised graph knows it.
    logits_len: Option<usize>,
}

impl TractBackend {
    /// Loads and optimises the ONNX graph `onnx_bytes` to take `input` (its one input, named so)
    /// and give `outputs`, in that order; the error says what does not match, or is tract's
    /// whole chain.
    pub fn load(onnx_bytes: &[u8], input: &ModelInput, outputs: &OutputNames) -> Result<Self, String> {
        let plan = optimise(onnx_bytes, input, outputs).map_err(|e| format!("{e:#}"))?;
        let logits_len = plan
            .model()
            .output_fact(0)
            .ok()
            .and_then(|fact| fact.shape.as_concrete().map(|dims| dims.iter().product()));
        Ok(Self { plan, features: outputs.features.is_some(), logits_len })
    }

    /// How many logits a run gives, when the optimised graph says.
    pub(crate) fn logits_len(&self) -> Option<usize> {
        self.logits_len
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

fn optimise(onnx_bytes: &[u8], input: &ModelInput, outputs: &OutputNames) -> TractResult<Arc<TypedRunnableModel>> {
    let size = input.size as usize;
    let names: Vec<&str> = std::iter::once(&outputs.logits).chain(&outputs.features).map(String::as_str).collect();
    let model = tract_onnx::onnx().model_for_read(&mut &onnx_bytes[..])?;
    let inputs: Vec<&str> = model.input_outlets()?.iter().map(|outlet| model.node(outlet.node).name.as_str()).collect();
    if inputs != [input.name.as_str()] {
        return Err(TractError::msg(format!(
            "its inputs are {inputs:?}, the manifest's input.name says one input named {:?}",
            input.name
        )));
    }
    model
        .with_outputs_by_name(names)?
        .with_input_fact(0, f32::fact([1, 3, size, size]).into())?
        .into_optimized()?
        .into_runnable()
}

fn inference_error(error: TractError) -> AnalyzeError {
    AnalyzeError::Inference(format!("tract: {error:#}"))
}
