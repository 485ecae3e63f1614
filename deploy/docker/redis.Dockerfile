# Redis on Debian (redis-server and redis-cli of Debian 12), for docker-compose.yml
# (REDIS_IMAGE). Built by scripts/images.sh; the context is not used:
#
#   docker build --build-arg BASE_IMAGE=imagepipe/debian:bookworm -t imagepipe/redis \
#     -f deploy/docker/redis.Dockerfile <any empty dir>
#
# Runs like the public redis image: the command is `redis-server ...`, the data directory /data.
# Without a config file Redis 7 keeps protected mode on and refuses clients from other containers:
# compose passes `--protected-mode no` (Redis is not published beyond the compose network).
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends redis-server redis-tools \
 && rm -rf /var/lib/apt/lists/* \
 && install -d -o redis -g redis /data \
 && redis-server --version
USER redis:redis
WORKDIR /data
VOLUME ["/data"]
EXPOSE 6379
CMD ["redis-server", "--dir", "/data", "--protected-mode", "no"]
