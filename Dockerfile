# The image of the webhook (`image-preflight serve`), the watchdog and the node agent, as a non-root user.
#   docker build -t image-preflight:0.1.0 .
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# Numeric IDs so Kubernetes can verify runAsNonRoot without reading /etc/passwd.
RUN groupadd --system --gid 10001 image-preflight \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin image-preflight

COPY . /src
# One image for the webhook and watchdog Deployments and the agent DaemonSet.
RUN pip install "/src[all]" && rm -rf /src

USER 10001:10001
WORKDIR /
EXPOSE 8443 9090
ENTRYPOINT ["image-preflight", "serve"]
CMD ["--help"]
