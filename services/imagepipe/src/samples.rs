//! The sample photos `imagepipe demo` runs through the pipeline, built into the binary (licences
//! in `samples/LICENSE.md`).

/// A sample photo.
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    /// File name under `samples/`.
    pub name: &'static str,
    /// The JPEG bytes.
    pub bytes: &'static [u8],
}

/// Every sample photo: a cat, a coffee cup, a rocket launch, an astronaut.
pub const SAMPLES: [Sample; 4] = [
    Sample { name: "chelsea.jpg", bytes: include_bytes!("../samples/chelsea.jpg") },
    Sample { name: "coffee.jpg", bytes: include_bytes!("../samples/coffee.jpg") },
    Sample { name: "rocket.jpg", bytes: include_bytes!("../samples/rocket.jpg") },
    Sample { name: "astronaut.jpg", bytes: include_bytes!("../samples/astronaut.jpg") },
];
