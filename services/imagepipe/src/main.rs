//! The `imagepipe` command line (being built).

fn main() {}
