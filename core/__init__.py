"""What the daemon and the client share: sensors (sampling/, power/), the sampler and
its snapshot, the target table, carbon, the metric table and the Unix-socket transport.

Imports neither side: edgewatt.exporter (the daemon) and edgewatt.client (the library)
import this package, never each other. Importing it costs nothing beyond this file.
"""

__version__ = "0.1.0"
