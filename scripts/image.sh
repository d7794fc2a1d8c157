#!/usr/bin/env bash
# Builds the OCI image `sparta` (localhost/sparta:latest) with no network and no base image:
# `buildah from scratch` plus the binary (its debug info stripped: the symbols stay, so
# backtraces still name functions), exactly the shared libraries it links (from ldd,
# the dynamic loader included), the host's CA bundle when it has one (s3:// inputs and
# checkpoints over HTTPS verify with it), /etc/passwd and /etc/group entries for the
# non-root user the image runs as (nonroot, 65532: the Dockerfile's distroless image has the
# same), and /tmp. Then it runs the image:
# `sparta --version`, and `sparta gen-data` + `sparta train` on 20k rows (the embedded
# trainer), failing if either fails; last it prints the image's size.
#   SPARTA_BIN=target/debug/sparta scripts/image.sh   # that binary (default: a release build)
# buildah (vfs storage, chroot isolation: no daemon, no user namespaces) is installed with
# apt-get when missing and this runs as root. The Dockerfile at the root is the same image
# for users with a registry.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
if ! command -v buildah >/dev/null; then
    if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
        echo "image.sh: buildah is missing (apt-get install buildah, as root)" >&2
        exit 1
    fi
    apt-get install -y -q buildah >/dev/null || { apt-get update -q && apt-get install -y -q buildah >/dev/null; }
fi
if [ -z "${SPARTA_BIN:-}" ]; then
    cargo build --release --locked -p sparta
    SPARTA_BIN="${CARGO_TARGET_DIR:-$PWD/target}/release/sparta"
fi
bin="$(realpath "$SPARTA_BIN")"
image=localhost/sparta:latest
b=(buildah --storage-driver vfs)
stage="$(mktemp -d)"
ctrs=()
cleanup() {
    for c in "${ctrs[@]}"; do "${b[@]}" rm "$c" >/dev/null 2>&1 || true; done
    rm -rf "$stage"
}
trap cleanup EXIT

# The root file system, staged here.
mkdir -p "$stage/usr/local/bin" "$stage/etc" "$stage/tmp" "$stage/home/nonroot"
cp "$bin" "$stage/usr/local/bin/sparta"
strip --strip-debug "$stage/usr/local/bin/sparta"
# Every library ldd resolves (`name => /path (addr)`) and the loader (`/path (addr)`); the
# vDSO has no file.
libs=$(ldd "$bin" | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }')
[ -n "$libs" ] || { echo "image.sh: ldd found no libraries in $bin" >&2; exit 1; }
for lib in $libs; do
    mkdir -p "$stage$(dirname "$lib")"
    cp -L "$lib" "$stage$lib"
done
if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
    mkdir -p "$stage/etc/ssl/certs"
    cp /etc/ssl/certs/ca-certificates.crt "$stage/etc/ssl/certs/"
fi
printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' \
    >"$stage/etc/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' >"$stage/etc/group"
chmod 1777 "$stage/tmp"
chown 65532:65532 "$stage/home/nonroot"

version="$("$bin" --version | awk '{ print $2 }')"
revision="$(git rev-parse HEAD 2>/dev/null || echo unknown)"
ctr=$("${b[@]}" from scratch)
ctrs+=("$ctr")
"${b[@]}" copy "$ctr" "$stage/" / >/dev/null
"${b[@]}" config \
    --entrypoint '["sparta"]' --cmd '["--help"]' \
    --user 65532:65532 --workingdir /home/nonroot \
    --env PATH=/usr/local/bin --env HOME=/home/nonroot \
    --label org.opencontainers.image.title=sparta \
    --label "org.opencontainers.image.description=Sparta: train sparse CTR models on dynamic embedding tables" \
    --label "org.opencontainers.image.version=$version" \
    --label "org.opencontainers.image.revision=$revision" \
    --label org.opencontainers.image.licenses="$(awk -F'"' '/^license *=/ { print $2; exit }' Cargo.toml)" \
    "$ctr"
"${b[@]}" rmi "$image" >/dev/null 2>&1 || true
"${b[@]}" commit --quiet "$ctr" "$image" >/dev/null
echo "image.sh: built $image from scratch ($(echo "$libs" | wc -w) libraries: $(echo $libs | tr ' ' ','))"

# Run it: a container of the image, as its user, with nothing but what the image holds.
run=$("${b[@]}" from "$image")
ctrs+=("$run")
in_image() { "${b[@]}" run --isolation chroot "$run" -- "$@"; }
in_image sparta --version
# Its user is not root: `/` is root's, so a file there is refused.
if in_image sparta gen-data --rows 1 --out /root-only.tsv 2>/dev/null; then
    echo "image.sh: the image's process could write to / : it runs as root" >&2
    exit 1
fi
t=$(date +%s)
in_image sparta gen-data --rows 20000 --seed 1 --out /tmp/train.tsv
in_image sparta gen-data --rows 4000 --seed 2 --out /tmp/test.tsv
in_image sparta train --train /tmp/train.tsv --test /tmp/test.tsv --threads 2 --quiet \
    --summary-json /tmp/summary.json
echo "image.sh: gen-data and train ran in the image in $(($(date +%s) - t)) s"

size=$("${b[@]}" images --format '{{.Size}}' "$image")
echo "image.sh: $image is $size (binary $(du -h "$stage/usr/local/bin/sparta" | cut -f1) stripped" \
    "of debug info, from $(du -h "$bin" | cut -f1)); $(($(date +%s) - start)) s in all"
