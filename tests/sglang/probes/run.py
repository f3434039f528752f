"""`python run.py NAME PARAMS_JSON`: run the probe NAME (a module of this folder) in this
fresh interpreter and print its result as one JSON line after MARK.

`sys.argv` becomes PARAMS["argv"] before the probe imports anything: the command line the
plugin's platform entry point reads (`sglang serve --device cpu` switches the CPU engine
on). A probe is a function `probe(params) -> JSON-able result`."""

import importlib
import json
import sys

MARK = "@@RESULT@@"


def run(name: str, params: dict) -> None:
    """Probe NAME with `params`, its result printed after MARK."""
    sys.argv = params["argv"]
    result = importlib.import_module(f"tests.sglang.probes.{name}" if __name__ != "__main__" else name).probe(params)
    print(MARK + json.dumps(result), flush=True)


def main() -> None:
    run(sys.argv[1], json.loads(sys.argv[2]))


if __name__ == "__main__":
    main()
