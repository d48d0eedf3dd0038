# shardline/coordinator: shardline-coordinator (and shardctl) from the
# project's .deb on a debootstrap Debian base. Built by build-images.sh, which
# puts the .deb beside this file as shardline.deb and names the base image.
#
#   docker run -d --name shardline-coordinator -p 50051:50051 -p 9400:9400 \
#     -v shardline-state:/var/lib/shardline -v /srv/shardline:/shared shardline/coordinator
ARG BASE=shardline/base:latest
FROM ${BASE}
ARG BASE
ARG VERSION=unknown
ARG REVISION=unknown
COPY shardline.deb /tmp/shardline.deb
# The user the systemd units and the Kubernetes manifests use (uid/gid 10001);
# made before dpkg so that the package's postinst finds it. /shared: job data
# and checkpoints, mounted at the same path in every container.
RUN groupadd --system --gid 10001 shardline \
 && useradd --system --uid 10001 --gid shardline --home-dir /var/lib/shardline --no-create-home \
      --shell /usr/sbin/nologin --comment "Shardline training service" shardline \
 && dpkg -i /tmp/shardline.deb && rm /tmp/shardline.deb \
 && install -d -o shardline -g shardline -m 0750 /var/lib/shardline \
 && install -d -o shardline -g shardline -m 0755 /shared \
 && shardline-coordinator --version && shardctl --version
USER 10001:10001
WORKDIR /var/lib/shardline
# gRPC (workers, shardctl, grpc.health.v1) and Prometheus metrics.
EXPOSE 50051 9400
# Is the gRPC port taking connections (bash's /dev/tcp: the image carries no
# client). Kubernetes probes grpc.health.v1 itself; change the port here
# (--health-cmd) when --listen does.
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
  CMD ["bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/50051"]
ENTRYPOINT ["shardline-coordinator"]
# The state directory is made 0700 by the coordinator: a directory of its own
# under the volume.
CMD ["--listen", "0.0.0.0:50051", "--state-dir", "/var/lib/shardline/state", "--metrics-port", "9400"]
LABEL org.opencontainers.image.title="shardline-coordinator" \
      org.opencontainers.image.description="Shardline coordinator: schedules sharded data-parallel training jobs and keeps their state" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="https://example.org/shardline" \
      org.opencontainers.image.base.name="${BASE}"
