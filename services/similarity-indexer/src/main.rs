//! Binary of the imagepipe similarity indexer: index embeddings, announce near-duplicates and
//! serve similar-image search until SIGTERM (see [`imagepipe_similarity_indexer::serve`]).

fn main() -> std::process::ExitCode {
    let about = env!("CARGO_PKG_DESCRIPTION");
    imagepipe_runtime::service::main(imagepipe_similarity_indexer::SERVICE, about, |service| {
        Box::pin(imagepipe_similarity_indexer::serve(service))
    })
}
