"""Parses a /metrics exposition with Python's `prometheus_client` (PyPI `prometheus_client`).

Usage: parse_metrics.py < exposition.txt
The server serves OpenMetrics text, so it is read with the package's OpenMetrics parser,
which refuses anything the format does not allow (a missing `# EOF`, a counter sample
without `_total`, unsorted or non-cumulative buckets, bad escaping). Prints the families as
JSON: {name: {"type": ..., "samples": [{"name", "labels", "value"}]}}; exits non-zero if the
text does not parse.
"""
import json
import sys

from prometheus_client.openmetrics.parser import text_string_to_metric_families


def main():
    families = {}
    for family in text_string_to_metric_families(sys.stdin.read()):
        if family.name in families:
            raise SystemExit(f"family {family.name} appears twice")
        families[family.name] = {
            "type": family.type,
            "samples": [
                {"name": s.name, "labels": s.labels, "value": s.value}
                for s in family.samples
            ],
        }
    json.dump(families, sys.stdout)


if __name__ == "__main__":
    main()
