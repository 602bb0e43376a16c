# The image of the webhook (`image-preflight serve`), the watchdog and the node agent, as a non-root user.
#   docker build -t image-preflight:0.1.0 .
# An argument, so that a build with no registry can start from a local image of the same Python.
ARG BASE=python:3.11-slim
FROM ${BASE}

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# Numeric IDs so Kubernetes can verify runAsNonRoot without reading /etc/passwd.
RUN groupadd --system --gid 10001 image-preflight \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin image-preflight

# pip's own settings, unset unless given, so that a build with no index can install from mounted
# wheels: --build-arg PIP_NO_INDEX=1 --build-arg PIP_FIND_LINKS=/mnt. Not kept in the image.
ARG PIP_NO_INDEX
ARG PIP_FIND_LINKS
COPY . /src
# One image for the webhook and watchdog Deployments and the agent DaemonSet.
RUN pip install "/src[all]" && rm -rf /src

USER 10001:10001
WORKDIR /
EXPOSE 8443 9090
ENTRYPOINT ["image-preflight", "serve"]
CMD ["--help"]
