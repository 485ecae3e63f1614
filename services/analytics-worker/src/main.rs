//! Binary of the imagepipe analytics worker: count events and serve `/v1/stats` until SIGTERM (see [`imagepipe_analytics_worker::serve`]).

fn main() -> std::process::ExitCode {
    let about = env!("CARGO_PKG_DESCRIPTION");
    imagepipe_runtime::service::main(imagepipe_analytics_worker::SERVICE, about, |service| {
        Box::pin(imagepipe_analytics_worker::serve(service))
    })
}
