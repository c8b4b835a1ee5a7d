"""The service fuzzed from its own OpenAPI schema with schemathesis, against a real keyed
``transformer-mt-serve`` on 127.0.0.1: every operation, valid and invalid bodies, with and
without the key. No answer may be a 5xx, every answer must be a status and body the schema
documents, and the service must be healthy afterwards.

``positive_data_acceptance`` is left out: a schema cannot state what depends on other fields or
on the service's limits (``nbest`` within ``beam_size``, one prefix per sentence, the sentence
and character caps), and the service answers those with the 413/422 bodies the schema lists.
The run is bounded by its example count and seeded, so it generates the same requests each time.
"""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("schemathesis", reason="needs the dev extra: pip install -e '.[dev]'")
from test_serve_soak import AUTH, KEY, server  # noqa: F401  (the fixture: a real service)

pytestmark = pytest.mark.slow

CHECKS = (
    "not_a_server_error,status_code_conformance,content_type_conformance,"
    "response_headers_conformance,response_schema_conformance,negative_data_rejection,"
    "missing_required_header,unsupported_method,ignored_auth"
)
SEED, EXAMPLES = 20261207, 300


def test_no_operation_answers_a_server_error_or_outside_its_schema(
    server: tuple[int, subprocess.Popen],  # noqa: F811  (the fixture imported above)
    tmp_path: Path,
) -> None:
    port, proc = server
    st = Path(sys.executable).with_name("st")
    done = subprocess.run(
        [
            str(st), "run", f"http://127.0.0.1:{port}/openapi.json",
            "--header", f"Authorization: Bearer {KEY}", "--checks", CHECKS,
            "--max-examples", str(EXAMPLES), "--seed", str(SEED), "--workers", "1",
            "--generation-database", "none", "--request-timeout", "60", "--no-color",
            "--report", "junit", "--report-dir", str(tmp_path),
        ],
        capture_output=True, text=True, timeout=1200, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-8000:] + done.stderr[-2000:]
    assert "No issues found" in done.stdout or " passed" in done.stdout, done.stdout[-3000:]
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", "/health")
    health = json.loads(conn.getresponse().read())
    assert health["status"] == "ok" and health["pending"] == 0
    conn.request("POST", "/translate", body=json.dumps({"text": ["one two"]}), headers=AUTH)
    answer = conn.getresponse()
    assert answer.status == 200 and len(json.loads(answer.read())["translations"]) == 1
    assert proc.poll() is None
