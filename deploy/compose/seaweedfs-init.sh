#!/bin/sh
# The one-shot init of docker-compose.yml's profile `cluster` (service seaweedfs-init): creates
# the services' bucket on SeaweedFS, which they never create themselves (docs/blobs.md).
#
#   sh seaweedfs-init.sh MASTER FILER BUCKET    (compose: seaweedfs:9333 seaweedfs:8888 imagepipe)
#
# Through `weed shell` (s3.bucket.list, s3.bucket.create): the image's own binary, no S3 client
# needed, and the same commands in the public chrislusf/seaweedfs image. Each try is bounded
# (`weed shell` waits for its master forever); tries go on until the bucket is listed, within
# SEAWEEDFS_INIT_WAIT seconds (default 120). Idempotent: a bucket already there is left as it is.
set -eu

master="$1"
filer="$2"
bucket="$3"

# Runs one `weed shell` command ($1), bounded to 20 s; prints its output.
weed_shell() { echo "$1" | timeout 20 weed shell -master="$master" -filer="$filer" 2>&1; }

# Whether the bucket is listed (a line `  <bucket>	size:...`).
listed() { weed_shell s3.bucket.list | grep -q "^ *$bucket[[:space:]]"; }

main() {
  deadline=$(($(date +%s) + ${SEAWEEDFS_INIT_WAIT:-120}))
  until listed; do
    if [ "$(date +%s)" -gt "$deadline" ]; then
      echo "seaweedfs-init: bucket $bucket not created on $filer in ${SEAWEEDFS_INIT_WAIT:-120} s:" >&2
      weed_shell s3.bucket.list >&2 || true
      exit 1
    fi
    weed_shell "s3.bucket.create -name $bucket" || sleep 1
  done
  echo "seaweedfs-init: bucket $bucket exists on $filer"
}

main
