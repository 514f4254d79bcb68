# The edgewatt daemon in a container (docker-compose.yml). It must see the host's
# processes: run it with `pid: host` and /proc, /sys mounted read-only.
FROM python:3.11.11-slim-bookworm
WORKDIR /opt/edgewatt
COPY pyproject.toml setup.py README.md ./
COPY exporter ./exporter
COPY client ./client
COPY core ./core
COPY cli ./cli
RUN pip install --no-cache-dir .
EXPOSE 9464
HEALTHCHECK --interval=15s --timeout=3s CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:9464/metrics', timeout=2)"
ENTRYPOINT ["edgewatt", "serve"]
CMD ["--socket", "/run/edgewatt/edgewatt.sock", "--state-dir", "/var/lib/edgewatt"]
