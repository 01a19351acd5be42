# syntax=docker/dockerfile:1
# specwatch container image: the exporter (`specwatch serve`) plus the generated Grafana
# dashboards and Prometheus rules, so one image feeds the compose stack, the Kubernetes
# manifests and anyone who copies the mixin output out of it.
#
#   docker build -t specwatch:0.1.0 .
#   docker run --rm -p 10440:10440 -v "$PWD/specwatch.yaml:/etc/specwatch/specwatch.yaml:ro" specwatch:0.1.0
#
# Optional extras (the what-if plots and calibration need `analysis`):
#   docker build --build-arg EXTRAS=analysis -t specwatch:0.1.0-analysis .

ARG PYTHON_VERSION=3.12

# ---- builder: build the wheel, install it and its dependencies into a virtualenv ----------
FROM python:${PYTHON_VERSION}-slim-bookworm AS builder
ARG EXTRAS=""
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
WORKDIR /src
# Only what the wheel needs: a change to tests or deploy files does not rebuild this layer.
# The wheel is the whole bundle (setup.py copies the mixin, rules, dashboards and examples
# into the package), so those sources come too.
COPY pyproject.toml setup.py MANIFEST.in README.md LICENSE runbook.md mixin.libsonnet config.libsonnet \
     jsonnetfile.json ./
COPY alerts/*.libsonnet alerts/*.yaml alerts/
COPY alerts/tests/*.yaml alerts/tests/
COPY dashboards/*.libsonnet dashboards/*.json dashboards/
COPY dashboards/lib/ dashboards/lib/
COPY examples/specwatch.yaml examples/
COPY examples/params/ examples/params/
COPY tests/fixtures/sd-validation/ tests/fixtures/sd-validation/
COPY src/ src/
RUN python -m venv /opt/specwatch \
    && python -m pip wheel --no-cache-dir --no-deps --wheel-dir /wheels . \
    && /opt/specwatch/bin/pip install --no-cache-dir \
       "$(find /wheels -name 'specwatch-*.whl')${EXTRAS:+[$EXTRAS]}"

# ---- runtime: slim Python, no compilers, no pip cache, non-root -----------------------------
FROM python:${PYTHON_VERSION}-slim-bookworm AS runtime
LABEL org.opencontainers.image.title="specwatch" \
      org.opencontainers.image.description="Speculative-decoding observability for vLLM and SGLang: exporter, dashboards, rules" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH=/opt/specwatch/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    SPECWATCH_HEALTHCHECK_URL=http://127.0.0.1:10440/healthz
# A fixed numeric UID/GID so Kubernetes' runAsNonRoot can verify it without /etc/passwd.
RUN groupadd --system --gid 10001 specwatch \
    && useradd --system --uid 10001 --gid specwatch --no-create-home \
       --home-dir /nonexistent --shell /usr/sbin/nologin specwatch
COPY --from=builder /opt/specwatch /opt/specwatch
# The generated mixin output (make generate), for Prometheus rule_files and Grafana import.
COPY alerts/*.yaml /usr/share/specwatch/rules/
COPY dashboards/*.json /usr/share/specwatch/dashboards/
# Default configuration: one vLLM on the same host or pod (port 8000). Mount your own over it.
COPY deploy/specwatch/specwatch.yaml /etc/specwatch/specwatch.yaml
USER 10001:10001
EXPOSE 10440
# No curl in the slim image: the interpreter that runs specwatch does the probe. Override
# SPECWATCH_HEALTHCHECK_URL when --listen or the web config (TLS) changes the address.
HEALTHCHECK --interval=30s --timeout=5s --start-period=15s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen(os.environ['SPECWATCH_HEALTHCHECK_URL'], timeout=4)"]
ENTRYPOINT ["specwatch"]
CMD ["serve", "--config", "/etc/specwatch/specwatch.yaml"]
