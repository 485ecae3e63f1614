# Prometheus of Debian 12, for docker-compose.yml's profile `observability` (PROMETHEUS_IMAGE).
# Built by scripts/images.sh; the context is not used:
#
#   docker build --build-arg BASE_IMAGE=imagepipe/debian:bookworm -t imagepipe/prometheus \
#     -f deploy/docker/prometheus.Dockerfile <any empty dir>
#
# Runs like the public prom/prometheus image: the entrypoint is prometheus, the arguments are
# the command (compose gives --config.file and --storage.tsdb.path), the data is in /prometheus.
# wget is here for compose's health check, the same command as in the public image.
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends prometheus wget \
 && rm -rf /var/lib/apt/lists/* \
 && install -d -o prometheus -g prometheus /prometheus \
 && prometheus --version
USER prometheus:prometheus
WORKDIR /prometheus
VOLUME ["/prometheus"]
EXPOSE 9090
ENTRYPOINT ["/usr/bin/prometheus"]
CMD ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus"]
