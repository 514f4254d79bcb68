"""The edgewatt daemon: the registration API, /metrics and OTLP push over the core's
sampler. Imports edgewatt.core only, never edgewatt.client."""
