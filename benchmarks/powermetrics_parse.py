"""What reading one powermetrics sample costs: edgewatt's targeted scan of the plist
against a whole plistlib parse of the same document, side by side in one run.

The document is the real M4 capture (tests/fixtures/powermetrics/m4-mac16-5.plist)
cut to what the power samplers print (its tasks, all_tasks and disk sections removed,
about 56 KB, the processor's cluster tables being most of it), so it is what the reader gets
at each sample. At the reader's 10 Hz the cost per second is ten times the figure.

    .venv/bin/python benchmarks/powermetrics_parse.py [--repeat 200] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import plistlib
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from edgewatt.core.power.powermetrics import MIN_INTERVAL_MS, parse_plist  # noqa: E402

CAPTURE = ROOT / "tests" / "fixtures" / "powermetrics" / "m4-mac16-5.plist"


def power_only(document: bytes) -> bytes:
    """The capture without the sections the power samplers do not print, written back
    by plistlib (its indentation, the same keys and values)."""
    whole = plistlib.loads(document)
    for key in ("tasks", "all_tasks", "disk"):
        whole.pop(key, None)
    return plistlib.dumps(whole)


def cpu_ms(parse: object, document: bytes, repeat: int) -> float:
    start = time.process_time()
    for _ in range(repeat):
        parse(document)  # type: ignore[operator]
    return (time.process_time() - start) / repeat * 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    document = power_only(CAPTURE.read_bytes())
    # Both read the same figures (checked, not assumed).
    processor = plistlib.loads(document)["processor"]
    assert parse_plist(document).total_w == processor["combined_power"] / 1000
    scan = cpu_ms(parse_plist, document, args.repeat)
    whole = cpu_ms(plistlib.loads, document, args.repeat)
    per_second = 1000 / MIN_INTERVAL_MS
    rows = {
        "document_bytes": len(document),
        "edgewatt_ms_per_sample": round(scan, 4),
        "plistlib_ms_per_sample": round(whole, 4),
        "ratio": round(scan / whole, 4),
        "edgewatt_core_percent_at_10hz": round(scan * per_second / 10, 4),
        "plistlib_core_percent_at_10hz": round(whole * per_second / 10, 4),
    }
    share = (rows["edgewatt_core_percent_at_10hz"], rows["plistlib_core_percent_at_10hz"])
    print(f"one power sample: {len(document):,} bytes")
    print(f"  edgewatt's scan   {scan:8.3f} ms CPU  ({share[0]} % of a core at 10 Hz)")
    print(f"  plistlib.loads    {whole:8.3f} ms CPU  ({share[1]} % of a core at 10 Hz)")
    print(f"  ratio             {scan / whole:8.4f}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
