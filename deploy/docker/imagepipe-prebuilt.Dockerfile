# The imagepipe image from binaries built on the host, for tests that must not compile inside
# Docker (scripts/images.sh: `cargo build --release --locked` with the --bin list of ./Dockerfile,
# and scripts/prepare-model.sh). The build context is a directory holding
#
#   bin/       the binaries (bin.list names them), from the host's target/release
#   model/     the prepared model (scripts/prepare-model.sh --out)
#
#   docker build --build-arg BASE_IMAGE=imagepipe/debian:bookworm -t imagepipe/imagepipe:prebuilt \
#     -f deploy/docker/imagepipe-prebuilt.Dockerfile <that directory>
#
# The result is the runtime stage of ./Dockerfile (same packages, user, paths, environment and
# health check; keep the two in step): the binaries must come from a Debian 12 host (glibc 2.36,
# the same libturbojpeg0, and libheif1 from bookworm-backports), as the rust:*-bookworm build
# stage of ./Dockerfile is.
# libheif 1.19 and its FFmpeg (HEVC) and dav1d (AV1) decoder plugins come from bookworm-backports,
# as on the host (scripts/image-libs.sh).
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}
RUN printf '%s\n' 'Types: deb' 'URIs: http://deb.debian.org/debian' 'Suites: bookworm-backports' \
      'Components: main' 'Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg' \
      > /etc/apt/sources.list.d/debian-backports.sources \
 && apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends ca-certificates \
      libturbojpeg0 \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends libheif1/bookworm-backports \
      libheif-plugin-ffmpegdec/bookworm-backports libheif-plugin-dav1d/bookworm-backports \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 imagepipe \
 && useradd --system --uid 10001 --gid imagepipe --home-dir /var/lib/imagepipe --shell /usr/sbin/nologin imagepipe \
 && install -d -o imagepipe -g imagepipe /var/lib/imagepipe /var/lib/imagepipe/blobs /var/lib/imagepipe/store
COPY model/ /opt/imagepipe/model/
COPY bin.list /usr/local/share/imagepipe/bin.list
COPY bin/ /usr/local/bin/
# Every binary starts here: a shared library missing from this image fails the build, not a pod.
RUN while read -r bin; do "$bin" --version; done < /usr/local/share/imagepipe/bin.list
ENV IMAGEPIPE_AI__MODEL_DIR=/opt/imagepipe/model \
    IMAGEPIPE_BLOB__DIR=/var/lib/imagepipe/blobs \
    IMAGEPIPE_STORE__PATH=/var/lib/imagepipe/store \
    IMAGEPIPE_HTTP__PORT=8080
USER imagepipe:imagepipe
WORKDIR /var/lib/imagepipe
VOLUME ["/var/lib/imagepipe/blobs"]
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 CMD ["imagepipe", "healthcheck"]
CMD ["imagepipe", "run"]
