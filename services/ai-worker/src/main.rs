//! Binary of the imagepipe AI worker: load the model, consume `tasks.ai` until SIGTERM (see [`imagepipe_ai_worker::serve`]).

fn main() -> std::process::ExitCode {
    let about = env!("CARGO_PKG_DESCRIPTION");
    imagepipe_runtime::service::main(imagepipe_ai_worker::SERVICE, about, |service| {
        Box::pin(imagepipe_ai_worker::serve(service))
    })
}
