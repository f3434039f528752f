"""`benchmarks/policy_cost.py` runs end to end and writes its records (timings are not checked)."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_policy_cost_benchmark_writes_its_table_and_records(tmp_path):
    run = subprocess.run([sys.executable, "-m", "benchmarks.policy_cost", "--steps", "5", "--batch-sizes", "1", "32",
                          "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "| 32 |" in run.stdout
    saved = json.loads((tmp_path / "policy_cost.json").read_text())
    assert [r["batch_size"] for r in saved["records"]] == [1, 32]
    assert all(r["steps"] == 5 and r["total_ms"] > 0 for r in saved["records"])
    assert "cpu_count" in saved["machine"]
    md = (tmp_path / "policy_cost.md").read_text()
    assert "| batch size |" in md and "CPU:" in md
