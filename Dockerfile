# syntax=docker/dockerfile:1
# kuberay-scaler image: also the RayCluster's spec.autoscalerOptions.image (drop-in mode).
#   docker build -t kuberay-scaler:0.1.0 .                         # users: registry base
#   make image                                                     # CI here: no Docker, no registry
# `make image` (scripts/build-image.sh) builds a Debian base with mmdebstrap, imports it and
# passes it as BASE_IMAGE; the default stays the registry image for everyone else.
ARG BASE_IMAGE=python:3.11-slim

FROM ${BASE_IMAGE} AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY kuberay_scaler ./kuberay_scaler
# Wheels come from the package registry. Behind a TLS-intercepting proxy pass the machine's CA
# bundle as the build secret `pip-cert` (--secret id=pip-cert,src=$PIP_CERT): it is mounted for
# this step only and never lands in a layer; the runtime stage needs no registry at all.
RUN --mount=type=secret,id=pip-cert,required=false \
    if [ -s /run/secrets/pip-cert ]; then export PIP_CERT=/run/secrets/pip-cert; fi \
    && python3 -m venv /opt/kuberay-scaler \
    && /opt/kuberay-scaler/bin/pip install --no-cache-dir --disable-pip-version-check --quiet .
# Only the daemon: Ray is a dependency for its generated protobuf stubs, not to run Ray, so its
# CLIs, Java jars, server binaries and libraries kuberay-scaler never imports are dropped (`ray`
# in this image is our shim, below); pip goes too, nothing installs at run time.
RUN cd /opt/kuberay-scaler \
    && site=$(echo lib/python3*/site-packages) \
    && find bin -maxdepth 1 -type f ! -name 'kuberay-scaler*' ! -name 'python*' -delete \
    && rm -rf "$site"/pip "$site"/pip-* "$site"/setuptools "$site"/setuptools-* \
              "$site"/ray/jars "$site"/ray/core/src/ray/gcs/gcs_server \
              "$site"/ray/core/src/ray/raylet/raylet "$site"/ray/rllib "$site"/ray/tune \
              "$site"/ray/train "$site"/ray/data "$site"/ray/serve "$site"/ray/llm \
              "$site"/ray/dashboard/client \
    && test -x bin/kuberay-scaler && test -x bin/kuberay-scaler-ray \
    && bin/python -c "import kuberay_scaler.adapters.ray_gcs.client, kuberay_scaler.app"

FROM ${BASE_IMAGE}
COPY --from=build /opt/kuberay-scaler /opt/kuberay-scaler
# /usr/local/bin is first on the image's PATH and on a login shell's (Debian's /etc/profile), so
# KubeRay's `/bin/bash -c[l] -- "ray kuberay-autoscaler ..."` runs our shim, which execs
# `kuberay-scaler run`. The venv's bin is deliberately not on PATH.
RUN ln -s /opt/kuberay-scaler/bin/kuberay-scaler /usr/local/bin/kuberay-scaler \
    && ln -s /opt/kuberay-scaler/bin/kuberay-scaler-ray /usr/local/bin/ray
# Nothing is written at run time, so a read-only root filesystem works; bytecode is precompiled.
ENV PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 KUBERAY_SCALER_LOG_FORMAT=json
USER 10001:10001
EXPOSE 44217
ENTRYPOINT ["kuberay-scaler"]
CMD ["run"]
