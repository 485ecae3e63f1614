//! Binary of the imagepipe metadata worker: consume `tasks.metadata` until SIGTERM (see [`imagepipe_metadata_worker::serve`]).

fn main() -> std::process::ExitCode {
    let about = env!("CARGO_PKG_DESCRIPTION");
    imagepipe_runtime::service::main(imagepipe_metadata_worker::SERVICE, about, |service| {
        Box::pin(imagepipe_metadata_worker::serve(service))
    })
}
