"""The ``edgewatt`` command: serve, run, report, status, doctor, install-service.

The top layer: it may import the daemon (edgewatt.exporter) and the client
(edgewatt.client); nothing imports it.
"""
