#!/usr/bin/env bash
# Print the current digest of the images' base and rewrite the FROM lines to it.
# Needs registry access and one of: docker buildx, skopeo, crane. Run where those exist
# (not in this project's sandbox, which cannot reach container registries).
set -euo pipefail
cd "$(dirname "$0")/.."
image="${1:-python:3.11-slim-bookworm}"
if command -v docker >/dev/null && docker buildx version >/dev/null 2>&1; then
    digest=$(docker buildx imagetools inspect "$image" --format '{{json .Manifest.Digest}}' | tr -d '"')
elif command -v skopeo >/dev/null; then
    digest=$(skopeo inspect --format '{{.Digest}}' "docker://docker.io/library/$image")
elif command -v crane >/dev/null; then
    digest=$(crane digest "$image")
else
    echo "need docker buildx, skopeo or crane" >&2
    exit 1
fi
echo "$image@$digest"
for f in deploy/docker/Dockerfile.cpu deploy/docker/Dockerfile.cuda; do
    sed -i -E "s#^FROM ${image}@sha256:[0-9a-f]{64}#FROM ${image}@${digest}#" "$f"
done
