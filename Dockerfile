# kuberay-scaler image: also usable as RayCluster spec.autoscalerOptions.image.
# Not built in CI (no Docker engine there); see README.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY kuberay_scaler ./kuberay_scaler
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
RUN useradd --uid 10001 --no-create-home --shell /usr/sbin/nologin scaler
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
# Nothing is written at run time, so a read-only root filesystem works; bytecode is not cached.
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 KUBERAY_SCALER_LOG_FORMAT=json
USER 10001
EXPOSE 44217
ENTRYPOINT ["kuberay-scaler"]
CMD ["run"]
