"""The README and docs/: the promised opening, commands the CLI accepts, links (and their headings) that exist."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml
from test_deploy_render import DEPLOY, ROOT, containers, kustomize_command, workloads

README = ROOT / "README.md"
OPERATIONS = ROOT / "docs" / "operations.md"


def code_blocks(text: str, lang: str = "sh") -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, re.S)


def test_readme_opens_with_the_two_commands() -> None:
    text = README.read_text()
    lines = text.splitlines()
    assert lines[0].startswith("# ") and lines[1] == "" and lines[2], "title, then a one-line description"
    first_block = text.index("```")
    assert "\n## " not in text[:first_block], "the commands come before any section"
    commands = [line.split("#")[0].strip() for line in code_blocks(text)[0].splitlines()]
    assert commands == ["make demo", "make test"]
    makefile = (ROOT / "Makefile").read_text()
    for target in ("demo", "test"):
        assert re.search(rf"^{target}:", makefile, re.M), f"Makefile has no {target} target"


def memslice_commands(path: Path) -> list[list[str]]:
    out = []
    for block in code_blocks(path.read_text()):
        for line in block.splitlines():
            line = line.split(" #")[0].strip().rstrip("&").strip()
            if line.startswith("memslice "):
                out.append(shlex.split(line)[1:])
    return out


@pytest.mark.parametrize("path", [README, OPERATIONS], ids=lambda p: p.name)
def test_documented_memslice_commands_parse(path: Path) -> None:
    """Every `memslice ...` line in a shell block is accepted by the real CLI parser."""
    from memslice.cli import build_parser

    for argv in memslice_commands(path):
        try:
            build_parser().parse_args(argv)
        except SystemExit as exc:
            raise AssertionError(f"{path.name}: `memslice {shlex.join(argv)}` is rejected") from exc


def test_readme_documents_commands_and_variables() -> None:
    assert {tuple(a[:1]) for a in memslice_commands(README)} >= {("run",), ("top",), ("paths",)}
    text = README.read_text()
    for var in ("MEMSLICE_OVERSUBSCRIBE", "MEMSLICE_HOST_SPILL_LIMIT", "memslice.io/gpu-mem",
                "memslice-scheduler", "RTLD_DEEPBIND", "ld.so.preload", "baseline"):
        assert var in text, var


DOCS = [README, *sorted((ROOT / "docs").glob("*.md")), ROOT / "benchmarks" / "README.md"]


def anchors(path: Path) -> set[str]:
    """The #fragments GitHub gives the headings of a markdown file (lowercased, punctuation dropped, spaces
    to hyphens, repeats numbered)."""
    out: set[str] = set()
    seen: dict[str, int] = {}
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    for heading in re.findall(r"^#+ (.+)$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(path: Path) -> None:
    """Every relative link of the docs names a file that exists and, with a #fragment, a heading in it."""
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue
        file, _, fragment = target.partition("#")
        dest = path.parent / file if file else path
        assert dest.exists(), f"{path.name} links to {target}, which does not exist"
        if fragment and dest.suffix == ".md":
            assert fragment in anchors(dest), f"{path.name} links to {target}: no such heading in {dest.name}"


def test_operations_covers_the_symptoms() -> None:
    headings = re.findall(r"^#+ (.+)$", OPERATIONS.read_text(), re.M)
    for needed in ("Upgrades", "Draining a node", "Pod stays Pending", "UnexpectedAdmissionError",
                   "Out of memory inside the quota", "kubelet restart"):
        assert needed in headings, needed


def test_readme_install_overlay_renders_with_the_given_images(tmp_path: Path) -> None:
    """The kustomization the README tells operators to write works, and replaces both images."""
    (block,) = [b for b in code_blocks(README.read_text(), "yaml")
                if "kustomization.yaml" in b.splitlines()[0]]
    (tmp_path / "deploy").symlink_to(DEPLOY)  # "next to this repository's deploy/"
    overlay = tmp_path / "my-memslice"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(block)
    out = subprocess.run([*kustomize_command(), str(overlay)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    objs = [d for d in yaml.safe_load_all(out.stdout) if d]
    images = {c["image"] for _, spec in workloads(objs) for c in containers(spec)}
    assert images == {"registry.example.org/memslice:0.1.0", "registry.k8s.io/kube-scheduler:v1.33.4"}


def test_every_benchmark_is_listed_with_options_it_has() -> None:
    """benchmarks/README.md lists every benchmark script, and each command it shows names a script that exists
    with options that script defines (the figures stay reproducible)."""
    bench = ROOT / "benchmarks"
    text = (bench / "README.md").read_text()
    for script in bench.glob("bench_*.py"):
        assert f"`{script.name}" in text or f"benchmarks/{script.name}" in text, f"{script.name} is not listed"
    commands = re.findall(r"(?:`|^ {4})[^`\n]*?\b(bench_\w+\.py)([^`\n]*)", text, re.M)
    assert len(commands) > 20
    for name, args in commands:
        source = (bench / name).read_text() if (bench / name).exists() else ""
        assert source, f"benchmarks/README.md runs {name}, which does not exist"
        for option in re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", args):
            assert f'"{option}"' in source, f"benchmarks/README.md gives {name} {option}, which it does not define"
