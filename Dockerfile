# leaderq: one image for `leaderq consume`, `leaderq server` and the admin commands.
FROM rust:1-slim-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY config ./config
COPY examples ./examples
RUN cargo build --release --locked --bin leaderq

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --home-dir /var/lib/leaderq --create-home leaderq
COPY --from=build /src/target/release/leaderq /usr/local/bin/leaderq
COPY config /etc/leaderq
COPY tasks /opt/leaderq/tasks
USER leaderq
WORKDIR /var/lib/leaderq
ENV LEADERQ__DATA__DIR=/var/lib/leaderq/data \
    LEADERQ__OBSERVE__LISTEN=0.0.0.0:9464
EXPOSE 9464
ENTRYPOINT ["leaderq"]
CMD ["consume"]
