# The base of the full Dockerfile's build stages when scripts/images.sh builds it offline
# (`scripts/images.sh full`): the debootstrapped base trusting, besides Debian's CA bundle, the
# CAs this host added under /usr/local/share/ca-certificates (a TLS-inspecting proxy's, say), so
# that cargo reaches crates.io and pip reaches PyPI from inside a build as they do on the host.
# Only the build and model stages start from it; the runtime image does not carry these CAs.
# The context holds ca/ (those *.crt files; empty when the host added none).
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}
COPY ca/ /usr/local/share/ca-certificates/
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && update-ca-certificates
# cargo, pip and Python's ssl module read the bundle from these, not from the system default.
ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
    PIP_CERT=/etc/ssl/certs/ca-certificates.crt \
    CARGO_HTTP_CAINFO=/etc/ssl/certs/ca-certificates.crt
