#!/usr/bin/env bash
# The demo: speculative decoding with DFlash and Domino drafts against a target, printing
# outputs and acceptance. Serves the committed CPU test bed unless --target/--draft are
# given. Creates .venv on first use.
source "$(dirname "$0")/env.sh"
case " $* " in
    *" --target"*) exec python -m sglang_domino.demo "$@" ;;
esac
exec python -m sglang_domino.demo --testbed benchmarks/testbed/checkpoints "$@"
