//! Binary of the imagepipe notification worker: post webhooks until SIGTERM (see [`imagepipe_notification_worker::serve`]).

fn main() -> std::process::ExitCode {
    let about = env!("CARGO_PKG_DESCRIPTION");
    imagepipe_runtime::service::main(imagepipe_notification_worker::SERVICE, about, |service| {
        Box::pin(imagepipe_notification_worker::serve(service))
    })
}
