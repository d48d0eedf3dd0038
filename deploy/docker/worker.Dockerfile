# shardline/worker: shardline-worker from the project's .deb, with the torch
# wheel's libraries (LibTorch, and the CUDA runtime, cuBLAS, cuDNN, NCCL, ...
# that libtorch_cuda loads) at /usr/lib/shardline/site-packages, where the
# programs' RUNPATH looks first. The same image runs CPU ranks anywhere and
# GPU ranks on a node with the NVIDIA driver and the NVIDIA container toolkit
# (docker run --gpus all ...), which brings the driver's libcuda.so.1.
# Built by build-images.sh, which stages site-packages/ and shardline.deb here.
#
#   docker run -d --gpus '"device=0"' --network host --shm-size 1g -v /srv/shardline:/shared \
#     shardline/worker --coordinator HOST:50051 --device cuda:0 --metrics-port 9401
ARG BASE=shardline/base:latest
FROM ${BASE}
ARG BASE
ARG VERSION=unknown
ARG REVISION=unknown
# First and alone: the large layer (about 3.3 GB) that changes only with the
# wheel, so that a rebuild of the programs reuses it.
COPY site-packages /usr/lib/shardline/site-packages
COPY shardline.deb /tmp/shardline.deb
RUN groupadd --system --gid 10001 shardline \
 && useradd --system --uid 10001 --gid shardline --home-dir /var/lib/shardline --no-create-home \
      --shell /usr/sbin/nologin --comment "Shardline training service" shardline \
 && dpkg -i /tmp/shardline.deb && rm /tmp/shardline.deb \
 && install -d -o shardline -g shardline -m 0750 /var/lib/shardline \
 && install -d -o shardline -g shardline -m 0755 /shared \
 && shardline-worker --version
# What the NVIDIA container toolkit reads (as the nvidia/cuda images set them):
# with --gpus, the devices and the driver's compute libraries are mounted in.
ENV NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
USER 10001:10001
WORKDIR /var/lib/shardline
# Prometheus metrics (--metrics-port; the default CMD's 9401, as in deploy/kubernetes).
EXPOSE 9401
ENTRYPOINT ["shardline-worker"]
# A coordinator reachable as shardline-coordinator (a user-defined network, a
# compose service, a Kubernetes Service); override for anything else.
CMD ["--coordinator", "shardline-coordinator:50051", "--device", "cuda:0", "--metrics-port", "9401"]
LABEL org.opencontainers.image.title="shardline-worker" \
      org.opencontainers.image.description="Shardline worker: one training rank on a CUDA device or the CPU, with LibTorch and the CUDA libraries of the torch wheel" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="https://example.org/shardline" \
      org.opencontainers.image.base.name="${BASE}"
