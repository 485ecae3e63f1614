//! Binary of the imagepipe download worker: consume `tasks.download` until SIGTERM (see [`imagepipe_download_worker::serve`]).

fn main() -> std::process::ExitCode {
    let about = env!("CARGO_PKG_DESCRIPTION");
    imagepipe_runtime::service::main(imagepipe_download_worker::SERVICE, about, |service| {
        Box::pin(imagepipe_download_worker::serve(service))
    })
}
