# The image of the webhook (`image-preflight serve`), the watchdog and the node agent, as a non-root user.
#   docker build -t image-preflight:0.2.0 .
# BASE is pinned by digest (python:3.11.14-slim-bookworm's image index, every platform); an
# argument, so that a build with no registry can start from a local image of the same Python.
ARG BASE=python:3.11.14-slim-bookworm@sha256:65a93d69fa75478d554f4ad27c85c1e69fa184956261b4301ebaf6dbb0a3543d

# The build stage: every dependency from the hash-locked file, into a virtualenv of its own.
FROM ${BASE} AS build
ENV PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# pip's own settings, unset unless given, so that a build with no index can install from mounted
# wheels: --build-arg PIP_NO_INDEX=1 --build-arg PIP_FIND_LINKS=/mnt. Not kept in the image.
ARG PIP_NO_INDEX
ARG PIP_FIND_LINKS
COPY deploy/image/requirements.txt /requirements.txt
# No pip in the virtualenv: the base's installs into it (pip >= 22.3's --python).
RUN python3 -m venv --without-pip /opt/image-preflight \
 && python3 -m pip --python /opt/image-preflight/bin/python install --require-hashes --no-deps -r /requirements.txt
COPY . /src
# The project itself, built with the locked backend: nothing unhashed is fetched.
RUN python3 -m pip --python /opt/image-preflight/bin/python install --no-deps --no-build-isolation "/src" \
 && python3 -m pip --python /opt/image-preflight/bin/python uninstall -y -q setuptools wheel

FROM ${BASE}
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PATH=/opt/image-preflight/bin:$PATH
# Numeric IDs so Kubernetes can verify runAsNonRoot without reading /etc/passwd. The base's pip
# goes: nothing in the image installs anything.
RUN groupadd --system --gid 10001 image-preflight \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin image-preflight \
 && python3 -c 'import pathlib, pip, shutil; shutil.rmtree(pathlib.Path(pip.__file__).parent)' \
 && rm -rf /usr/local/bin/pip* /usr/bin/pip* /usr/local/lib/python3*/site-packages/pip-*.dist-info \
      /usr/lib/python3/dist-packages/pip-*.dist-info
COPY --from=build /opt/image-preflight /opt/image-preflight

USER 10001:10001
WORKDIR /
EXPOSE 8443 9090
ENTRYPOINT ["image-preflight", "serve"]
CMD ["--help"]
