"""The seam with SGLang 0.5.23, from its one declaration (`sglang_domino.sglang.seam.hooks`):
one case per patch and per dependency, so a moved pin names the symbol that broke; every
install group installed and seen live; UPSTREAM.md documents every row; the settings
channel to the schedulers round-trips."""

from __future__ import annotations

import os

import pytest
from pydantic import ValidationError

from sglang_domino.sglang.seam import hooks, manifest
from sglang_domino.sglang import settings
from sglang_domino.sglang.adaptive import AdaptiveWidthConfig
from tests.sglang.probes import run_probe

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
UPSTREAM_MD = os.path.join(os.path.dirname(hooks.__file__), "UPSTREAM.md")
CPU_ARGV = ("sglang", "serve", "--device", "cpu")


@pytest.fixture(scope="module")
def seam(sglang_tmp):
    return run_probe("seam", sglang_tmp, argv=CPU_ARGV)


@pytest.mark.parametrize("patch", hooks.PATCHES, ids=lambda p: p.name)
def test_patched_symbol_is_in_the_pinned_sglang(seam, patch):
    assert seam["patches"][patch.name] == {}, f"{patch.target} ({patch.kind.value}, {patch.group.name})"


@pytest.mark.parametrize("dep", hooks.DEPENDS, ids=lambda d: d.target.rsplit(".", 2)[-2] + "." + d.target.rsplit(".", 1)[-1])
def test_symbol_the_plugin_relies_on_is_in_the_pinned_sglang(seam, dep):
    assert seam["depends"][dep.target] == {}, dep.target


def test_register_installs_the_every_process_and_cpu_engine_rows_and_nothing_else(seam):
    live = seam["groups"]["after_load"]
    for patch in hooks.PATCHES:
        if patch.name in live:
            want = patch.group in (hooks.EVERY_PROCESS, hooks.CPU_ENGINE)
            assert live[patch.name] is want, patch.name


def test_every_installable_row_is_live_once_its_group_is_installed(seam):
    groups = seam["groups"]
    assert groups["standin"] is True and groups["install_twice"] is False
    # upstream's CUDA-only host-index path advertised, and turned off for a CPU PD server
    assert groups["host_indices"] == [True, False]
    checked = {p.name for p in hooks.PATCHES if p.kind in hooks.HOOK_KINDS + (hooks.Kind.RESOLUTION,)}
    assert set(groups["after_all"]) == checked
    assert all(groups["after_all"].values()), {k: v for k, v in groups["after_all"].items() if not v}


def _short(target: str) -> str:
    parts = target.split(".")
    if len(parts) >= 2 and parts[-2][:1].isupper():
        return ".".join(parts[-2:])
    return parts[-1]


@pytest.mark.parametrize("target", sorted({p.target for p in hooks.PATCHES} | {d.target for d in hooks.DEPENDS}))
def test_upstream_md_documents_every_row(target):
    with open(UPSTREAM_MD, encoding="utf-8") as fh:
        text = fh.read()
    assert _short(target) in text, f"UPSTREAM.md does not name {_short(target)} ({target})"


@pytest.mark.parametrize("page", [UPSTREAM_MD, os.path.join(ROOT, "docs", "architecture.md")])
def test_the_pages_show_the_manifests_install_groups(page):
    """The install table is written by the manifest, so a group added, moved to another moment
    or given another predicate changes the pages (regenerate with `manifest.groups_table`)."""
    with open(page, encoding="utf-8") as fh:
        assert manifest.groups_table(hooks.PATCHES) in fh.read(), f"{page}: paste manifest.groups_table(PATCHES)"


def test_every_row_names_an_implementation_that_exists():
    """Rows and group predicates name `module:attr` under the plugin package; a moved module
    must not leave a row pointing at nothing."""
    specs = [p.impl for p in hooks.PATCHES] + [s for g in hooks.GROUPS for s in (g.predicate, g.prepare) if s]
    broken = []
    for spec in specs:
        try:
            manifest.resolve(spec)
        except (ImportError, AttributeError) as exc:
            broken.append(f"{spec}: {exc}")
    assert not broken, broken


