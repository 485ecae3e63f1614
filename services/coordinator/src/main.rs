//! Binary of the imagepipe task coordinator: drive every task and serve the API until SIGTERM (see [`imagepipe_coordinator::serve`]).

fn main() -> std::process::ExitCode {
    let about = env!("CARGO_PKG_DESCRIPTION");
    imagepipe_runtime::service::main(imagepipe_coordinator::SERVICE, about, |service| {
        Box::pin(imagepipe_coordinator::serve(service))
    })
}
