# The build stage's Rust image without a registry: what the public `rust:<version>-bookworm`
# gives deploy/docker/Dockerfile (cargo and rustc for x86_64 Linux, gcc/g++/make for the C the
# crates build, pkg-config, CA certificates for crates.io), made from this host's rustup
# toolchain on the debootstrapped base. Built by `scripts/images.sh rust`; the context holds
# toolchain/ (bin/cargo, bin/rustc, bin/rustdoc and lib/ of `rustc --print sysroot`).
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      ca-certificates gcc g++ libc6-dev make perl pkg-config \
 && rm -rf /var/lib/apt/lists/*
COPY toolchain/ /usr/local/rust/
# CARGO_HOME where the official image has it: the Dockerfile's cache mounts name its registry.
ENV CARGO_HOME=/usr/local/cargo \
    PATH=/usr/local/cargo/bin:/usr/local/rust/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
RUN mkdir -p /usr/local/cargo/bin && cargo --version && rustc --version