def test_rows_are_unique_and_grouped():
    names = [p.name for p in hooks.PATCHES]
    assert len(names) == len(set(names))
    assert {p.group for p in hooks.PATCHES} <= set(hooks.GROUPS)
    for group in hooks.GROUPS:
        installable = [p for p in hooks.rows(group) if p.kind in hooks.INSTALLED_BY_GROUP]
        done_elsewhere = [p for p in hooks.rows(group) if p.kind not in hooks.INSTALLED_BY_GROUP]
        assert not (installable and done_elsewhere), f"group {group.name} mixes install() rows and code-applied rows"
    with pytest.raises(ValueError, match="no row that install"):
        hooks.install(hooks.STEP)


def test_settings_round_trip_through_the_environment(monkeypatch):
    monkeypatch.delenv(settings.SETTINGS_ENV, raising=False)
    assert settings.current() == settings.SchedulerSettings()
    sent = settings.SchedulerSettings(draft_block=16, adaptive=AdaptiveWidthConfig(widths=[16, 8, 1]))
    settings.publish(sent)
    assert settings.current() == sent
    settings.publish(settings.SchedulerSettings())
    assert settings.SETTINGS_ENV not in os.environ


def test_settings_refuse_what_resolution_never_writes(monkeypatch):
    monkeypatch.setenv(settings.SETTINGS_ENV, '{"draft_block": 0}')
    with pytest.raises(ValidationError, match="draft_block"):
        settings.current()
    monkeypatch.setenv(settings.SETTINGS_ENV, '{"draft_blok": 16}')
    with pytest.raises(ValidationError, match="draft_blok"):
        settings.current()


def test_the_manifest_drives_every_install_moment():
    """Every group of installable rows carries its predicate (and any preparation) in the
    manifest, resolvable here, and `hooks.install_moment` installs it: at `register()`, at
    scheduler start and before and after 0.5.23's worker constructor. Groups of rows their
    own code does (instance patches, per-step state, process settings) carry none."""
    for group in hooks.GROUPS:
        installable = any(p.kind in hooks.INSTALLED_BY_GROUP for p in hooks.rows(group))
        if installable and group.moment is not hooks.Moment.PLATFORM_IMPORT and group.moment is not hooks.Moment.RESOLUTION:
            assert group.predicate, group.name
            for spec in filter(None, (group.predicate, group.prepare)):
                assert callable(manifest.resolve(spec)), spec
        else:
            assert not group.predicate and not group.prepare, group.name


def test_the_worker_installs_its_groups_by_moment(monkeypatch):
    """The worker's two install calls pick its groups by the manifest's predicates of the
    worker being built: a CPU Domino b8 adaptive worker gets every group, a CUDA DFlash one
    at its window only the unconditional ones."""
    from types import SimpleNamespace

    from sglang_domino.sglang.adaptive import AdaptiveWidth, AdaptiveWidthConfig, FixedWidth

    done = []
    monkeypatch.setattr(hooks, "install", lambda group: done.append(group.name) or True)
    full = SimpleNamespace(_on_cpu=True, _is_domino=True, draft_block=16, block_size=8,
                           width_policy=AdaptiveWidth(AdaptiveWidthConfig().for_window(8)))
    assert hooks.install_moment(hooks.Moment.WORKER_BEFORE, full) == ["checkpoint compat", "cpu dflash"]
    assert sorted(hooks.install_moment(hooks.Moment.WORKER_AFTER, full)) == sorted(
        ["domino rollout", "b8 reservation", "penalties", "adaptive metrics"])
    plain = SimpleNamespace(_on_cpu=False, _is_domino=False, draft_block=16, block_size=16,
                            width_policy=FixedWidth(16))
    assert hooks.install_moment(hooks.Moment.WORKER_BEFORE, plain) == ["checkpoint compat"]
    assert hooks.install_moment(hooks.Moment.WORKER_AFTER, plain) == ["penalties"]


