//! Binary of the imagepipe tag indexer: index tags and serve `/v1/search` until SIGTERM (see [`imagepipe_tag_indexer_worker::serve`]).

fn main() -> std::process::ExitCode {
    let about = env!("CARGO_PKG_DESCRIPTION");
    imagepipe_runtime::service::main(imagepipe_tag_indexer_worker::SERVICE, about, |service| {
        Box::pin(imagepipe_tag_indexer_worker::serve(service))
    })
}
