# leaderq: one image for `leaderq consume`, `leaderq server` and the admin commands.
FROM rust:1-slim-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
# The workspace's other members (the test kit, the lab): their manifests must be there for
# Cargo to read the workspace, though only leaderq is built.
COPY crates ./crates
COPY config ./config
COPY examples ./examples
RUN cargo build --release --locked --bin leaderq

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --home-dir /var/lib/leaderq --create-home leaderq \
 # The data dir exists in the image, owned by leaderq: a named volume mounted there
 # starts with this owner, so the non-root process can lock it and keep its node id.
 && install -d -o leaderq -g leaderq -m 0750 /var/lib/leaderq/data
COPY --from=build /src/target/release/leaderq /usr/local/bin/leaderq
COPY config /etc/leaderq
COPY tasks /opt/leaderq/tasks
USER leaderq
WORKDIR /var/lib/leaderq
ENV LEADERQ__DATA__DIR=/var/lib/leaderq/data \
    LEADERQ__OBSERVE__LISTEN=0.0.0.0:9464
EXPOSE 9464
# The dashboard (/ui/) off loopback needs a token: set LEADERQ__OBSERVE__ADMIN_TOKEN and
# LEADERQ__OBSERVE__DASHBOARD=true to serve it from a container.
ENV LEADERQ__OBSERVE__DASHBOARD=false
# glibc gives threads that allocate malloc arenas of their own (up to 8 per core), and the
# leader reads a large backlog on other threads than its own: at a 100k backlog its peak
# RSS was about 160 MiB with the default, 143 MiB with 2 arenas, 124 MiB with 1
# (`leaderq-lab bench --only backlog`).
ENV MALLOC_ARENA_MAX=2
# Healthy while the replica's session is renewed within its TTL (/ready); bash's /dev/tcp,
# since the image has no curl. Override or disable it for `leaderq server`.
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
  CMD ["bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/9464 && printf 'GET /ready HTTP/1.0\\r\\n\\r\\n' >&3 && head -1 <&3 | grep -q ' 200 '"]
ENTRYPOINT ["leaderq"]
CMD ["consume"]
