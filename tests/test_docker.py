"""The Docker images: the Dockerfiles and compose files install and serve as the README does."""

import json
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_dockerfile_parses_and_mirrors_the_readme_install():
    from dockerfile_parse import DockerfileParser

    parser = DockerfileParser(path=os.path.join(ROOT, "docker", "Dockerfile"))
    instructions = [i["instruction"] for i in parser.structure if i["instruction"] != "COMMENT"]
    assert instructions[0] == "FROM" and "nvidia/cuda" in parser.baseimage and "devel" in parser.baseimage
    assert set(instructions) <= {"FROM", "ENV", "RUN", "WORKDIR", "COPY", "EXPOSE", "ENTRYPOINT", "CMD", "ARG", "LABEL"}
    runs = [i["value"] for i in parser.structure if i["instruction"] == "RUN"]
    assert "./scripts/install.sh" in runs and "python3.11" in parser.envs["PYTHON_BIN"]
    entry = json.loads([i["value"] for i in parser.structure if i["instruction"] == "ENTRYPOINT"][0])
    assert entry[:2] == ["sglang", "serve"]
    # The README's commands install through the same script.
    env_sh = open(os.path.join(ROOT, "scripts", "env.sh")).read()
    assert "./scripts/install.sh" in env_sh
    install = open(os.path.join(ROOT, "scripts", "install.sh")).read()
    assert "pip install -qq -e" in install and "-m venv .venv" in install
    readme = open(os.path.join(ROOT, "README.md")).read()
    assert "./scripts/test.sh" in readme and "./scripts/demo.sh" in readme


def test_compose_runs_the_model_card_command():
    import yaml

    compose = yaml.safe_load(open(os.path.join(ROOT, "docker", "compose.yaml")))
    cmd = compose["services"]["domino"]["command"]
    flags = dict(zip(cmd[::2], cmd[1::2]))
    assert flags["--speculative-algorithm"] == "DFLASH" and flags["--speculative-dflash-block-size"] == "16"
    assert flags["--mamba-scheduler-strategy"] == "extra_buffer" and flags["--tp-size"] == "2"
    assert cmd[-1] == "--trust-remote-code"


def test_cpu_dockerfile_builds_on_the_local_base_and_serves_the_test_bed():
    """docker/Dockerfile.cpu (built and run by hand: docs/docker.md) installs as the README
    does, on the base docker/build-base.sh makes; its compose file puts the gateway in front
    of two workers serving the test bed in the image."""
    import yaml
    from dockerfile_parse import DockerfileParser

    with open(os.path.join(ROOT, "docker", "Dockerfile.cpu"), "rb") as fh:
        parser = DockerfileParser(fileobj=fh)
        assert parser.baseimage == "sglang-domino-base:bookworm" or parser.args.get("BASE") == \
            "sglang-domino-base:bookworm"
        runs = " ".join(i["value"] for i in parser.structure if i["instruction"] == "RUN")
        assert "./scripts/install.sh" in runs
        entry = json.loads([i["value"] for i in parser.structure if i["instruction"] == "ENTRYPOINT"][0])
        assert entry[:2] == ["sglang", "serve"]
    base = open(os.path.join(ROOT, "docker", "build-base.sh")).read()
    assert "mmdebstrap" in base and "docker import" in base and "sglang-domino-base:bookworm" in base
    compose = yaml.safe_load(open(os.path.join(ROOT, "docker", "compose.cpu.yaml")))["services"]
    assert compose["gateway"]["entrypoint"][-2:] == ["smg", "launch"]
    for name in ("worker-a", "worker-b"):
        cmd = compose[name]["command"]
        flags = dict(zip(cmd[::2], cmd[1::2]))
        assert flags["--device"] == "cpu" and flags["--speculative-algorithm"] == "DFLASH"
        for path in (flags["--model-path"], flags["--speculative-draft-model-path"]):
            assert os.path.isfile(os.path.join(ROOT, path, "config.json")), path
