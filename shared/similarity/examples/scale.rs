//! Measures the similarity indexes at scale on synthetic embeddings:
//! `cargo run --release --example scale -p imagepipe-similarity -- [IMAGES] [QUERIES] [EXACT_LIMIT]`
//! (defaults 100000, 1000, 1000). The second index gets `EXACT_LIMIT`: a small one makes it link
//! its images into the graph as they come; one just below `IMAGES` leaves nearly the whole graph
//! to the catch-up, which then times building it in one go.

fn main() {
    let arg = |n: usize, default: usize| {
        std::env::args()
            .nth(n)
            .map_or(default, |v| v.parse().unwrap_or_else(|_| panic!("argument {n} must be a number, not {v:?}")))
    };
    let (images, queries, exact_limit) = (arg(1, 100_000), arg(2, 1_000), arg(3, 1_000));
    println!("{}", imagepipe_similarity::bench::scale(images, queries, exact_limit));
}
