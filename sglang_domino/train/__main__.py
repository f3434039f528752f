"""`python -m sglang_domino.train --target T --data D --output-dir O [--kind domino] ...`

One flag per `TrainConfig` field (underscores become dashes); `--config run.json` loads
fields from a file, and flags given explicitly override it.
"""

from __future__ import annotations

import argparse
import json
import sys
import typing

from .config import TrainConfig


def _flag_type(annotation):
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    base = args[0] if args and typing.get_origin(annotation) is typing.Union else annotation
    if typing.get_origin(base) is list:
        return "list", typing.get_args(base)[0]
    if typing.get_origin(base) is typing.Literal:
        return "choice", typing.get_args(base)
    return "scalar", base


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m sglang_domino.train", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", help="JSON file with TrainConfig fields")
    for name, field in TrainConfig.model_fields.items():
        flag = "--" + name.replace("_", "-")
        kind, typ = _flag_type(field.annotation)
        help_text = field.description or ""
        if kind == "list":
            p.add_argument(flag, dest=name, type=typ, nargs="+", default=argparse.SUPPRESS, help=help_text)
        elif kind == "choice":
            p.add_argument(flag, dest=name, choices=typ, default=argparse.SUPPRESS, help=help_text)
        elif typ is bool:
            p.add_argument(flag, dest=name, action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS,
                           help=help_text)
        else:
            p.add_argument(flag, dest=name, type=typ, default=argparse.SUPPRESS, help=help_text)
    return p


def parse(argv=None) -> TrainConfig:
    args = vars(build_parser().parse_args(argv))
    data = {}
    if args.get("config"):
        with open(args.pop("config"), encoding="utf-8") as fh:
            data = json.load(fh)
    args.pop("config", None)
    data.update(args)
    return TrainConfig.model_validate(data)


def main(argv=None) -> int:
    from .loop import train

    summary = train(parse(argv))
    print(json.dumps({k: v for k, v in summary.items() if k != "config"}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
