#!/usr/bin/env bash
# Loopback helpers the scripts that start servers share (sourced by nats.sh, kafka.sh,
# redis-cluster.sh, seaweedfs.sh and schemathesis.sh).

# port_open PORT: whether something accepts TCP connections on 127.0.0.1:PORT.
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# spare_port: a free TCP port on the loopback interface.
spare_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
