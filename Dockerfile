# syntax=docker/dockerfile:1
#
# arp-guard's container image, for builders with a registry:
#
#   docker build -t ghcr.io/arp-guard/arp-guard:0.1.0 \
#     --build-arg REVISION="$(git rev-parse HEAD)" \
#     --build-arg CREATED="$(date -u -d @"$(git log -1 --format=%ct)" +%Y-%m-%dT%H:%M:%SZ)" .
#
# The same image `cargo xtask image` writes offline (xtask/src/image.rs and
# xtask/src/oci.rs): FROM scratch, the binary /usr/local/bin/arp-guard, static
# (glibc with crt-static: the musl rust-std is not installable on the project's
# machines) and stripped, and Debian's CA bundle; user 0:0; the same
# entrypoint, command and labels.
# Keep the two in step (a unit test in xtask/src/image.rs compares them).
#
# Not built on the project's machines: they reach no container registry, so the
# base images below cannot be pulled there; `cargo xtask image` is the path
# that is built and tested (tests/image.rs runs its output under podman).
#
# Other architectures: `docker buildx build --platform linux/arm64` builds
# natively under emulation (slow); `cargo xtask image --arch amd64,arm64`
# cross-builds instead.

ARG RUST_VERSION=1.95

FROM docker.io/library/rust:${RUST_VERSION}-bookworm AS build
# The nightly that builds the eBPF program (-Zbuild-std=core for bpfel). The
# project's machines have it preinstalled as "nightly" (rustc commit-date
# 2026-05-19, LLVM 22: xtask/src/setup.rs NIGHTLY_DATE); here it is pinned by
# date and written into guard-ebpf/rust-toolchain.toml below, since a plain
# "nightly" would float to whatever is newest.
ARG NIGHTLY=nightly-2026-05-20
# bpf-linker's LLVM must match the nightly's (what `cargo xtask setup` does).
ARG BPF_LINKER_VERSION=0.13.0
RUN apt-get update \
 && apt-get install -y --no-install-recommends llvm-22-dev \
 && rm -rf /var/lib/apt/lists/*
RUN rustup toolchain install "${NIGHTLY}" --profile minimal --component rust-src \
 && LLVM_PREFIX=/usr/lib/llvm-22 cargo install bpf-linker --version "${BPF_LINKER_VERSION}" \
      --locked --no-default-features --features llvm-22

WORKDIR /src
COPY . .
RUN sed -i "s/^channel = .*/channel = \"${NIGHTLY}\"/" guard-ebpf/rust-toolchain.toml
# The flags of xtask/src/image.rs RUSTFLAGS, for the target only (build
# scripts and proc-macros stay dynamic).
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    triple="$(uname -m)-unknown-linux-gnu" \
 && env "CARGO_TARGET_$(echo "${triple}" | tr 'a-z-' 'A-Z_')_RUSTFLAGS=-C target-feature=+crt-static -C strip=symbols" \
      cargo build --release --locked -p guard --target "${triple}" \
 && install -D -m 0755 "target/${triple}/release/arp-guard" /out/arp-guard

FROM scratch
ARG VERSION=0.1.0
ARG REVISION=""
ARG CREATED="1970-01-01T00:00:00Z"
LABEL org.opencontainers.image.title="arp-guard" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.source="https://github.com/arp-guard/arp-guard" \
      org.opencontainers.image.licenses="MIT OR Apache-2.0" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}"
COPY --from=build /out/arp-guard /usr/local/bin/arp-guard
# Debian's CA bundle (the rust image has ca-certificates): the roots for a
# kubeconfig that names no CA (an API server with a publicly signed
# certificate).
COPY --from=build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
ENV PATH=/usr/local/bin
# Root, with only the capabilities the DaemonSet adds: the daemon needs
# CAP_BPF, CAP_PERFMON and CAP_NET_ADMIN, which a non-root process loses at
# execve unless the binary carries file capabilities, and a binary with file
# capabilities cannot even start where the bounding set lacks them (see
# xtask/src/image.rs DEFAULT_USER).
USER 0:0
ENTRYPOINT ["/usr/local/bin/arp-guard"]
CMD ["--help"]
