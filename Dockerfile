# The `sparta` image for users with a registry:
#   docker build -t REGISTRY/sparta:TAG . && docker push REGISTRY/sparta:TAG
# then point the manifests' `image:` at it (deploy/k8s, README "Running on Kubernetes").
# scripts/image.sh builds the same image without network or base image (what CI runs); this
# file is not built in CI.

# Build: the release binary. protoc is vendored (crates/proto/build.rs); only crates are
# fetched, at the versions of Cargo.lock (--locked).
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p sparta \
    && strip --strip-debug target/release/sparta

# Run: glibc, libgcc_s and CA certificates (s3:// over HTTPS), no shell, the non-root user
# nonroot (65532), on the Debian release the binary was built on.
FROM gcr.io/distroless/cc-debian12:nonroot
LABEL org.opencontainers.image.title="sparta" \
      org.opencontainers.image.description="Sparta: train sparse CTR models on dynamic embedding tables" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /src/target/release/sparta /usr/local/bin/sparta
USER 65532:65532
WORKDIR /home/nonroot
ENTRYPOINT ["sparta"]
CMD ["--help"]
