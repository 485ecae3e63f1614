# A client on the compose network for scripts/compose-e2e.sh and scripts/compose-cluster.sh:
# Debian's python3 with nats-py and confluent-kafka (librdkafka bundled), which enqueue tasks the
# ways README's "Enqueue a task" documents (a NATS publish, a Kafka produce, the HTTP API) and
# watch them. Built by scripts/images.sh; the context holds site-packages/ (the two wheels,
# installed by the host's pip for CPython 3.11 on manylinux):
#
#   docker build --build-arg BASE_IMAGE=imagepipe/debian:bookworm -t imagepipe/e2e-client \
#     -f deploy/docker/e2e-client.Dockerfile <that directory>
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3 \
 && rm -rf /var/lib/apt/lists/*
COPY site-packages/ /opt/e2e/site-packages/
ENV PYTHONPATH=/opt/e2e/site-packages \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python3 -c 'import nats, confluent_kafka; print("nats-py", nats.__version__ if hasattr(nats, "__version__") else "", "librdkafka", confluent_kafka.libversion()[0])'
USER nobody
CMD ["python3"]
